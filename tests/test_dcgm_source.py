"""The DCGM source against the stand-in bindings (tests/dcgm_standin): loading, health
incidents, host-engine restarts, driver detach, and the ``dcgm`` check's de-dup rule."""

from __future__ import annotations

import asyncio
import gc
import importlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpuagent.checks.dcgm import check_dcgm, corroborate
from gpuagent.config import DcgmSourceSection, EventsSection
from gpuagent.dcgm import bindings as dcgm_bindings
from gpuagent.dcgm.bindings import DcgmAbsentError, load, parse_version
from gpuagent.dcgm.control import DiagUnavailableError
from gpuagent.dcgm.health import SYSTEMS
from gpuagent.dcgm.policy import to_event
from gpuagent.dcgm.session import HostEngine, parse_hostengine
from gpuagent.dcgm.source import DcgmSource
from gpuagent.events import EventLog
from gpuagent.model import DcgmIncident, DcgmStatus, Finding, GpuEvent, Severity

STANDIN = Path(__file__).resolve().parent / "dcgm_standin"


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """The stand-in's fake host engine, with a fresh state file, for this process."""
    sys.path.insert(0, str(STANDIN))
    try:
        module: ModuleType = importlib.import_module("_standin_engine")
    finally:
        sys.path.remove(str(STANDIN))
    control = module.Control(tmp_path / "dcgm.json")
    monkeypatch.setenv(module.STATE_ENV, control.path)
    module.reset_process()
    yield control
    module.reset_process()


def _config(path: Path = STANDIN, **overrides: Any) -> DcgmSourceSection:
    values: dict[str, Any] = {
        "bindings_path": str(path),
        "health_interval_seconds": 0.05,
        "reconnect_max_seconds": 0.2,
        "call_timeout_seconds": 5.0,
    }
    values.update(overrides)
    return DcgmSourceSection(**values)


async def _until(condition: Any, seconds: float = 10.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.02)


# --- loading -----------------------------------------------------------------------------


def test_loads_the_bindings_and_records_the_version(engine: Any) -> None:
    loaded = load(str(STANDIN))
    assert loaded.version is not None
    assert loaded.version[0].isdigit()
    assert loaded.has("dcgmDetachDriver")
    assert str(STANDIN) not in sys.path  # off the path again


def test_missing_library_is_absent(engine: Any) -> None:
    engine.set_library_installed(False)
    with pytest.raises(DcgmAbsentError, match="libdcgm"):
        load(str(STANDIN))


def test_no_bindings_directory_is_absent(tmp_path: Path) -> None:
    with pytest.raises(DcgmAbsentError, match="no DCGM Python bindings"):
        load(str(tmp_path))


def test_default_paths_are_dcgm4_then_dcgm3() -> None:
    assert dcgm_bindings.candidate_paths("") == (
        Path("/usr/share/datacenter-gpu-manager-4/bindings/python3"),
        Path("/usr/local/dcgm/bindings/python3"),
    )


def test_logger_import_defect_gets_a_shim_for_that_import_only(engine: Any, tmp_path: Path) -> None:
    sys.path.insert(0, str(STANDIN))
    try:
        module = importlib.import_module("_standin_engine")
    finally:
        sys.path.remove(str(STANDIN))
    copy = module.make_logger_defect_copy(tmp_path / "bindings")
    assert "import logger\n" in (copy / "DcgmGroup.py").read_text()
    loaded = dcgm_bindings.import_bindings(copy)
    pydcgm = sys.modules["pydcgm"]
    assert Path(pydcgm.__file__).parent == copy  # the defective module did import
    assert "logger" not in sys.modules  # and the shim is gone
    assert loaded.agent is sys.modules["dcgm_agent"]


def test_parse_version() -> None:
    assert parse_version("version:4.5.0;arch:x86_64;buildtype:Release") == "4.5.0"
    assert parse_version("arch:x86_64") is None


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", HostEngine("127.0.0.1:5555")),
        ("localhost", HostEngine("127.0.0.1:5555")),
        ("unix:/run/dcgm.sock", HostEngine("/run/dcgm.sock", unix_socket=True)),
        ("10.0.0.5:5566", HostEngine("10.0.0.5:5566")),
        ("dcgm-host", HostEngine("dcgm-host:5555")),
        ("embedded", HostEngine("", embedded=True)),
    ],
)
def test_hostengine_spec(spec: str, expected: HostEngine) -> None:
    assert parse_hostengine(spec) == expected


# --- health --------------------------------------------------------------------------------


@pytest.mark.parametrize(("bit", "system"), sorted(SYSTEMS.items()))
def test_every_health_system_becomes_an_incident(engine: Any, bit: int, system: str) -> None:
    engine.add_health_incident(bit, 20, 4, f"{system} failed", 1)
    engine.add_health_incident(bit, 10, 3, f"{system} warned", 0)

    async def scenario() -> tuple[DcgmIncident, ...]:
        source = DcgmSource(_config())
        task = asyncio.create_task(source.run())
        try:
            await _until(lambda: source.status().state == "up")
            return source.status().incidents
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            source.close()

    incidents = asyncio.run(scenario())
    by_severity = {i.severity: i for i in incidents}
    failed, warned = by_severity[Severity.CRITICAL], by_severity[Severity.WARN]
    assert failed == DcgmIncident(
        system,
        Severity.CRITICAL,
        "DCGM_FR_VOLATILE_DBE_DETECTED",
        f"{system} failed",
        "0000:28:00.0",
    )
    assert warned.code == "DCGM_FR_PCI_REPLAY_RATE"
    assert warned.gpu == "0000:18:00.0"


def test_host_engine_restart_reconnects_and_watches_again(engine: Any) -> None:
    async def scenario() -> None:
        source = DcgmSource(_config())
        task = asyncio.create_task(source.run())
        try:
            await _until(lambda: source.status().state == "up")
            assert source.status().hostengine == "127.0.0.1:5555"
            assert source.source_status() is not None
            engine.host_engine_down()
            await _until(lambda: source.status().state == "down")
            row = source.source_status()
            assert row is not None
            assert not row.up
            engine.host_engine_up()  # a new host engine: nothing of the old connection
            engine.add_health_incident(0x10, 20, 4, "DBE after restart", 0)
            await _until(lambda: source.status().incidents != ())
            assert source.connects >= 2
            assert source.status().incidents[0].message == "DBE after restart"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            source.close()

    asyncio.run(scenario())
    assert len(engine.calls("dcgmHealthSet")) >= 2  # the watches were set again


def test_absent_source_has_no_row(engine: Any) -> None:
    engine.set_library_installed(False)

    async def scenario() -> DcgmSource:
        source = DcgmSource(_config())
        assert not await source.load()
        await source.run()  # returns at once: nothing to run
        source.close()
        return source

    source = asyncio.run(scenario())
    assert source.status().state == "absent"
    assert source.source_status() is None
    assert not source.present


def test_driver_detach_and_diag_unavailable_when_down(engine: Any) -> None:
    async def scenario() -> None:
        source = DcgmSource(_config())
        with pytest.raises(DiagUnavailableError):
            await source.detach_driver()
        task = asyncio.create_task(source.run())
        try:
            await _until(lambda: source.status().state == "up")
            assert await source.detach_driver()
            assert not engine.driver_attached()
            assert await source.attach_driver()
            assert engine.driver_attached()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            source.close()

    asyncio.run(scenario())


def test_diagnostic_through_the_bindings_while_up(engine: Any) -> None:
    engine.set_diag_test(
        "memory", results={1: "fail"}, errors=[{"gpu": 1, "code": 52, "msg": "bad"}]
    )

    async def scenario() -> None:
        source = DcgmSource(_config())
        task = asyncio.create_task(source.run())
        try:
            await _until(lambda: source.status().state == "up")
            result = await source.run_diag(2, (0, 1), 60.0)  # memory is a level 2 test
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            source.close()
        assert (result.via, result.level, result.passed) == ("bindings", 2, False)
        assert [(t.name, t.gpu) for t in result.failures()] == [("memory", 1)]

    asyncio.run(scenario())
    assert engine.calls("dcgmActionValidate_v2")


# --- the check's de-dup rule ------------------------------------------------------------


def _finding(check: str, severity: Severity) -> Finding:
    return Finding(check=check, severity=severity, reason="r", gpu="0000:18:00.0")


def test_memory_incident_corroborates_the_ecc_finding() -> None:
    dbe = DcgmIncident("memory", Severity.CRITICAL, "DCGM_FR_VOLATILE_DBE_DETECTED", "DBE", "x")
    power = DcgmIncident("power", Severity.WARN, "DCGM_FR_CLOCK_THROTTLE_POWER", "power", "x")
    findings = [_finding("ecc", Severity.CRITICAL), _finding("thermal", Severity.OK)]
    merged, left = corroborate(findings, [dbe, power])
    assert left == (power,)
    assert ("dcgm_memory", "DCGM_FR_VOLATILE_DBE_DETECTED: DBE") in merged[0].evidence
    assert merged[1] == findings[1]
    outcome = check_dcgm(left, 1)
    assert [p.severity for p in outcome.problems] == [Severity.WARN]


def test_incident_without_an_own_finding_is_a_problem() -> None:
    dbe = DcgmIncident("memory", Severity.CRITICAL, "DCGM_FR_VOLATILE_DBE_DETECTED", "DBE", "x")
    _, left = corroborate([_finding("ecc", Severity.OK)], [dbe])
    assert left == (dbe,)
    assert check_dcgm(left).problems[0].severity is Severity.CRITICAL


# --- policy ------------------------------------------------------------------------------

_POLICY_VALUES: dict[int, dict[str, int]] = {
    0x1: {"location": 2, "numerrors": 1},
    0x2: {"counter": 12},
    0x4: {"sbepages": 3, "dbepages": 61},
    0x8: {"thermalViolation": 97},
    0x10: {"powerViolation": 1100},
    0x20: {"fieldId": 409, "counter": 5},
    0x40: {"errnum": 79},
}


@pytest.mark.parametrize("condition", sorted(_POLICY_VALUES))
def test_every_policy_condition_becomes_an_event(engine: Any, condition: int) -> None:
    events: list[GpuEvent] = []

    async def scenario() -> None:
        source = DcgmSource(_config(), on_event=events.append)
        task = asyncio.create_task(source.run())
        try:
            await _until(lambda: source.status().state == "up")
            gc.collect()  # the callback object must survive this: the source holds it
            engine.fire_policy_violation(condition, 1, **_POLICY_VALUES[condition])
            await _until(lambda: bool(events))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            source.close()

    asyncio.run(scenario())
    assert not engine.calls("policy_callback_lost")
    (event,) = events
    assert event.source == "dcgm"
    assert event.gpu == "0000:28:00.0"
    if condition == 0x1:
        assert (event.kind, event.code) == ("xid", 48)
    elif condition == 0x40:
        assert (event.kind, event.code) == ("xid", 79)
    else:
        assert (event.kind, event.code) == ("dcgm_policy", condition)
    for name, value in _POLICY_VALUES[condition].items():
        assert f"{name} {value}" in event.line


def test_policy_registered_again_after_a_restart(engine: Any) -> None:
    events: list[GpuEvent] = []

    async def scenario() -> None:
        source = DcgmSource(_config(), on_event=events.append)
        task = asyncio.create_task(source.run())
        try:
            await _until(lambda: source.status().state == "up")
            engine.restart_host_engine()
            await _until(lambda: source.connects >= 2 and source.status().state == "up")
            engine.fire_policy_violation(0x40, 0, errnum=31)
            await _until(lambda: bool(events))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            source.close()

    asyncio.run(scenario())
    assert len(engine.calls("dcgmPolicyRegister_v2")) >= 2
    assert events[0].code == 31
    assert events[0].gpu == "0000:18:00.0"


def test_policy_xid_dedups_against_the_kernel_log() -> None:
    config = EventsSection(dedup_window_seconds=10.0)
    log = EventLog(config)
    now = time.monotonic()
    kernel = GpuEvent("kmsg:1", "kmsg", "xid", "0000:18:00.0", time.time(), now, code=79)
    assert log.add(kernel)
    dcgm = to_event((0x40, 0, 0, {"errnum": 79}), {0: "0000:18:00.0"})
    assert not log.add(dcgm)
    other = to_event((0x40, 0, 0, {"errnum": 31}), {0: "0000:18:00.0"})
    assert log.add(other)


# --- profiling fields --------------------------------------------------------------------


def _profiling(engine: Any, wanted: frozenset[str]) -> DcgmStatus:
    async def scenario() -> DcgmStatus:
        source = DcgmSource(
            _config(profiling_interval_seconds=0.05), profiling_wanted=lambda: wanted
        )
        task = asyncio.create_task(source.run())
        try:
            await _until(lambda: source.status().state == "up")
            if wanted:
                await _until(lambda: bool(source.status().profiling))
            else:
                await asyncio.sleep(0.3)
            return source.status()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            source.close()

    return asyncio.run(scenario())


def test_profiling_fields_by_number_for_gpus_without_gpm(engine: Any) -> None:
    engine.set_gpus([engine_module().default_gpu(0), engine_module().default_gpu(1)])
    engine.set_field_values(0, {1002: 0.42, 1009: 1.5e9, 449: 1000, 1004: None})
    engine.set_field_values(1, {1002: 0.9})
    status = _profiling(engine, frozenset({"0000:18:00.0"}))  # GPU 1 has GPM
    (bus_id, profiling), *rest = status.profiling
    assert not rest
    assert bus_id == "0000:18:00.0"
    assert profiling.source == "dcgm"
    values = dict(profiling.values)
    assert values[1002] == pytest.approx(0.42)
    assert values[1009] == pytest.approx(1.5e9)
    assert values[449] == pytest.approx(1000)
    assert 1004 not in values  # blank: skipped
    added = [c["args"][-1] for c in engine.calls("dcgmGroupAddDevice")]
    assert added == [0]  # GPU 1 (GPM) is never watched


def test_gpu_without_profiling_support_gets_nothing(engine: Any) -> None:
    module = engine_module()
    engine.set_gpus([module.default_gpu(0, profiling=False), module.default_gpu(1)])
    engine.set_field_values(0, {1002: 0.5})
    engine.set_field_values(1, {1002: 0.7})
    status = _profiling(engine, frozenset({"0000:18:00.0", "0000:28:00.0"}))
    assert [bus for bus, _ in status.profiling] == ["0000:28:00.0"]


def test_no_profiling_watch_when_gpm_covers_every_gpu(engine: Any) -> None:
    status = _profiling(engine, frozenset())
    assert status.profiling == ()
    assert not engine.calls("dcgmWatchFields")


def engine_module() -> ModuleType:
    return sys.modules["_standin_engine"]


# --- the engine: dcgm findings only where DCGM is present ---------------------------------


def _evaluate(dcgm: DcgmStatus | None, dbe: int) -> dict[str, Finding]:
    from gpuagent.checks import HealthMemory, evaluate  # noqa: PLC0415
    from gpuagent.config import ChecksSection  # noqa: PLC0415
    from gpuagent.model import GpuIdentity, GpuReadings, GpuState, NvmlStatus  # noqa: PLC0415

    gpu = GpuState(
        GpuIdentity(0, "0000:18:00.0", "GPU-0", "NVIDIA H100 80GB HBM3"),
        "ok",
        GpuReadings(ecc_enabled=True, ecc_dbe_volatile=dbe, ecc_sbe_volatile=0),
    )
    health, _ = evaluate(
        (gpu,), NvmlStatus(ok=True), ChecksSection(), HealthMemory(), 0.0, dcgm=dcgm
    )
    return {f"{f.gpu or 'node'}/{f.check}": f for f in health.findings}


def test_engine_dedups_a_dcgm_dbe_against_the_ecc_finding() -> None:
    dbe = DcgmIncident(
        "memory", Severity.CRITICAL, "DCGM_FR_VOLATILE_DBE_DETECTED", "DBE", "0000:18:00.0"
    )
    status = DcgmStatus("up", incidents=(dbe,))
    found = _evaluate(status, dbe=1)
    assert found["0000:18:00.0/ecc"].severity is Severity.CRITICAL
    assert ("dcgm_memory", "DCGM_FR_VOLATILE_DBE_DETECTED: DBE") in found[
        "0000:18:00.0/ecc"
    ].evidence
    assert found["0000:18:00.0/dcgm"].severity is Severity.OK
    # NVML saw nothing: DCGM's incident is the alarm.
    found = _evaluate(status, dbe=0)
    assert found["0000:18:00.0/dcgm"].severity is Severity.CRITICAL
    assert found["node/dcgm"].severity is Severity.OK


@pytest.mark.parametrize("dcgm", [None, DcgmStatus("absent", "no bindings")])
def test_engine_without_dcgm_has_no_dcgm_findings(dcgm: DcgmStatus | None) -> None:
    assert not [k for k in _evaluate(dcgm, dbe=0) if k.endswith("/dcgm")]


def test_a_diagnostic_past_its_limit_through_the_bindings_is_a_timeout(engine: Any) -> None:
    engine.set_diag_duration(2.0)

    async def scenario() -> None:
        source = DcgmSource(_config())
        task = asyncio.create_task(source.run())
        try:
            await _until(lambda: source.status().state == "up")
            # The level's limit, not a second one of the source's: past it, it hung.
            with pytest.raises(TimeoutError, match="did not finish"):
                await source.run_diag(1, (0,), 0.3)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            source.close()

    asyncio.run(scenario())
