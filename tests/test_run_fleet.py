"""scripts/run-fleet: a broker, a CA, an aggregator, simulated agents, and Prometheus and
Alertmanager with the shipped alert rules, on this machine. Four nodes show in the
console; a fault injected into one shows on its GPU page (in headless Chromium) with its
onset, its timeline and the alert Prometheus raised for it; Ctrl-C leaves no process
behind; and the same with a PostgreSQL store. Started in the background from a shell
(SIGINT ignored), SIGTERM stops it and all it started; --stop-node kills a node's agent
and the aggregator shows it offline by its last will."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import psutil

import postgres_server
from conftest import PATIENCE, REPO, deadline_in, free_port, require, require_that
from fleet_support import chromium
from mqtt_broker import mosquitto_path
from page_support import browser

CRITICAL_FILL = "#c62828"


class RunningFleet:
    def __init__(self, process: subprocess.Popen[str], port: int, root: Path) -> None:
        self.process = process
        self.base = f"http://127.0.0.1:{port}/"
        self.root = root

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.base + path, timeout=10) as answer:
            return json.loads(answer.read())

    def until(self, check: Callable[[], Any], seconds: float, what: str) -> Any:
        deadline = deadline_in(seconds)
        while True:
            try:
                value = check()
            except OSError:
                value = None
            if value:
                return value
            assert self.process.poll() is None, f"run-fleet exited: {self.process.stderr}"
            assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
            time.sleep(0.5)

    def online(self) -> list[str]:
        return sorted(n["name"] for n in self.get("api/v1/nodes")["nodes"] if n["online"])


@contextmanager
def run_fleet(tmp_path: Path, *args: str, nodes: int | None = None) -> Iterator[RunningFleet]:
    """run-fleet with ``args``, its first lines read; stopped with Ctrl-C at the end, which
    must leave none of its processes. ``nodes``: how many it runs (default: ``args[0]``)."""
    count = int(args[0]) if nodes is None else nodes
    mosquitto_path()
    port = free_port()
    root = tmp_path / "fleet"
    process = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "run_fleet.py"), *args, "--port", str(port),
         "--dir", str(root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith(f"run-fleet: {count} simulated nodes"), first
        assert f"http://127.0.0.1:{port}/" in process.stdout.readline()
        fleet = RunningFleet(process, port, root)
        yield fleet
        children = psutil.Process(process.pid).children(recursive=True)
        # The broker, the aggregator, the agents, and Prometheus and Alertmanager.
        alerting = 0 if "--no-alerts" in args else 2
        assert len(children) == count + 2 + alerting
        process.send_signal(signal.SIGINT)
        _out, errors = process.communicate(timeout=30)
        assert process.returncode == 0, errors
        _gone, alive = psutil.wait_procs(children, timeout=10)
        assert alive == []
    finally:
        if process.poll() is None:
            # A failed start or assertion: no broker, agent or Prometheus left behind.
            leftover = psutil.Process(process.pid).children(recursive=True)
            process.kill()
            for child in leftover:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
        process.communicate()


def _finding_of(fleet: RunningFleet, node: str, index: int) -> dict[str, Any] | None:
    doc = fleet.get(f"api/v1/fleet/{node}?cluster=dev")
    gpu = next(g for g in doc["status"]["gpus"] if g["index"] == index)
    found = [f for f in gpu["findings"] if f["check"] == "ecc"]
    return found[0] if found else None


async def test_four_nodes_show_and_an_injected_fault_shows_on_its_gpu_page(
    tmp_path: Path,
) -> None:
    nodes = [f"sim-node-{i:02d}" for i in range(1, 5)]
    require("prometheus", "run-fleet's alerts (Debian package prometheus)")
    require("prometheus-alertmanager", "run-fleet's alerts (prometheus-alertmanager)")
    with run_fleet(tmp_path, "4") as fleet:
        started = time.monotonic()
        fleet.until(lambda: fleet.online() == nodes, 60, "four nodes online")
        print(f"four nodes online {time.monotonic() - started:.1f} s after run-fleet printed")

        # Node 2 stays healthy on its own: a double-bit error, injected as a person would.
        config = fleet.root / "sim-node-02" / "config.toml"
        injected = time.time()
        subprocess.run(
            [sys.executable, "-m", "gpuagent", "inject", "--config", str(config),
             "ecc_dbe", "--gpu", "3", "count=1"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        finding = fleet.until(lambda: _finding_of(fleet, "sim-node-02", 3), 30, "the DBE")
        assert finding["severity"] == "CRITICAL", finding
        # Its onset: when the aggregator first saw it, seconds after the injection.
        assert injected - 1 <= finding["since"] <= injected + 30, (injected, finding)

        def transition() -> list[dict[str, Any]]:
            history = fleet.get("api/v1/history/sim-node-02?cluster=dev")
            return [
                t for t in history["transitions"] if t["gpu"] == 3 and t["health"] == "CRITICAL"
            ]

        assert fleet.until(transition, 30, "GPU 3's transition")[0]["time"] >= injected - 1

        # Prometheus scrapes the agent, the shipped rule fires, Alertmanager has it, and
        # the console shows it on the node.
        def alert() -> list[dict[str, Any]]:
            doc = fleet.get("api/v1/fleet/sim-node-02?cluster=dev")
            return [a for a in doc["alerts"] if a["name"] == "GpuagentEccDoubleBitErrors"]

        (dbe,) = fleet.until(alert, 60, "the DBE's alert in the console")
        assert (dbe["state"], dbe["gpu"], dbe["severity"]) == ("firing", "3", "critical")

        async with browser(chromium(), tmp_path) as tab:
            await tab.open(fleet.base + "#gpu/dev/sim-node-02/3")
            await tab.wait_for(
                "!!document.getElementById('findings') && "
                "document.getElementById('findings').innerText.includes('CRITICAL')"
            )
            started_text = await tab.evaluate(
                "document.querySelector('#findings tr:nth-child(2)').lastChild.innerText"
            )
            assert "ago" in started_text, started_text
            fill = await tab.evaluate(
                "[...document.querySelectorAll('#history tr')]"
                ".find(r => r.cells[0].innerText === 'GPU 3')"
                ".querySelector('svg rect:last-of-type').getAttribute('fill')"
            )
            assert fill == CRITICAL_FILL
            # The GPU was OK from the node's first report (seconds ago, far right of a
            # day's strip) to the DBE, not all day; its first sample is a dot.
            first_x = await tab.evaluate(
                "Number([...document.querySelectorAll('#history tr')]"
                ".find(r => r.cells[0].innerText === 'GPU 3')"
                ".querySelector('svg rect').getAttribute('x'))"
            )
            assert first_x > 200, first_x
            assert await tab.evaluate("document.querySelectorAll('#history circle').length") >= 1
            await tab.wait_for(
                "!!document.getElementById('alerts') && document.getElementById('alerts')"
                ".innerText.includes('GpuagentEccDoubleBitErrors')"
            )
            await tab.screenshot("run-fleet-gpu")


def test_run_fleet_with_a_postgresql_store(tmp_path: Path) -> None:
    require_that(
        postgres_server.available(),
        "PostgreSQL's initdb and pg_ctl (Debian package postgresql; the test command installs it)",
    )
    with postgres_server.throwaway_postgres() as server:
        url = server.create_database("fleet")
        with run_fleet(tmp_path, "1", "--postgres", url, "--no-alerts") as fleet:
            fleet.until(lambda: fleet.online() == ["sim-node-01"], 60, "the node online")
            # The aggregator's state is in PostgreSQL, not in a file of the run's. The console
            # answers from memory; the store is written behind it, so the row may follow.
            fleet.until(
                lambda: (
                    server.run("SELECT node, cluster FROM nodes;", "fleet") == ["sim-node-01|dev"]
                ),
                60,
                "the node's row in PostgreSQL",
            )
            assert not (fleet.root / "fleet.sqlite").exists()


class BackgroundFleet(RunningFleet):
    """run-fleet under a shell (``process``), ``leader`` its process, ``output`` the lines it
    printed so far (a thread reads them as they come)."""

    def __init__(self, shell: subprocess.Popen[str], port: int, root: Path) -> None:
        super().__init__(shell, port, root)
        assert shell.stdout is not None
        first = shell.stdout.readline()
        assert first.startswith("run-fleet: "), first
        (self.leader,) = psutil.Process(shell.pid).children()
        assert "run_fleet.py" in " ".join(self.leader.cmdline())
        self.output = [first]
        self.reader = threading.Thread(target=self._read, args=(shell.stdout,), daemon=True)
        self.reader.start()

    def _read(self, stream: IO[str]) -> None:
        self.output.extend(stream)

    def printed(self, text: str) -> int:
        """The index of the first line of output with ``text`` (-1: none yet)."""
        return next((i for i, line in enumerate(self.output) if text in line), -1)

    def terminate(self, children: int) -> None:
        """SIGTERM to run-fleet: it and its ``children`` (how many it must have) stop, it
        exits 0, and nothing is left in the shell's process group."""
        started = self.leader.children(recursive=True)
        assert len(started) == children, started
        self.leader.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30 * PATIENCE)
        except subprocess.TimeoutExpired:
            raise AssertionError("run-fleet still running 30 s after SIGTERM") from None
        assert self.process.stderr is not None
        assert self.process.returncode == 0, self.process.stderr.read()
        self.reader.join(timeout=10)
        _gone, alive = psutil.wait_procs(started, timeout=10)
        assert alive == []
        assert in_group(self.process.pid) == []


@contextmanager
def background_fleet(tmp_path: Path, *args: str) -> Iterator[BackgroundFleet]:
    """run-fleet started as ``run-fleet ... &`` in a non-interactive shell does it: the shell
    starts it with SIGINT ignored (checked), so only SIGTERM can stop it, and waits for it,
    exiting with its status. The shell leads a process group of its own, which nothing
    may be left in at the end."""
    mosquitto_path()
    port = free_port()
    command = [sys.executable, str(REPO / "scripts" / "run_fleet.py"), *args, "--port", str(port),
               "--dir", str(tmp_path / "fleet")]  # fmt: skip
    shell = subprocess.Popen(
        ["bash", "-c", '"$@" & wait $!', "bash", *command],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        fleet = BackgroundFleet(shell, port, tmp_path / "fleet")
        assert sigint_ignored(fleet.leader.pid), "run-fleet did not start with SIGINT ignored"
        yield fleet
    finally:
        if shell.poll() is None:
            # A failed start or assertion: nothing of the run left behind.
            for process in in_group(shell.pid):
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
        shell.wait()
        for stream in (shell.stdout, shell.stderr):
            if stream is not None:
                stream.close()


def sigint_ignored(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("SigIgn:"))
    return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))


def in_group(pgid: int) -> list[psutil.Process]:
    """The live processes in process group ``pgid`` (zombies have exited)."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


def test_sigterm_stops_a_fleet_started_in_the_background(tmp_path: Path) -> None:
    with background_fleet(tmp_path, "2", "--no-alerts") as fleet:
        nodes = ["sim-node-01", "sim-node-02"]
        fleet.until(lambda: fleet.online() == nodes, 60, "both nodes online")
        # The broker, the aggregator and the two agents.
        fleet.terminate(4)


def test_stop_node_kills_the_node_and_the_aggregator_shows_it_offline(tmp_path: Path) -> None:
    with background_fleet(tmp_path, "2", "--no-alerts", "--stop-node", "2") as fleet:

        def offline() -> dict[str, Any] | None:
            doc: dict[str, Any] = fleet.get("api/v1/fleet/sim-node-02?cluster=dev")
            return None if doc["online"] else doc

        doc = fleet.until(offline, 90, "sim-node-02 offline")
        # The broker's last will for a connection that ended without a goodbye; a clean
        # stop would say "shutdown".
        assert doc["reason"] == "connection lost", doc
        agents = [
            " ".join(p.cmdline())
            for p in fleet.leader.children()
            if "gpuagent run" in " ".join(p.cmdline())
        ]
        assert len(agents) == 1, agents
        assert "sim-node-01" in agents[0]
        fleet.until(lambda: fleet.online() == ["sim-node-01"], 60, "node 1 running on")
        # What run-fleet says: the kill, then the aggregator's offline node, with the reason.
        said = "sim-node-02 offline at the aggregator"
        fleet.until(lambda: fleet.printed(said) >= 0, 30, "run-fleet saying it is offline")
        seen = fleet.printed(said)
        assert 0 < fleet.printed("sim-node-02 stopped abruptly") < seen, fleet.output
        assert "(reason: connection lost)" in fleet.output[seen]
        # The broker, the aggregator and node 1's agent.
        fleet.terminate(3)


def test_stop_node_must_be_one_of_the_fleets_nodes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "run_fleet.py"), "2", "--stop-node", "3",
         "--dir", str(tmp_path / "fleet")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "--stop-node: a node from 1 to 2" in done.stderr
    assert not (tmp_path / "fleet").exists()
