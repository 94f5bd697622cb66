"""The audit trail: records, counts for budgets, persistence across reopen, failures."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from gpuagent.remediation import audit as audit_module
from gpuagent.remediation.audit import AuditError, AuditStore
from gpuagent.remediation.gpu_ops import GpuOperationError, GpuOps, _holds, nvml_bus_id
from gpuagent.remediation.types import PlannedAction

RESET = PlannedAction(
    "reset_gpu",
    "0000:3b:00.0",
    "1 uncorrectable ECC error",
    "ecc",
    "CRITICAL",
    evidence=(("ecc_dbe_volatile", 1),),
)
CAP = PlannedAction("cap_power", "0000:3b:00.0", "hot", params=(("limit_w", 490.0),))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def _opened(path: Path, **options: Any) -> AuditStore:
    store = AuditStore(path, **options)
    assert await store.open()
    return store


async def test_records_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "state" / "remediation.sqlite"
    store = await _opened(path)
    record = await store.record(RESET, "started", mode="enforce")
    assert record.evidence == {"ecc_dbe_volatile": 1}
    store.close()
    reopened = await _opened(path)
    (again,) = reopened.recent(10)
    assert (again.kind, again.target, again.result, again.check) == (
        "reset_gpu",
        "0000:3b:00.0",
        "started",
        "ecc",
    )
    assert again.json()["action"] == "reset_gpu"
    reopened.close()


async def test_counts_by_kind_result_target_and_time(tmp_path: Path) -> None:
    clock = Clock()
    store = await _opened(tmp_path / "a.sqlite", wall_clock=clock)
    await store.record(RESET, "started", mode="enforce")
    clock.now += 100
    await store.record(RESET, "succeeded", mode="enforce")
    other = PlannedAction("reset_gpu", "0000:5d:00.0", "x")
    await store.record(other, "started", mode="enforce")
    assert store.count("reset_gpu", ("started",), since=0) == 2
    assert store.count("reset_gpu", ("started",), since=0, target="0000:3b:00.0") == 1
    assert store.count("reset_gpu", ("started",), since=clock.now - 10) == 1
    assert store.count("cordon", ("started",), since=0) == 0
    last = store.last("reset_gpu", "0000:3b:00.0", ("succeeded", "started"))
    assert last is not None
    assert last.result == "succeeded"
    assert store.targets("reset_gpu", "started") == ("0000:3b:00.0", "0000:5d:00.0")
    store.close()


async def test_answers_kept_between_records_follow_every_record(tmp_path: Path) -> None:
    """`last` and `targets` are remembered until the next record, which they then show."""
    store = await _opened(tmp_path / "a.sqlite")
    assert store.last("reset_gpu", None, ("started",)) is None
    assert store.targets("reset_gpu", "started") == ()
    first = await store.record(RESET, "started", mode="enforce")
    assert store.last("reset_gpu", None, ("started",)) == first
    assert store.targets("reset_gpu", "started") == (RESET.target,)
    other = PlannedAction("reset_gpu", "0000:5d:00.0", "x")
    second = await store.record(other, "started", mode="enforce")
    assert store.last("reset_gpu", None, ("started",)) == second
    assert store.targets("reset_gpu", "started") == (RESET.target, other.target)
    store.close()


async def test_a_repeated_decision_is_counted_on_its_row(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "a.sqlite"
    store = await _opened(path, wall_clock=clock)
    first = await store.record(RESET, "refused", mode="observe", fold=True, detail="reset: busy")
    clock.now += 300
    again = await store.record(RESET, "refused", mode="observe", fold=True, detail="reset: busy")
    assert (again.id, again.count, again.time, again.last_seen) == (
        first.id,
        2,
        first.time,
        clock.now,
    )
    # A cooldown runs from when it was last seen, not from the first time.
    assert store.count("reset_gpu", ("refused",), since=clock.now - 10) == 1
    store.close()
    reopened = await _opened(path, wall_clock=clock)
    (row,) = reopened.recent(10)
    assert (row.id, row.count, row.last_seen) == (first.id, 2, clock.now)
    assert row.json()["count"] == 2
    assert row.json()["last_seen"] == clock.now
    clock.now += 300
    assert (
        await reopened.record(RESET, "refused", mode="observe", fold=True, detail="reset: busy")
    ).count == 3
    # Another outcome, another mode or another finding is a new row; so is a repeat that
    # is not the newest row of its action and target any more.
    await reopened.record(
        RESET, "refused", mode="observe", fold=True, detail="reset: MIG is enabled"
    )
    await reopened.record(
        RESET, "refused", mode="enforce", fold=True, detail="reset: MIG is enabled"
    )
    other = PlannedAction("reset_gpu", RESET.target, "a new fault", "ecc", "CRITICAL")
    await reopened.record(
        other, "refused", mode="enforce", fold=True, detail="reset: MIG is enabled"
    )
    await reopened.record(RESET, "refused", mode="observe", fold=True, detail="reset: busy")
    # Unasked (a requested action, a diagnostic), the same record is a row of its own.
    await reopened.record(RESET, "refused", mode="observe", detail="reset: busy")
    assert [r.count for r in reopened.recent(10)] == [1, 1, 1, 1, 1, 3]
    reopened.close()


async def test_attempts_are_never_folded(tmp_path: Path) -> None:
    store = await _opened(tmp_path / "a.sqlite")
    for result in ("started", "succeeded", "started", "succeeded", "failed", "failed"):
        await store.record(RESET, result, mode="enforce", fold=True)
    assert [r.count for r in store.recent(10)] == [1] * 6
    assert store.count("reset_gpu", ("started",), since=0) == 2
    store.close()


async def test_a_trail_from_before_counts_gets_them(tmp_path: Path) -> None:
    """A trail written before repeats were counted: its rows are seen once, when written,
    and a repeat of its newest row is counted on it."""
    path = tmp_path / "a.sqlite"
    db = sqlite3.connect(path)
    db.executescript(
        """CREATE TABLE actions (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL,
        kind TEXT NOT NULL, target TEXT NOT NULL, result TEXT NOT NULL, mode TEXT NOT NULL,
        reason TEXT NOT NULL, check_name TEXT, severity TEXT, evidence TEXT NOT NULL,
        detail TEXT NOT NULL);"""
    )
    db.execute(
        "INSERT INTO actions (time, kind, target, result, mode, reason, check_name, severity,"
        " evidence, detail) VALUES (5.0, 'reset_gpu', ?, 'planned', 'observe', ?, 'ecc',"
        " 'CRITICAL', '{}', 'observe mode: not done')",
        (RESET.target, RESET.reason),
    )
    db.commit()
    db.close()
    clock = Clock()
    store = await _opened(path, wall_clock=clock)
    (old,) = store.recent(10)
    assert (old.count, old.last_seen) == (1, 5.0)
    assert store.count("reset_gpu", ("planned",), since=4.0) == 1
    again = await store.record(
        RESET, "planned", mode="observe", fold=True, detail="observe mode: not done"
    )
    assert (again.id, again.count, again.time, again.last_seen) == (old.id, 2, 5.0, clock.now)
    store.close()


async def test_parameters_are_kept_in_the_evidence(tmp_path: Path) -> None:
    store = await _opened(tmp_path / "a.sqlite")
    record = await store.record(CAP, "succeeded", mode="enforce")
    assert record.evidence == {"params": {"limit_w": 490.0}}
    store.close()


async def test_an_unwritable_trail_is_an_audit_error(tmp_path: Path) -> None:
    store = await _opened(tmp_path / "a.sqlite")
    assert store._writer is not None
    store._writer.execute("DROP TABLE actions")  # the trail is gone from under us
    with pytest.raises(AuditError):
        await store.record(RESET, "started", mode="enforce")
    assert "cannot write the audit record" in store.error
    store.close()


async def test_a_trail_that_cannot_be_opened_is_tried_again(tmp_path: Path) -> None:
    """A read-only state directory at start: every call is an AuditError (so nothing is
    done), the reason is kept, and the trail opens once it can."""
    path = tmp_path / "remediation.sqlite"
    path.mkdir()  # not a database: it cannot be opened
    store = AuditStore(path)
    store.retry_seconds = 0.0
    assert not await store.open()
    assert "cannot open the audit trail" in store.error
    with pytest.raises(AuditError):
        store.recent(1)
    with pytest.raises(AuditError):
        await store.record(RESET, "started", mode="enforce")
    path.rmdir()
    assert await store.open()
    assert store.error == ""
    await store.record(RESET, "started", mode="enforce")
    assert len(store.recent(10)) == 1
    store.close()


async def test_a_slow_disk_never_stalls_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each record waits for fsync; here every commit takes 0.5 s, as on a failing disk.
    The event loop keeps its pace: records are written on the disk thread."""
    store = await _opened(tmp_path / "a.sqlite")
    write = audit_module._write

    def slow_write(
        db: sqlite3.Connection, now: float, row: tuple[object, ...], repeatable: bool
    ) -> tuple[int, float, int]:
        time.sleep(0.5)
        return write(db, now, row, repeatable)

    monkeypatch.setattr(audit_module, "_write", slow_write)
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()

    ticker = asyncio.create_task(tick())
    for _ in range(3):
        await store.record(RESET, "started", mode="enforce")
    done.set()
    await ticker
    assert len(store.recent(10)) == 3
    assert max(gaps) < 0.25  # on the loop, each record would be a 0.5 s gap
    store.close()


def test_bus_id_in_nvml_form() -> None:
    assert nvml_bus_id("0000:3b:00.0") == "00000000:3B:00.0"


async def test_device_holders_from_proc(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, name, target in (
        (100, "python", "/dev/nvidia3"),
        (101, "nvidia-persistenced", "/dev/nvidia3"),
        (102, "bash", "/dev/null"),
    ):
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(name + "\n")
        (proc / str(pid) / "fd" / "5").symlink_to(target)
    (proc / "self").mkdir()
    ops = GpuOps(reset_command="true", timeout=5, proc_root=proc)
    assert await ops.device_holders(3) == [(100, "python")]
    assert await ops.device_holders(None) == []


def test_a_process_we_cannot_inspect_counts_as_holding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = tmp_path / "7"
    (proc / "fd").mkdir(parents=True)
    real = Path.iterdir

    def denied(self: Path) -> Any:
        if self == proc / "fd":
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "iterdir", denied)
    assert _holds(proc, "/dev/nvidia0") is True  # fail closed: no reset
    assert _holds(tmp_path / "gone", "/dev/nvidia0") is False


async def test_reset_command_runs_with_the_bus_id(tmp_path: Path) -> None:
    out = tmp_path / "out"
    ops = GpuOps(reset_command=f"sh -c 'echo $0 > {out}' {{bus_id}}", timeout=5)
    await ops.reset("0000:3b:00.0", 3)
    assert out.read_text().strip() == "0000:3b:00.0"


async def test_a_failing_reset_command_is_an_error() -> None:
    ops = GpuOps(reset_command="sh -c 'echo nope; exit 3'", timeout=5)
    with pytest.raises(GpuOperationError, match="exited 3: nope"):
        await ops.reset("0000:3b:00.0", 0)
    missing = GpuOps(reset_command="/nonexistent/reset {bus_id}", timeout=5)
    with pytest.raises(GpuOperationError, match="cannot run"):
        await missing.reset("0000:3b:00.0", 0)
