"""scripts/run-fleet: a broker, a CA, an aggregator and simulated agents on this machine,
seen in the console's API, and all of it gone after Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from conftest import REPO, deadline_in, free_port
from mqtt_broker import mosquitto_path


def test_two_nodes_show_in_the_console_and_ctrl_c_stops_all(tmp_path: Path) -> None:
    mosquitto_path()
    port = free_port()
    fleet = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "run_fleet.py"), "2", "--port", str(port),
         "--dir", str(tmp_path / "fleet")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert fleet.stdout is not None
        first = fleet.stdout.readline()
        assert first.startswith("run-fleet: 2 simulated nodes"), first
        assert f"http://127.0.0.1:{port}/" in fleet.stdout.readline()
        nodes: list[dict[str, object]] = []
        deadline = deadline_in(30)
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/nodes") as answer:
                    nodes = json.loads(answer.read())["nodes"]
            except OSError:
                nodes = []
            if len([n for n in nodes if n["online"]]) == 2:
                break
            time.sleep(0.5)
        assert sorted(n["name"] for n in nodes) == ["sim-node-01", "sim-node-02"], nodes
        assert {n["cluster"] for n in nodes} == {"dev"}
        children = psutil.Process(fleet.pid).children(recursive=True)
        assert len(children) == 4  # the broker, the aggregator, two agents
        fleet.send_signal(signal.SIGINT)
        _out, errors = fleet.communicate(timeout=30)
        assert fleet.returncode == 0, errors
        _gone, alive = psutil.wait_procs(children, timeout=10)
        assert alive == []
    finally:
        if fleet.poll() is None:
            fleet.kill()
        fleet.communicate()
