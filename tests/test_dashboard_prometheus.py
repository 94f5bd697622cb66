"""Dashboards and alerts against a real Prometheus scraping the daemon.

The daemon runs on a simulated HGX H100 node with a training process on two GPUs; a real
Prometheus server scrapes it. Every query of NVIDIA's dcgm-exporter dashboard must return
data, the tensor core panel (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, from GPM) included; every
query of gpuagent's own dashboard must run, its NVLink row and agents-down panel with
data, under a job not named gpuagent; and an alert written for dcgm-exporter's
DCGM_FI_DEV_XID_ERRORS{err_code="79"} must fire on a simulated Xid 79.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, TEST_DATA, DaemonProcess, deadline_in, free_port, require, stop_process

_TRAINING = "".join(
    f'[[fault]]\ngpu = {gpu}\nkind = "process"\npid = {4100 + gpu}\nname = "train.py"\n'
    "used_mib = 40960\n"
    for gpu in (0, 5)
)
SCENARIO = f'[node]\ngpus = 8\nmodel = "h100-sxm"\n{_TRAINING}'
_DEADLINE_SECONDS = 25.0


def dashboard_queries() -> list[str]:
    text = (TEST_DATA / "reference" / "dcgm_dashboard_queries.txt").read_text()
    # Grafana's template variables, as "All" selects them.
    return [
        line.replace("$instance", ".*").replace("$gpu", ".*")
        for line in text.splitlines()
        if line.strip()
    ]


class Prometheus:
    """A Prometheus server scraping one target every second (and evaluating ``rules``, a
    rule file's text, every second), in its own directory."""

    def __init__(
        self, binary: str, workdir: Path, target: str, *, job: str = "gpuagent", rules: str = ""
    ) -> None:
        self.port = free_port()
        config = workdir / "prometheus.yml"
        rule_files = ""
        if rules:
            (workdir / "rules.yml").write_text(rules)
            rule_files = f"rule_files: ['{workdir / 'rules.yml'}']\n"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"{rule_files}"
            f"scrape_configs:\n  - job_name: {job}\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        self.log = workdir / "prometheus.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def get(self, path: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read().decode())

    def query(self, expr: str) -> list[dict[str, Any]]:
        found = self.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert found["status"] == "success", found
        result: list[dict[str, Any]] = found["data"]["result"]
        return result

    def stop(self) -> None:
        stop_process(self.process)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    binary = require("prometheus", "the dashboard test's server (Debian package prometheus)")
    started: list[Prometheus] = []

    def start(target: str, **options: str) -> Prometheus:
        workdir = tmp_path / "prometheus"
        workdir.mkdir()
        server = Prometheus(binary, workdir, target, **options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _until(check: Callable[[], bool], what: str, server: Prometheus, deadline: float) -> None:
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {_DEADLINE_SECONDS:.0f} s\n{server.log.read_text()}")
        if server.process.poll() is not None:
            pytest.fail(f"prometheus exited:\n{server.log.read_text()}")
        time.sleep(0.25)


def _ready(server: Prometheus) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/-/ready", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, ConnectionError):
        return False


def test_every_dashboard_query_returns_data(
    run_daemon: Callable[..., DaemonProcess], prometheus: Callable[..., Prometheus]
) -> None:
    daemon = run_daemon(SCENARIO)
    server = prometheus(f"127.0.0.1:{daemon.port}")
    deadline = deadline_in(_DEADLINE_SECONDS)
    _until(lambda: _ready(server), "prometheus was not ready", server, deadline)
    queries = dashboard_queries()
    assert len(queries) == 8
    answered: dict[str, list[dict[str, Any]]] = {}

    def all_answered() -> bool:
        for expr in queries:
            if expr not in answered:
                result = server.query(expr)
                if not result:
                    return False
                answered[expr] = result
        return True

    _until(all_answered, "not every dashboard query returned data", server, deadline)
    tensor = next(r for q, r in answered.items() if "PIPE_TENSOR_ACTIVE" in q)
    by_gpu = {series["metric"]["gpu"]: float(series["value"][1]) for series in tensor}
    assert set(by_gpu) == {str(gpu) for gpu in range(8)}
    # The GPUs running the training process show tensor core activity; the idle ones none.
    assert by_gpu["0"] > 0.1
    assert by_gpu["5"] > 0.1
    assert by_gpu["1"] == 0.0
    assert all(0.0 <= value <= 1.0 for value in by_gpu.values())
    # The scrape is healthy: Prometheus reports the target up.
    (up,) = server.query('up{job="gpuagent"}')
    assert up["value"][1] == "1"

    # Prometheus's metadata has dcgm-exporter's types: its counters are counters, under
    # their exact names (no `_total`), and a rate of one works.
    def metadata() -> dict[str, str]:
        found = server.get("/api/v1/metadata")["data"]
        return {name: entries[0]["type"] for name, entries in found.items()}

    counters = ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")
    _until(lambda: all(n in metadata() for n in counters), "no metadata", server, deadline)
    types = metadata()
    assert {name: types[name] for name in counters} == dict.fromkeys(counters, "counter")
    assert types["DCGM_FI_DEV_GPU_TEMP"] == "gauge"
    assert not any(
        name.endswith("_total") and name.startswith("DCGM_FI_DEV_TOTAL") for name in types
    )
    _until(
        lambda: bool(server.query("rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5s])")),
        "no rate of the energy counter",
        server,
        deadline,
    )


def _label_values(server: Prometheus, query: str, values: dict[str, str]) -> list[str]:
    """A Grafana `label_values(SELECTOR, LABEL)` variable query, as Grafana asks Prometheus
    (the series API), with ``values`` for the variables it uses."""
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query)
    assert match, query
    selector = _substituted(match[1], values)
    found = server.get("/api/v1/series?" + urllib.parse.urlencode({"match[]": selector}))
    return sorted({series[match[2]] for series in found["data"] if match[2] in series})


def _substituted(expr: str, values: dict[str, str]) -> str:
    # Longest names first: $instance is not $in... of another.
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(f"${name}", values[name])
    return expr


def _variables() -> dict[str, str]:
    from test_deploy_grafana import _load  # noqa: PLC0415

    return {v["name"]: v["query"]["query"] for v in _load()["templating"]["list"]}


def test_the_consoles_grafana_link_lands_on_the_nodes_panels(
    run_daemon: Callable[..., DaemonProcess],
    prometheus: Callable[..., Prometheus],
) -> None:
    """The fleet console's link (the documented grafana_url_template) carries the node's
    name and cluster; the dashboard's variables turn them into the scrape's instance, and
    its panels then show that node."""
    from test_deploy_grafana import EXPRS  # noqa: PLC0415

    daemon = run_daemon(SCENARIO)
    cluster = daemon.status()["node"]["cluster"]
    target = f"127.0.0.1:{daemon.port}"
    server = prometheus(target)
    deadline = deadline_in(_DEADLINE_SECONDS)
    _until(lambda: _ready(server), "prometheus was not ready", server, deadline)
    documented = re.search(r'"(https://grafana[^"]+)"', (REPO / "config.example.toml").read_text())
    assert documented is not None
    link = documented[1].format(cluster=cluster, node="test-node", gpu="All")
    chosen = {
        key.removeprefix("var-"): values
        for key, values in urllib.parse.parse_qs(urllib.parse.urlsplit(link).query).items()
    }
    assert chosen == {"cluster": [cluster], "node": ["test-node"], "gpu": ["All"]}

    variables = _variables()
    # The link leaves `job` at All: the jobs that scrape gpuagent.
    resolved = {"job": "gpuagent", "cluster": cluster, "node": "test-node"}
    _until(
        lambda: _label_values(server, variables["instance"], resolved) == [target],
        "the node's instance was not found",
        server,
        deadline,
    )
    resolved |= {"instance": target, "gpu": ".*"}
    temperature = next(expr for title, expr in EXPRS if "DCGM_FI_DEV_GPU_TEMP" in expr)
    temperature = _substituted(temperature, resolved)
    _until(lambda: bool(server.query(temperature)), "no temperatures", server, deadline)
    assert {s["metric"]["instance"] for s in server.query(temperature)} == {target}


def test_no_query_names_a_job() -> None:
    """Every `job` matcher of the dashboard, panels and variables, is the `job` variable."""
    from test_deploy_grafana import DASHBOARD  # noqa: PLC0415

    matchers = re.findall(r'\bjob\s*(=~|!=|!~|=)\s*\\"([^"\\]*)', DASHBOARD.read_text())
    assert matchers
    assert set(matchers) == {("=~", "$job")}


# Panels that show data on a healthy simulated node (the others show faults: last XID,
# failing checks, links below capability, ...): the NVLink row, and "Agents down" (0).
_WITH_DATA = ("Agents down", "NVLinks down", "NVLink state", "NVLink errors", "NVLink bandwidth")


def test_every_panel_query_of_the_dashboard_runs_under_any_job_name(
    run_daemon: Callable[..., DaemonProcess],
    prometheus: Callable[..., Prometheus],
) -> None:
    """gpuagent's dashboard scraped under a job not named gpuagent: the `job` variable finds
    it, every panel query is valid PromQL for Prometheus, the NVLink row has data, and
    "Agents down" counts the agent once it stops."""
    from test_deploy_grafana import EXPRS  # noqa: PLC0415

    daemon = run_daemon(SCENARIO)
    target = f"127.0.0.1:{daemon.port}"
    server = prometheus(target, job="gpu-nodes")
    deadline = deadline_in(_DEADLINE_SECONDS)
    _until(lambda: _ready(server), "prometheus was not ready", server, deadline)
    variables = _variables()
    resolved: dict[str, str] = {}
    _until(
        lambda: _label_values(server, variables["job"], resolved) == ["gpu-nodes"],
        "the job variable did not find the scrape job",
        server,
        deadline,
    )
    # Grafana's "All" for a variable with values; $__rate_interval at 1 s scrapes.
    resolved = {
        "job": "gpu-nodes",
        **dict.fromkeys(("cluster", "node", "instance", "gpu"), ".*"),
        "__rate_interval": "10s",
    }
    queries = {(title, _substituted(expr, resolved)) for title, expr in EXPRS}
    assert {title for title, _ in queries} >= set(_WITH_DATA)
    for _title, expr in queries:
        server.query(expr)  # fails the test on a query Prometheus rejects
    answered: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def with_data() -> bool:
        for title, expr in queries:
            if title in _WITH_DATA and (title, expr) not in answered:
                if not (result := server.query(expr)):
                    return False
                answered[title, expr] = result
        return True

    _until(with_data, "a panel of the NVLink row had no data", server, deadline)
    by_title = {title: result for (title, _), result in answered.items()}
    # 18 NVLinks up on each of the 8 H100s; every GPU's worst link up.
    assert [r["value"][1] for r in by_title["NVLinks down"]] == ["0"]
    state = {r["metric"]["gpu"]: r["value"][1] for r in by_title["NVLink state"]}
    assert state == {str(gpu): "1" for gpu in range(8)}
    bandwidth = {r["metric"]["gpu"] for r in by_title["NVLink bandwidth"]}
    assert bandwidth == {str(gpu) for gpu in range(8)}
    (agents,) = (e for t, e in queries if t == "Agents down")
    assert [r["value"][1] for r in server.query(agents)] == ["0"]
    daemon.stop()
    _until(
        lambda: [r["value"][1] for r in server.query(agents)] == ["1"],
        "the stopped agent was not counted down",
        server,
        deadline_in(_DEADLINE_SECONDS),
    )


# An alert as dcgm-exporter users write it (its maintainers' example: the XID's code to
# match, its text for the notification), unchanged.
_DCGM_EXPORTER_RULES = """\
groups:
  - name: dcgm-exporter
    rules:
      - alert: GpuFellOffTheBus
        expr: max by (Hostname, gpu, UUID, err_msg) (DCGM_FI_DEV_XID_ERRORS{err_code="79"})
        labels:
          severity: critical
        annotations:
          summary: "{{ $labels.Hostname }} GPU {{ $labels.gpu }}: {{ $labels.err_msg }}"
"""


def test_a_dcgm_exporter_alert_on_xid_79_fires_on_a_simulated_xid_79(
    run_daemon: Callable[..., DaemonProcess],
    prometheus: Callable[..., Prometheus],
) -> None:
    daemon = run_daemon(SCENARIO)
    server = prometheus(f"127.0.0.1:{daemon.port}", rules=_DCGM_EXPORTER_RULES)
    deadline = deadline_in(_DEADLINE_SECONDS)
    _until(lambda: _ready(server), "prometheus was not ready", server, deadline)

    def alerts() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = server.get("/api/v1/alerts")["data"]["alerts"]
        return found

    def evaluated_quiet() -> bool:
        # The rule has run over scrapes of all 8 GPUs, each at "No Error", and is quiet.
        healthy = server.query('DCGM_FI_DEV_XID_ERRORS{err_code="0", err_msg="No Error"}')
        (group,) = server.get("/api/v1/rules")["data"]["groups"]
        (rule,) = group["rules"]
        return len(healthy) == 8 and rule["health"] == "ok" and rule["evaluationTime"] > 0

    _until(evaluated_quiet, "the rule was not evaluated over the GPUs", server, deadline)
    assert alerts() == []
    result = daemon.cli("inject", "--socket", str(daemon.socket), "xid", "79", "--gpu", "2")
    assert result.returncode == 0, result.stderr
    _until(lambda: bool(alerts()), "the XID 79 alert did not fire", server, deadline)
    (alert,) = alerts()
    assert alert["state"] == "firing"
    assert alert["labels"]["alertname"] == "GpuFellOffTheBus"
    assert alert["labels"]["gpu"] == "2"
    assert alert["labels"]["err_msg"] == "GPU has fallen off the bus"
    assert alert["annotations"]["summary"].endswith("GPU 2: GPU has fallen off the bus")
    # The other GPUs still read 0; GPU 2's "No Error" series ended with the XID.
    last = {
        r["metric"]["gpu"]: (r["metric"]["err_code"], r["value"][1])
        for r in server.query("DCGM_FI_DEV_XID_ERRORS")
    }
    assert last == {**{str(g): ("0", "0") for g in range(8) if g != 2}, "2": ("79", "79")}
