"""deploy/alertmanager/gpuagent.yml: amtool accepts it; a real Alertmanager running it holds
back the alerts that overlap by design (the catch-all GPU alert behind the one naming the
fault, a fleet incident's consequences behind its root); and one DBE on a simulated node,
scraped by a real Prometheus with the shipped rules, is one alert that is not inhibited."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import PATIENCE, REPO, DaemonProcess, deadline_in, free_port, require, stop_process

CONFIG = REPO / "deploy" / "alertmanager" / "gpuagent.yml"
RULES = REPO / "deploy" / "prometheus" / "gpuagent-rules.yml"
WHERE = "Debian package prometheus-alertmanager; scripts/test installs it"


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, ConnectionError):
        return False


def _until(check: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = deadline_in(seconds)
    while not (value := check()):
        assert time.monotonic() < deadline, f"not within {seconds * PATIENCE:.0f} s: {what}"
        time.sleep(0.25)
    return value


class Server:
    """A Prometheus or Alertmanager process on a free port, logging to its directory."""

    def __init__(self, argv: list[str], workdir: Path, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = workdir / "log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        _until(lambda: self._up() and _ready(self.url), 30, f"{argv[0]} ready")

    def _up(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()
        return True

    def stop(self) -> None:
        stop_process(self.process)


class Alertmanager(Server):
    def post(self, alerts: list[dict[str, Any]]) -> None:
        request = urllib.request.Request(
            self.url + "/api/v2/alerts",
            data=json.dumps(alerts).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.status == 200

    def alerts(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = _get(self.url + "/api/v2/alerts")
        return found

    def active(self, **labels: str) -> list[str]:
        """The names of the alerts with ``labels`` that are active (not inhibited)."""
        return sorted(
            a["labels"]["alertname"]
            for a in self.alerts()
            if a["status"]["state"] == "active" and labels.items() <= a["labels"].items()
        )


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(kind: type[Server], argv: list[str], port: int) -> Server:
        workdir = tmp_path / f"{kind.__name__.lower()}{len(started)}"
        workdir.mkdir()
        server = kind([part.replace("{dir}", str(workdir)) for part in argv], workdir, port)
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()


def _alertmanager(servers: Callable[..., Server]) -> Alertmanager:
    binary = require(
        "prometheus-alertmanager", f"runs the shipped configuration ({WHERE})",
        alternatives=("alertmanager",),
    )  # fmt: skip
    port = free_port()
    argv = [
        binary,
        f"--config.file={CONFIG}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.path={dir}/data",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    manager = servers(Alertmanager, argv, port)
    assert isinstance(manager, Alertmanager)
    return manager


# --- the configuration --------------------------------------------------------------------


def test_amtool_accepts_the_configuration() -> None:
    amtool = require("amtool", f"checks the Alertmanager configuration ({WHERE})")
    result = subprocess.run(
        [amtool, "check-config", str(CONFIG)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_fleet_incidents_have_a_route_grouped_by_incident() -> None:
    route = yaml.safe_load(CONFIG.read_text())["route"]
    (fleet,) = [r for r in route["routes"] if 'alertname="GpuagentFleetIncident"' in r["matchers"]]
    assert fleet["group_by"] == ["incident"]
    # Everything else: one group per alert on one GPU or node check.
    assert route["group_by"] == ["alertname", "instance", "pci_bus_id", "check"]


# --- inhibition, in a real Alertmanager ---------------------------------------------------


def _gpu(instance: str, bus: str = "00000000:18:00.0", **labels: str) -> dict[str, str]:
    return {
        "gpu": "0", "UUID": "GPU-0", "pci_bus_id": bus, "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3", "Hostname": instance.partition(":")[0],
        "instance": instance, "job": "gpuagent", **labels,
    }  # fmt: skip


def _node(instance: str, check: str | None = None) -> dict[str, str]:
    return {"instance": instance, "job": "gpuagent", **({"check": check} if check else {})}


def _alert(name: str, severity: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"labels": {"alertname": name, "severity": severity, **labels}}


def _fleet(incident: str, role: str, node: str, severity: str = "warning") -> dict[str, Any]:
    labels = {"incident": incident, "nvlink_domain": "uuid-1/7", "role": role, "node": node}
    return _alert("GpuagentFleetIncident", severity, {**labels, "cluster": "dev"})


def test_a_fault_is_one_active_alert_and_the_catch_all_is_inhibited(
    servers: Callable[..., Server],
) -> None:
    manager = _alertmanager(servers)
    dbe, lost, remap, hot = "dbe:19400", "lost:19400", "remap:19400", "hot:19400"
    node, other = "node:19400", "other:19400"
    manager.post([
        # A DBE: the alert that names it and the catch-all for its GPU.
        _alert("GpuagentEccDoubleBitErrors", "critical", _gpu(dbe)),
        _alert("GpuagentGpuCritical", "critical", _gpu(dbe)),
        # The catch-all of another GPU of that node is its own fault.
        _alert("GpuagentGpuCritical", "critical", _gpu(dbe, bus="00000000:2a:00.0")),
        # A lost GPU: lost, critical, and (later) unknown.
        _alert("GpuagentGpuLost", "critical", _gpu(lost)),
        _alert("GpuagentGpuCritical", "critical", _gpu(lost)),
        _alert("GpuagentGpuUnknown", "warning", _gpu(lost)),
        # A failed row remap, pending too.
        _alert("GpuagentRowRemapFailure", "critical", _gpu(remap)),
        _alert("GpuagentRowRemapPending", "warning", _gpu(remap)),
        _alert("GpuagentGpuCritical", "critical", _gpu(remap)),
        # A thermal fault: no alert names it but the catch-all, and the temperature waits.
        _alert("GpuagentGpuCritical", "critical", _gpu(hot)),
        _alert("GpuagentGpuTemperatureHigh", "warning", _gpu(hot)),
        # A node check's fault: the alert that names it and the node catch-all; another
        # node check's fault is its own.
        _alert("GpuagentDriverModuleMismatch", "critical", _node(node, "driver")),
        _alert("GpuagentNodeCritical", "critical", _node(node, "driver")),
        _alert("GpuagentNodeCritical", "critical", _node(node, "nvml")),
        # Warnings beside nothing else.
        _alert("GpuagentGpuTemperatureHigh", "warning", _gpu(other)),
        _alert("GpuagentNodeCordoned", "warning", _node(other)),
    ])  # fmt: skip
    _until(lambda: len(manager.alerts()) == 16, 10, "every alert received")
    assert manager.active(instance=dbe) == ["GpuagentEccDoubleBitErrors", "GpuagentGpuCritical"]
    assert manager.active(instance=dbe, pci_bus_id="00000000:18:00.0") == [
        "GpuagentEccDoubleBitErrors"
    ]
    assert manager.active(instance=lost) == ["GpuagentGpuLost"]
    assert manager.active(instance=remap) == ["GpuagentRowRemapFailure"]
    assert manager.active(instance=hot) == ["GpuagentGpuCritical"]
    assert manager.active(instance=node) == ["GpuagentDriverModuleMismatch", "GpuagentNodeCritical"]
    assert manager.active(instance=node, check="nvml") == ["GpuagentNodeCritical"]
    assert manager.active(instance=other) == ["GpuagentGpuTemperatureHigh", "GpuagentNodeCordoned"]
    held = [a for a in manager.alerts() if a["status"]["state"] == "suppressed"]
    assert all(a["status"]["inhibitedBy"] for a in held), held


def test_a_fleet_incidents_consequences_are_held_behind_its_root(
    servers: Callable[..., Server],
) -> None:
    manager = _alertmanager(servers)
    manager.post([
        _fleet("inc-1", "root", "node-a", "critical"),
        _fleet("inc-1", "consequence", "node-b"),
        _fleet("inc-1", "unrelated", "node-c"),
        # A consequence of an incident whose root is not (yet) known pages.
        _fleet("inc-2", "consequence", "node-d"),
        # The consequence node's own warning is held back; its critical alert is not, and
        # neither is a warning of a node no incident names.
        _alert("GpuagentXidErrors", "warning", _gpu("b:19400", node="node-b", xid="45")),
        _alert("GpuagentEccDoubleBitErrors", "critical", _gpu("b:19400", node="node-b")),
        _alert("GpuagentXidErrors", "warning", _gpu("e:19400", node="node-e", xid="13")),
    ])  # fmt: skip
    _until(lambda: len(manager.alerts()) == 7, 10, "every alert received")
    fleet = {
        (a["labels"]["incident"], a["labels"]["role"]): a["status"]["state"]
        for a in manager.alerts()
        if a["labels"]["alertname"] == "GpuagentFleetIncident"
    }
    assert fleet == {
        ("inc-1", "root"): "active",
        ("inc-1", "consequence"): "suppressed",
        ("inc-1", "unrelated"): "active",
        ("inc-2", "consequence"): "active",
    }
    assert manager.active(node="node-b") == ["GpuagentEccDoubleBitErrors"]
    assert manager.active(node="node-e") == ["GpuagentXidErrors"]


# --- end to end: a simulated DBE, Prometheus with the shipped rules, Alertmanager ---------

# A DBE the driver also reports as Xid 48, on GPU 3 of a node that is healthy otherwise.
DBE_SCENARIO = """[node]
gpus = 4
model = "h100-sxm"

[[fault]]
at = 1.0
gpu = 3
kind = "ecc_dbe"
count = 1

[[fault]]
at = 1.0
gpu = 3
kind = "xid"
xid = 48
"""


def _quick_rules(directory: Path) -> Path:
    """The shipped rules with their one-minute holds made 5 s: what is tested here is which
    alerts fire and which are inhibited, not how long each waits (promtool tests that)."""
    quick = directory / "gpuagent-rules.yml"
    quick.write_text(RULES.read_text().replace("for: 1m\n", "for: 5s\n"))
    return quick


def _prometheus(servers: Callable[..., Server], target: str, manager: Alertmanager) -> Server:
    binary = require("prometheus", "evaluates the shipped rules (Debian package prometheus)")
    port = free_port()
    workdir_config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(_quick_rules(manager.log.parent.parent))],
        "alerting": {
            "alertmanagers": [{"static_configs": [{"targets": [manager.url.split("//")[1]]}]}]
        },
        "scrape_configs": [{"job_name": "gpuagent", "static_configs": [{"targets": [target]}]}],
    }
    config = manager.log.parent.parent / "prometheus.yml"
    config.write_text(yaml.safe_dump(workdir_config))
    argv = [
        binary,
        f"--config.file={config}",
        "--storage.tsdb.path={dir}/data",
        f"--web.listen-address=127.0.0.1:{port}",
        "--rules.alert.resend-delay=1s",
        "--log.level=warn",
    ]
    return servers(Server, argv, port)


def _firing(prometheus: Server) -> list[str]:
    alerts = _get(prometheus.url + "/api/v1/alerts")["data"]["alerts"]
    return sorted(a["labels"]["alertname"] for a in alerts if a["state"] == "firing")


@pytest.mark.integration
def test_one_dbe_is_one_alert_not_inhibited(
    run_daemon: Callable[..., DaemonProcess], servers: Callable[..., Server]
) -> None:
    manager = _alertmanager(servers)
    daemon = run_daemon(DBE_SCENARIO)
    target = f"127.0.0.1:{daemon.port}"
    prometheus = _prometheus(servers, target, manager)
    # The catch-all GpuagentGpuCritical fires after the DBE (its `for`), after the alert
    # that names the fault; wait until Alertmanager has both.
    _until(
        lambda: "GpuagentGpuCritical" in _firing(prometheus),
        120,
        f"GpuagentGpuCritical firing (firing: {_firing(prometheus)})",
    )
    _until(
        lambda: (
            {"GpuagentGpuCritical", "GpuagentEccDoubleBitErrors"}
            <= {a["labels"]["alertname"] for a in manager.alerts()}
        ),
        30,
        "Alertmanager received both",
    )
    assert _firing(prometheus) == ["GpuagentEccDoubleBitErrors", "GpuagentGpuCritical"]
    assert manager.active(instance=target) == ["GpuagentEccDoubleBitErrors"]
    (dbe,) = [a for a in manager.alerts() if a["labels"]["alertname"] != "GpuagentGpuCritical"]
    assert dbe["labels"]["gpu"] == "3"
    # The agent reports the fault as one finding: the ecc check's, with the XID as evidence.
    (gpu,) = [g for g in daemon.status()["gpus"] if g["index"] == 3]
    problems = [f for f in gpu["findings"] if f["severity"] != "OK"]
    assert [f["check"] for f in problems] == ["ecc"], problems
