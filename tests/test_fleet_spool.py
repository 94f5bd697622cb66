"""The MQTT spool: order, de-duplication, bounds, restarts, an unwritable disk."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from conftest import FakeClock
from gpuagent.fleet.spool import Spool, SpoolError


def _spool(path: Path, clock: FakeClock, **bounds: float) -> Spool:
    return Spool(
        path / "spool.sqlite",
        max_bytes=int(bounds.get("max_bytes", 10**6)),
        max_age_seconds=bounds.get("max_age_seconds", 3600.0),
        wall_clock=clock,
    )


def _messages(start: int, count: int, size: int = 10) -> list[tuple[str, str, bytes]]:
    return [(f"m{i}", "events", bytes([65 + i % 26]) * size) for i in range(start, start + count)]


def test_messages_come_out_in_order_and_ids_are_kept_once(tmp_path: Path) -> None:
    spool = _spool(tmp_path, FakeClock())
    assert spool.put(_messages(0, 5)) == 5
    assert spool.put(_messages(3, 4)) == 2  # m3 and m4 are waiting already
    assert [m.id for m in spool.head()] == ["m0", "m1", "m2", "m3", "m4", "m5", "m6"]
    assert (spool.depth, spool.bytes) == (7, 70)
    spool.remove([m.seq for m in spool.head(3)])
    assert [m.id for m in spool.head()] == ["m3", "m4", "m5", "m6"]
    assert (spool.depth, spool.bytes) == (4, 40)


def test_what_waits_survives_a_restart_and_so_does_the_cursor(tmp_path: Path) -> None:
    clock = FakeClock()
    spool = _spool(tmp_path, clock)
    spool.put(_messages(0, 3))
    spool.set_cursor("audit", 41)
    spool.close()
    again = _spool(tmp_path, clock)
    assert [m.id for m in again.head()] == ["m0", "m1", "m2"]
    assert (again.depth, again.bytes) == (3, 30)
    assert again.cursor("audit") == 41
    assert again.cursor("other") == 0


def test_bounds_drop_the_oldest_and_count_them(tmp_path: Path) -> None:
    clock = FakeClock()
    spool = _spool(tmp_path, clock, max_bytes=50, max_age_seconds=100.0)
    spool.put(_messages(0, 4))
    clock.advance(60)
    spool.put(_messages(4, 3))  # 70 bytes: the two oldest go
    assert [m.id for m in spool.head()] == ["m2", "m3", "m4", "m5", "m6"]
    assert spool.dropped == 2
    clock.advance(50)  # m2 and m3 are 110 s old now
    spool.put(_messages(7, 1))
    assert [m.id for m in spool.head()] == ["m4", "m5", "m6", "m7"]
    assert spool.dropped == 4
    assert (spool.depth, spool.bytes) == (4, 40)


def test_an_unwritable_spool_raises_and_keeps_its_counts(tmp_path: Path) -> None:
    spool = _spool(tmp_path, FakeClock())
    spool.put(_messages(0, 2))
    spool._db = sqlite3.connect(
        f"file:{tmp_path / 'spool.sqlite'}?mode=ro", uri=True, isolation_level=None
    )
    with pytest.raises(SpoolError, match="readonly"):
        spool.put(_messages(2, 1))
    assert (spool.depth, spool.bytes) == (2, 20)


def test_messages_age_out_without_new_writes(tmp_path: Path) -> None:
    # An outage: nothing is written, yet what waited too long must go before the drain.
    clock = FakeClock()
    spool = _spool(tmp_path, clock, max_age_seconds=100.0)
    spool.put(_messages(0, 3))
    clock.advance(150)
    spool.expire()
    assert (spool.head(), spool.dropped, spool.depth) == ([], 3, 0)


def test_drift_between_counters_and_table_cannot_loop_forever(tmp_path: Path) -> None:
    spool = _spool(tmp_path, FakeClock(), max_bytes=50)
    spool.put(_messages(0, 2))
    spool.depth, spool.bytes = 10**6, 10**9  # counters out of step with the table
    spool.expire()
    assert (spool.depth, spool.bytes) == (0, 0)  # recounted from the table


def test_drops_are_logged_when_they_start_not_for_every_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    spool = _spool(tmp_path, clock, max_bytes=30)
    for start in range(0, 300, 3):
        spool.put(_messages(start, 3))
    assert spool.dropped == 297
    drops = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(drops) == 1
    assert "over max_bytes" in drops[0].getMessage()
