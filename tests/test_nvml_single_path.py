"""Every NVML call takes one timed path (gpuagent.nvml.worker): the session's open and
shutdown, the remediation setters and the XID event wait included. A call that blocks
times out within `call_timeout_seconds` and is reported while the event loop keeps
running; nvmlShutdown never runs under a call in flight; and no module outside
gpuagent.nvml (and the simulator) reaches pynvml, so the path stays the only one."""

from __future__ import annotations

import ast
import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pynvml
import pytest

from conftest import PATIENCE, REPO, FakeClock, deadline_in
from gpuagent.config import NvmlSourceSection
from gpuagent.nvml.worker import CallWorker, calls_in_flight, draining
from gpuagent.remediation.gpu_ops import GpuOperationError, GpuOps
from gpuagent.sim import SimulatedNode, parse_scenario
from gpuagent.sources.nvml import NvmlSource
from gpuagent.sources.nvml_events import NvmlEventWatcher

SCENARIO = '[node]\ngpus = 2\nmodel = "NVIDIA H100 80GB HBM3"\n'
# Short enough to keep the wedge tests quick, long enough that a healthy call on a busy
# machine (a CPU hog beside the suite) does not time out: scaled like every other wait.
TIMEOUT = 0.3 * PATIENCE
# A timed-out call returns within its timeout plus this; a call left untimed would block
# for the 30 s or 600 s the tests wedge it for.
SLACK = 0.25 * PATIENCE


@pytest.fixture
def node() -> Iterator[SimulatedNode]:
    # The source initialises NVML itself, so not the shared `node` fixture.
    with SimulatedNode(parse_scenario(SCENARIO)) as simulated:
        yield simulated


def _source(node: SimulatedNode, call_timeout: float = TIMEOUT) -> NvmlSource:
    return NvmlSource(
        NvmlSourceSection(call_timeout_seconds=call_timeout),
        process_name=node.process_name,
        clock=FakeClock(),
    )


async def _until(condition: Callable[[], object], within: float = 5.0) -> None:
    """Wait for ``condition`` to come true (fail after ``within`` seconds)."""
    deadline = deadline_in(within)
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


class Ticker:
    """A coroutine ticking every 10 ms beside the code under test: the longest gap
    between ticks says how long the event loop was held up."""

    def __init__(self) -> None:
        self.ticks = 0
        self.longest_gap = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.ticks += 1
            self.longest_gap = max(self.longest_gap, now - last)
            last = now

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._task is not None
        self._task.cancel()

    def assert_responsive(self, seconds: float) -> None:
        # Held up by a blocked call would be at least its timeout; a busy machine costs a
        # few ticks.
        assert self.longest_gap < 0.75 * TIMEOUT
        assert self.ticks >= seconds / 0.05


# --- the paths that were untimed ----------------------------------------------------------


async def test_a_call_that_blocks_in_open_session_times_out_and_is_reported(
    node: SimulatedNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    driver_version = pynvml.nvmlSystemGetDriverVersion

    def blocked() -> Any:
        release.wait(30)
        return driver_version()

    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", blocked)
    source = _source(node)
    try:
        async with Ticker() as ticker:
            started = time.monotonic()
            async with asyncio.timeout(TIMEOUT + 2 * SLACK):  # an untimed call holds it for good
                observation = await source.poll()
            elapsed = time.monotonic() - started
        assert TIMEOUT <= elapsed < TIMEOUT + SLACK
        ticker.assert_responsive(elapsed)
        assert not observation.status.ok
        assert observation.status.problem == "timeout"
        assert "nvmlSystemGetDriverVersion blocked for" in (observation.status.message or "")
    finally:
        release.set()
        await source.close()


async def test_a_wedged_remediation_setter_times_out_on_the_gpus_own_worker(
    node: SimulatedNode,
) -> None:
    source = _source(node)
    first = await source.poll()
    bus_id = first.gpus[0].identity.pci_bus_id
    ops = GpuOps(reset_command="true", timeout=60, nvml=lambda: source)
    node.inject("persistence_off", 0, {})
    node.inject("nvml_hang", 0, {"seconds": 600})
    try:
        async with Ticker() as ticker:
            started = time.monotonic()
            with pytest.raises(GpuOperationError, match="nvmlDeviceSetPersistenceMode blocked"):
                async with asyncio.timeout(TIMEOUT + 2 * SLACK):
                    await ops.enable_persistence(bus_id)
            elapsed = time.monotonic() - started
        # Within the NVML call timeout, not the reset command's 60 s.
        assert TIMEOUT <= elapsed < TIMEOUT + SLACK
        ticker.assert_responsive(elapsed)
        # The setter ran on GPU 0's worker: the poll reports GPU 0 wedged in it, and
        # GPU 1 carries on.
        wedged = await source.poll()
        assert wedged.gpus[0].status == "timeout"
        assert "nvmlDeviceSetPersistenceMode" in (wedged.gpus[0].error or "")
        assert wedged.gpus[1].status == "ok"
        # Nothing queues behind the wedged call: a second setter is refused at once.
        with pytest.raises(GpuOperationError, match="nvmlDeviceSetPersistenceMode"):
            async with asyncio.timeout(TIMEOUT / 2):
                await ops.set_power_limit(bus_id, 500)
    finally:
        node.reset_gpu(0)  # ends the hang: the blocked setter returns
    await _until(lambda: not _worker(source, 0).busy)
    assert await ops.set_power_limit(bus_id, 500) == "power limit set to 500 W"
    recovered = await source.poll()
    readings = recovered.gpus[0].readings
    assert readings is not None
    assert readings.power_limit_w == 500
    await source.close()


async def test_setters_without_an_nvml_session_fail_cleanly(node: SimulatedNode) -> None:
    source = _source(node)
    ops = GpuOps(reset_command="true", timeout=5, nvml=lambda: source)
    with pytest.raises(GpuOperationError, match="NVML is not available"):
        await ops.enable_persistence("0000:18:00.0")
    await source.poll()
    with pytest.raises(GpuOperationError, match="not an identified GPU"):
        await ops.enable_persistence("0000:ff:00.0")
    await source.close()
    with pytest.raises(GpuOperationError, match="NVML is not available"):
        await GpuOps(reset_command="true", timeout=5, nvml=lambda: None).enable_persistence("x")


# --- shutdown -----------------------------------------------------------------------------


async def test_shutdown_is_skipped_while_a_call_is_wedged(
    node: SimulatedNode, caplog: pytest.LogCaptureFixture
) -> None:
    source = _source(node)
    await source.poll()
    node.inject("nvml_hang", 1, {"seconds": 600})
    assert (await source.poll()).gpus[1].status == "timeout"
    node.reset_call_counts()
    caplog.set_level(logging.WARNING)
    try:
        async with asyncio.timeout(TIMEOUT + SLACK):
            await source.close()
        assert "nvmlShutdown" not in node.call_counts()
        assert "not calling nvmlShutdown" in caplog.text
        assert "on nvml-gpu1" in caplog.text
    finally:
        node.reset_gpu(1)


async def test_shutdown_waits_for_the_call_in_flight_and_holds_new_calls_back(
    node: SimulatedNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _source(node, call_timeout=5.0)
    await source.poll()
    order: list[str] = []
    release = threading.Event()
    temperature = pynvml.nvmlDeviceGetTemperature
    shutdown = pynvml.nvmlShutdown

    def slow_temperature(handle: Any, sensor: int) -> Any:
        release.wait(10)
        order.append("temperature")
        return temperature(handle, sensor)

    def recorded_shutdown() -> None:
        order.append("shutdown")
        shutdown()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", slow_temperature)
    monkeypatch.setattr(pynvml, "nvmlShutdown", recorded_shutdown)
    polling = asyncio.create_task(source.poll())
    await _until(lambda: any(c == "nvmlDeviceGetTemperature" for _, c, _ in calls_in_flight()))
    closing = asyncio.create_task(source.close())
    await _until(draining)
    release.set()
    async with asyncio.timeout(5):
        await closing
        observation = await polling
    assert order[-1] == "shutdown"
    assert order.count("shutdown") == 1
    assert "temperature" in order
    assert node.call_counts()["nvmlShutdown"] == 1
    # Calls the drain held back fail that poll of the GPU; they did not run.
    assert all(gpu.status == "error" for gpu in observation.gpus)
    assert all("shutting down" in (gpu.error or "") for gpu in observation.gpus)
    assert not draining()


# --- the worker ---------------------------------------------------------------------------


async def test_an_nvml_call_off_its_worker_thread_is_refused() -> None:
    worker = CallWorker("t")
    with pytest.raises(RuntimeError, match="on their worker"):
        worker.call("nvmlDeviceGetCount", lambda: 1)
    assert await worker.run(lambda: worker.call("f", lambda: 1), 1.0) == 1
    worker.close()
    assert await worker.join(5.0)


async def test_the_name_and_start_of_a_call_are_one_record() -> None:
    """A long call, then a new one at once: the new call is never seen with the old one's
    start (which would make it look wedged)."""
    worker = CallWorker("t")
    release = threading.Event()
    second_started = threading.Event()

    def job() -> None:
        worker.call("first", time.sleep, 0.3)
        worker.call("second", lambda: (second_started.set(), release.wait(5)))

    running = asyncio.create_task(worker.run(job, 0.25 + 0.3))
    await _until(second_started.is_set)
    seen = worker.in_flight()
    assert seen is not None
    assert seen[0] == "second"
    assert seen[1] < 0.25
    release.set()
    await running
    worker.close()


# --- XID events ---------------------------------------------------------------------------


async def test_xid_events_arrive_and_stop_joins_the_event_thread(node: SimulatedNode) -> None:
    source = _source(node)
    first = await source.poll()
    events: list[Any] = []
    watcher = NvmlEventWatcher(
        source.devices(), events.append, asyncio.get_running_loop(), call_timeout=TIMEOUT
    )
    watcher.start()
    await _until(lambda: watcher.registered == 2)
    node.inject("xid", 1, {"xid": 79})
    await _until(lambda: events)
    assert events[0].code == 79
    assert events[0].gpu == first.gpus[1].identity.pci_bus_id
    assert watcher.error is None
    watcher.stop()
    async with asyncio.timeout(watcher.stop_timeout + 1.0):
        assert await watcher.stopped()
    assert not any(name == "nvml-events" for name, _, _ in calls_in_flight())
    node.reset_call_counts()
    await source.close()
    assert node.call_counts()["nvmlShutdown"] == 1


async def test_a_recovery_action_change_is_handed_over_as_such(node: SimulatedNode) -> None:
    source = _source(node)
    first = await source.poll()
    events: list[Any] = []
    changed: list[str] = []
    watcher = NvmlEventWatcher(
        source.devices(),
        events.append,
        asyncio.get_running_loop(),
        call_timeout=TIMEOUT,
        on_recovery_action=changed.append,
    )
    watcher.start()
    await _until(lambda: watcher.registered == 2)
    node.inject("recovery_action", 1, {"action": "drain_and_reset"})
    node.inject("xid", 0, {"xid": 154})
    await _until(lambda: changed and events)
    assert changed == [first.gpus[1].identity.pci_bus_id]
    assert [(e.gpu, e.code) for e in events] == [(first.gpus[0].identity.pci_bus_id, 154)]
    async with asyncio.timeout(watcher.stop_timeout + 1.0):
        assert await watcher.stopped()
    await source.close()


async def test_a_wedged_event_wait_is_reported_and_stopping_it_is_bounded(
    node: SimulatedNode, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()

    def wedged_wait(_event_set: Any, _timeout_ms: int) -> Any:
        release.wait(30)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", wedged_wait)
    source = _source(node)
    await source.poll()
    watcher = NvmlEventWatcher(
        source.devices(), lambda _: None, asyncio.get_running_loop(), call_timeout=TIMEOUT
    )
    caplog.set_level(logging.WARNING)
    try:
        async with Ticker() as ticker:
            started = time.monotonic()
            watcher.start()
            await _until(lambda: watcher.error is not None)
            elapsed = time.monotonic() - started
            # Reported after the wait's own 0.5 s slice plus the call timeout.
            assert 0.5 + TIMEOUT <= elapsed < 0.5 + TIMEOUT + SLACK
            assert (watcher.error or "").startswith("nvml_timeout: nvmlEventSetWait_v2")
            watcher.stop()
            stopping = time.monotonic()
            assert not await watcher.stopped()
            assert time.monotonic() - stopping < 2 * watcher.stop_timeout + 0.5
            node.reset_call_counts()
            await source.close()  # skips nvmlShutdown under the wedged wait
            ticker.assert_responsive(time.monotonic() - started)
        assert "nvmlShutdown" not in node.call_counts()
        assert "NVML event thread did not stop" in caplog.text
        assert "nvmlEventSetWait_v2 on nvml-events blocked" in caplog.text
    finally:
        release.set()
    assert await watcher.stopped()
    assert watcher.error is None


# --- the single path stays single ---------------------------------------------------------

AGENT = REPO / "agent" / "gpuagent"
# Where NVML is called: the one timed path, and the simulated library beneath pynvml.
NVML_PACKAGES = (AGENT / "nvml", AGENT / "sim")
# Modules that read a pynvml *constant* and call nothing (checked below).
CONSTANTS_ONLY = {AGENT / "inventory" / "build.py"}
_NVML_FUNCTION = re.compile(r"^nvml[A-Z]\w*$")


def _outside_nvml() -> Iterator[Path]:
    for path in sorted(AGENT.rglob("*.py")):
        if not any(path.is_relative_to(package) for package in NVML_PACKAGES):
            yield path


def _call_problems(node: ast.Call) -> list[str]:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    on_pynvml = isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "pynvml"
    found = [f"line {node.lineno}: calls {name}"] if on_pynvml or _NVML_FUNCTION.match(name) else []
    found += [
        f"line {node.lineno}: loads {arg.value} dynamically"
        for arg in node.args
        if isinstance(arg, ast.Constant) and arg.value in ("pynvml", "libnvidia-ml.so.1")
    ]
    return found


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    imports_pynvml = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports_pynvml |= any(alias.name.split(".")[0] == "pynvml" for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] == "pynvml":
                found.append(f"line {node.lineno}: from pynvml import ...")
        elif isinstance(node, ast.Call):
            found += _call_problems(node)
    if imports_pynvml and path not in CONSTANTS_ONLY:
        found.append("imports pynvml")
    return found


def test_no_module_outside_the_nvml_package_reaches_pynvml() -> None:
    scanned = list(_outside_nvml())
    assert len(scanned) > 50  # the tree is where we think it is
    problems = {
        str(path.relative_to(REPO)): found for path in scanned if (found := _violations(path))
    }
    assert problems == {}, (
        "NVML calls go through gpuagent.nvml (CallWorker.call on the GPU's worker, timed): "
        f"{problems}"
    )
    for path in CONSTANTS_ONLY:  # still constants only, or it should leave the list
        assert "import pynvml" in path.read_text()


def test_the_scan_catches_a_direct_call(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pynvml\nfrom pynvml import nvmlInit\nnvmlInit()\n"
        "pynvml.nvmlDeviceSetPersistenceMode(h, 1)\n"
        "__import__('pynvml')\n"
    )
    found = _violations(bad)
    assert "imports pynvml" in found
    assert any("from pynvml" in f for f in found)
    assert any("calls nvmlInit" in f for f in found)
    assert any("calls nvmlDeviceSetPersistenceMode" in f for f in found)
    assert any("dynamically" in f for f in found)


def _worker(source: NvmlSource, index: int) -> CallWorker:
    session = source._session  # the GPU's worker, to see it free again
    assert session is not None
    return next(d.worker for d in session.devices if d.index == index)


async def _operational_watcher(
    node: SimulatedNode, events: list[Any]
) -> tuple[NvmlSource, NvmlEventWatcher]:
    source = _source(node)
    await source.poll()
    watcher = NvmlEventWatcher(
        source.devices(),
        events.append,
        asyncio.get_running_loop(),
        call_timeout=TIMEOUT,
        operational=True,
    )
    watcher.start()
    await _until(lambda: watcher.registered == 2)
    return source, watcher


async def test_operational_events_arrive_with_their_legacy_xid_beside_classic_ones() -> None:
    scenario = SCENARIO + 'driver_version = "615.10.01"\n'
    with SimulatedNode(parse_scenario(scenario)) as node:
        events: list[Any] = []
        source, watcher = await _operational_watcher(node, events)
        await _until(lambda: watcher.operational_registered == 2)
        node.inject("operational_event", 1, {"xid": 79})
        node.inject("xid", 0, {"xid": 13})  # a classic event, through the same v3 wait
        await _until(lambda: len(events) == 2)
        operational = next(e for e in events if e.source == "nvml_operational")
        assert (operational.code, operational.kind) == (79, "xid")
        assert operational.line.startswith("GPU operational event on ")
        assert "Xid 79, RM category 1 code 79, fatal (primary)" in operational.line
        classic = next(e for e in events if e.source == "nvml")
        assert classic.code == 13
        async with asyncio.timeout(watcher.stop_timeout + 1.0):
            assert await watcher.stopped()
        await source.close()


async def test_a_driver_without_operational_events_keeps_the_classic_ones(
    node: SimulatedNode, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuagent.sources.nvml_events")
    events: list[Any] = []
    source, watcher = await _operational_watcher(node, events)  # driver 550
    node.inject("operational_event", 1, {"xid": 79})  # nobody listens for it
    node.inject("xid", 1, {"xid": 79})
    await _until(lambda: events)
    assert [(e.source, e.code) for e in events] == [("nvml", 79)]
    assert "GPU operational events are not offered by this driver" in caplog.text
    async with asyncio.timeout(watcher.stop_timeout + 1.0):
        assert await watcher.stopped()
    await source.close()
