"""NVIDIA's dcgm-exporter Grafana dashboard against a real Prometheus scraping the daemon.

The daemon runs on a simulated HGX H100 node with a training process on two GPUs; a real
Prometheus server scrapes it, and every query of the dashboard must return data, the
tensor core panel (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, from GPM) included.
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

from conftest import REPO, TEST_DATA, DaemonProcess, deadline_in, free_port, require

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
    """A Prometheus server scraping one target every second, in its own directory."""

    def __init__(self, binary: str, workdir: Path, target: str) -> None:
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: gpuagent\n"
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
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[str], Prometheus]]:
    binary = require("prometheus", "the dashboard test's server (Debian package prometheus)")
    started: list[Prometheus] = []

    def start(target: str) -> Prometheus:
        workdir = tmp_path / "prometheus"
        workdir.mkdir()
        server = Prometheus(binary, workdir, target)
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
    run_daemon: Callable[..., DaemonProcess], prometheus: Callable[[str], Prometheus]
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


def test_the_consoles_grafana_link_lands_on_the_nodes_panels(
    run_daemon: Callable[..., DaemonProcess],
    prometheus: Callable[[str], Prometheus],
) -> None:
    """The fleet console's link (the documented grafana_url_template) carries the node's
    name and cluster; the dashboard's variables turn them into the scrape's instance, and
    its panels then show that node."""
    from test_deploy_grafana import EXPRS, _load  # noqa: PLC0415

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

    def label_values(query: str, values: dict[str, str]) -> list[str]:
        match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query)
        assert match, query
        selector = match[1]
        for name, value in values.items():
            selector = selector.replace(f"${name}", value)
        found = server.get("/api/v1/series?" + urllib.parse.urlencode({"match[]": selector}))
        return sorted({series[match[2]] for series in found["data"] if match[2] in series})

    variables = {v["name"]: v["query"]["query"] for v in _load()["templating"]["list"]}
    resolved = {"cluster": cluster, "node": "test-node"}
    _until(
        lambda: label_values(variables["instance"], resolved) == [target],
        "the node's instance was not found",
        server,
        deadline,
    )
    resolved |= {"instance": target, "gpu": ".*"}
    temperature = next(expr for title, expr in EXPRS if "DCGM_FI_DEV_GPU_TEMP" in expr)
    for name, value in resolved.items():
        temperature = temperature.replace(f"${name}", value)
    _until(lambda: bool(server.query(temperature)), "no temperatures", server, deadline)
    assert {s["metric"]["instance"] for s in server.query(temperature)} == {target}
