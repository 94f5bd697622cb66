from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuagent.sim import SimulatedNode, parse_scenario

# Fixtures for a real MQTT broker (mqtt_broker, pki).
pytest_plugins = ("mqtt_broker",)

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def repo() -> Path:
    return REPO


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`gpuagent ARGS` in a subprocess, as an operator would run it."""
    return subprocess.run(
        [sys.executable, "-m", "gpuagent", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class DaemonProcess:
    """The real daemon (`python -m gpuagent run --simulate`) in a subprocess."""

    workdir: Path
    process: subprocess.Popen[str]
    socket: Path
    port: int
    config: Path
    notify: socket.socket
    notifications: list[str] = field(default_factory=list)

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        from gpuagent.client import call  # noqa: PLC0415 - keep collection light

        return call(self.socket, method, params)

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.call("status")
        return result

    def inject(self, kind: str, gpu: int, **values: Any) -> None:
        self.call("inject", {"kind": kind, "gpu": gpu, "values": values})

    @property
    def kmsg(self) -> Path:
        return self.workdir / "kmsg"

    def write_kernel_log(self, *lines: str) -> None:
        fd = os.open(self.kmsg, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, "".join(f"{line}\n" for line in lines).encode())
        finally:
            os.close(fd)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args)

    def wait_for(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            doc = self.status()
            if predicate(doc):
                return doc
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"condition not met in {timeout} s; last status: "
                    + json.dumps(doc, indent=1)[:4000]
                )
            time.sleep(0.1)

    def read_notifications(self, seconds: float) -> list[str]:
        """Collect sd_notify messages for ``seconds`` (the watchdog keeps them coming)."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            self.notify.settimeout(remaining)
            try:
                self.notifications.append(self.notify.recv(4096).decode())
            except TimeoutError:
                break
        return self.notifications

    def kill(self) -> None:
        """SIGKILL: a crash, no clean shutdown."""
        self.process.kill()
        self.process.wait()
        self.notify.close()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.notify.close()
        return self.process.returncode


def start_daemon(
    workdir: Path,
    scenario: str,
    config_extra: str = "",
    interval: float = 0.3,
    call_timeout: float = 0.5,
    node_name: str = "test-node",
) -> DaemonProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    sock = workdir / "api.sock"
    config = workdir / "config.toml"
    # The kernel log is a FIFO the test writes to; sysfs an empty tree (no host devices).
    kmsg = workdir / "kmsg"
    if not kmsg.exists():  # a restart in the same workdir keeps its FIFO and state
        os.mkfifo(kmsg)
    (workdir / "sys" / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
    config.write_text(
        f'[agent]\nnode_name = "{node_name}"\nstate_dir = "{workdir / "state"}"\n'
        f'[api]\nsocket = "{sock}"\n[metrics]\nlisten = "127.0.0.1:{port}"\n'
        f"[sources.nvml]\ninterval_seconds = {interval}\ncall_timeout_seconds = {call_timeout}\n"
        f"slow_interval_seconds = {interval}\ninit_retry_seconds = 1\n"
        f'[sources.kmsg]\npath = "{kmsg}"\n[sources.sysfs]\nroot = "{workdir / "sys"}"\n'
        f"{config_extra}"
    )
    scenario_path = workdir / "scenario.toml"
    scenario_path.write_text(scenario)
    notify_path = workdir / "notify.sock"
    notify_path.unlink(missing_ok=True)  # left behind by an earlier run in this workdir
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    env = {
        **os.environ,
        "NOTIFY_SOCKET": str(notify_path),
        "WATCHDOG_USEC": "2000000",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("WATCHDOG_PID", None)
    # The daemon's log goes to a file: an unread pipe would fill up and block it.
    log = workdir / "daemon.log"
    with log.open("w") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuagent",
                "run",
                "--config",
                str(config),
                "--simulate",
                str(scenario_path),
                "--log-level",
                "debug",
            ],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            text=True,
        )
    daemon = DaemonProcess(workdir, process, sock, port, config, notify)
    deadline = time.monotonic() + 20
    while not any("READY=1" in n for n in daemon.notifications):
        if process.poll() is not None or time.monotonic() > deadline:
            daemon.stop()
            raise AssertionError(f"daemon did not become ready:\n{log.read_text()}")
        daemon.read_notifications(0.2)
    return daemon


@pytest.fixture
def run_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    started: list[DaemonProcess] = []

    def run(scenario: str, **kwargs: Any) -> DaemonProcess:
        daemon = start_daemon(tmp_path / f"d{len(started)}", scenario, **kwargs)
        started.append(daemon)
        return daemon

    yield run
    for daemon in started:
        daemon.stop()


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


MakeNode = Callable[..., SimulatedNode]


@pytest.fixture
def make_node() -> Iterator[MakeNode]:
    """Simulated nodes installed beneath pynvml (and NVML initialised); removed afterwards."""
    nodes: list[SimulatedNode] = []

    def make(text: str = "", *, clock: Callable[[], float] | None = None) -> SimulatedNode:
        node = SimulatedNode(parse_scenario(text), **({"clock": clock} if clock else {}))
        node.install()
        nodes.append(node)
        pynvml.nvmlInit()
        return node

    yield make
    for node in reversed(nodes):
        node.uninstall()


@pytest.fixture
def node(make_node: MakeNode) -> SimulatedNode:
    return make_node()
