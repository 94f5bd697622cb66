from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pynvml
import pytest

from gpuagent.sim import SimulatedNode, parse_scenario

if TYPE_CHECKING:
    from prometheus_client.core import Metric

# Fixtures for a real MQTT broker (mqtt_broker, pki).
pytest_plugins = ("mqtt_broker",)

REPO = Path(__file__).resolve().parent.parent
# Reference data the tests read: copies of ../shared/data files, so that a fresh clone
# (which may not have ../shared) runs the whole suite. Provenance: tests/data/README.md.
TEST_DATA = REPO / "tests" / "data"
# Where tools are looked for: PATH, then the sbin directories daemons live in (not on every
# user's PATH).
TOOL_PATH = os.pathsep.join(
    [os.environ.get("PATH", os.defpath), "/usr/local/sbin", "/usr/sbin", "/sbin"]
)


# --- missing tools and preconditions: a skip here, a failure in CI --------------------------


def in_ci() -> bool:
    """Whether this run is CI (``CI`` set, and not to 0/false/no): there every test must run,
    and one that cannot is a failure rather than a skip."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(why: str) -> NoReturn:
    """Skip the test for ``why``; under CI, fail it instead (a skip in CI hides a test that
    never ran)."""
    if in_ci():
        pytest.fail(f"{why} [CI is set: this test must run here, not skip]", pytrace=False)
    pytest.skip(why)


def require(tool: str, why: str, *, alternatives: tuple[str, ...] = ()) -> str:
    """The path of the executable ``tool`` (or the first of ``alternatives`` found), looked
    up in TOOL_PATH. Missing: the test is skipped, or fails under CI. ``why`` says what
    needs it and where it comes from, e.g. "the broker tests (Debian package mosquitto;
    scripts/test installs it)"."""
    for name in (tool, *alternatives):
        found = shutil.which(name, path=TOOL_PATH)
        if found is not None:
            return found
    names = " or ".join((tool, *alternatives))
    unavailable(f"{names} is not installed: {why}")


def require_that(condition: bool, why: str) -> None:
    """An environment precondition (root, an opt-in variable, a file): unless it holds, the
    test is skipped, or fails under CI. ``why`` says what is missing and how to provide it."""
    if not condition:
        unavailable(why)


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


# A busy machine is slow, not wrong: a test waiting for a condition gives it this many times
# the deadline it names. Waits end as soon as the condition holds, so a quiet run loses
# nothing, and a value that is wrong still fails (at the end of the longer deadline).
PATIENCE = float(os.environ.get("GPUAGENT_TEST_PATIENCE", "4"))


def deadline_in(seconds: float) -> float:
    """The monotonic time by which a condition expected within ``seconds`` must hold."""
    return time.monotonic() + seconds * PATIENCE


def wait_until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    """Until ``predicate`` holds; fails past ``timeout`` (times PATIENCE)."""
    deadline = deadline_in(timeout)
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.1)


def kernel_record(sequence: int, message: str) -> str:
    """A /dev/kmsg record stamped now on the kernel's clock (CLOCK_MONOTONIC), a
    microsecond per sequence number apart: a record stamped near boot would be old to the
    checks on a host up for an hour, and dropped by the look-back past a day."""
    return f"3,{sequence},{int(time.monotonic() * 1e6) + sequence},-;{message}"


_COUNTER_TYPE = re.compile(r"^# TYPE (\S+) counter$", re.MULTILINE)


def parse_metrics(text: str) -> list[Metric]:
    """A text exposition's families, as Prometheus reads them. prometheus_client's parser
    keeps only the first sample of a counter whose samples have no `_total` (dcgm-exporter's
    names, which the format allows), so those are parsed untyped, then given their type."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    bare = {name for name in _COUNTER_TYPE.findall(text) if not name.endswith("_total")}
    parsed = text_string_to_metric_families(
        _COUNTER_TYPE.sub(lambda m: f"# TYPE {m[1]} untyped" if m[1] in bare else m[0], text)
    )
    families = list(parsed)
    for family in families:
        if family.name in bare:
            family.type = "counter"
    return families


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
    # Set when stop() had to SIGKILL the daemon: it did not exit on SIGTERM in time.
    needed_sigkill: bool = False

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
        """Every line, whatever their size: the write waits while the daemon reads (a
        pipe holds 64 KiB). Opened without blocking, so a daemon that never opens its end
        fails the test (ENXIO past the deadline) instead of hanging it; one that is just
        starting its kernel-log source is waited for."""
        deadline = deadline_in(10)
        while True:
            try:
                fd = os.open(self.kmsg, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb") as fifo:
            fifo.write("".join(f"{line}\n" for line in lines).encode())

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
        deadline = deadline_in(timeout)
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

    def metric(self, name: str, **labels: str) -> float:
        """The value of the sample ``name`` with ``labels`` on /metrics (0 when absent)."""
        for family in parse_metrics(self.metrics()):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return float(sample.value)
        return 0.0

    def log(self) -> str:
        """What the daemon has logged so far (at debug level)."""
        return (self.workdir / "daemon.log").read_text(errors="replace")

    def wait_for_log(self, text: str, *, after: int = 0, timeout: float = 10.0) -> None:
        """Wait until ``text`` is in the log, past its first ``after`` characters (e.g.
        ``len(daemon.log())`` taken before the cause, to see only what follows it)."""
        self.wait_for(lambda _doc: text in self.log()[after:], timeout=timeout)

    def stop(self) -> int:
        """SIGTERM, and up to 10 s for the daemon to exit by itself; past that SIGKILL, so
        nothing leaks, noted in ``needed_sigkill``. Returns its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.needed_sigkill = True
                self.process.kill()
                self.process.wait()
        self.notify.close()
        return self.process.returncode


def stop_process(process: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM, up to ``grace`` seconds to exit, then SIGKILL: a test's server never leaks."""
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_daemon(
    workdir: Path,
    scenario: str,
    config_extra: str = "",
    interval: float = 0.3,
    call_timeout: float = 0.5,
    node_name: str = "test-node",
    *,
    simulate: bool = True,
    slow_interval: float | None = None,
    render_interval: float = 0.0,
) -> DaemonProcess:
    """The daemon on ``scenario`` (or, ``simulate=False``, on this machine's real NVML,
    absent on a machine without a GPU, and its real udev)."""
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
        # Every snapshot rendered unless asked: the tests watch values move within a poll
        # or two (the default, at most every 5 s, has a test of its own).
        f"render_interval_seconds = {render_interval}\n"
        f"[sources.nvml]\ninterval_seconds = {interval}\ncall_timeout_seconds = {call_timeout}\n"
        f"slow_interval_seconds = {slow_interval or interval}\ninit_retry_seconds = 1\n"
        f'[sources.kmsg]\npath = "{kmsg}"\n[sources.sysfs]\nroot = "{workdir / "sys"}"\n'
        # The simulator's RDMA faults show at the next sysfs read, as on a real node.
        f"interval_seconds = {interval}\n"
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
                *(["--simulate", str(scenario_path)] if simulate else []),
                "--log-level",
                "debug",
            ],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            text=True,
        )
    daemon = DaemonProcess(workdir, process, sock, port, config, notify)
    deadline = deadline_in(20)
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
    # Every daemon still running is stopped as systemd stops it, and must exit on SIGTERM by
    # itself with status 0: one that needs the SIGKILL, or exits otherwise, fails the test.
    # (Those the test killed or stopped itself are its own business, unless they needed the
    # SIGKILL.) All are stopped before anything is reported, so nothing leaks.
    problems: list[str] = []
    for daemon in started:
        running = daemon.process.poll() is None
        code = daemon.stop()
        if daemon.needed_sigkill:
            problem = "still running 10 s after SIGTERM: killed"
        elif running and code != 0:
            problem = f"exited with status {code} on SIGTERM"
        else:
            continue
        tail = "\n".join(daemon.log().splitlines()[-30:])
        problems.append(f"{daemon.workdir.name}: {problem}\n--- the end of its log ---\n{tail}")
    if problems:
        pytest.fail("daemon teardown:\n" + "\n".join(problems), pytrace=False)


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


# The files that take minutes (the package build and piuparts, the container image) go to
# the workers first, so the rest of the suite runs beside them instead of after them.
_LONGEST_FIRST = ("test_deb.py", "test_container_image.py", "test_fleet_reporter.py")


@pytest.fixture(scope="module")
def pg_server() -> Iterator[Any]:
    """A throwaway PostgreSQL for the module's tests (postgres_server)."""
    import postgres_server  # noqa: PLC0415 - only where a test asks for it

    require_that(postgres_server.available(), "PostgreSQL (the test command installs it)")
    with postgres_server.throwaway_postgres() as server:
        yield server


_databases = iter(range(1, 1_000_000))


@pytest.fixture(params=["sqlite", "postgresql"])
def fleet_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The aggregator's database, once a SQLite file and once a PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "drill" / "fleet.sqlite")
    server = request.getfixturevalue("pg_server")
    return str(server.create_database(f"fleet_{os.getpid()}_{next(_databases)}"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return _LONGEST_FIRST.index(name) if name in _LONGEST_FIRST else len(_LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within each file, and of the rest, is kept
