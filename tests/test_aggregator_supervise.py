"""The aggregator's background tasks and its store's writer survive their failures: a task
that raises is logged, counted and restarted; one that keeps failing stops the aggregator;
a failed write keeps its rows (and their acknowledgements) for the next try, and a failed
prune costs no write."""

from __future__ import annotations

import asyncio
import itertools
import logging
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

import aggregator_support as msg
from conftest import deadline_in, free_port
from gpuagent.aggregator import cli, service, supervise
from gpuagent.aggregator import store as store_module
from gpuagent.aggregator.service import Aggregator
from gpuagent.aggregator.store import FleetStore
from gpuagent.aggregator.supervise import Supervisor, TaskFailedError
from gpuagent.fleet import schema


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = deadline_in(timeout)
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# --- the supervisor -------------------------------------------------------------------


async def test_a_failing_task_is_logged_counted_and_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures: Counter[str] = Counter()
    supervisor = Supervisor(failures, backoff_min=0.01, backoff_max=0.04)
    runs: list[float] = []
    done = asyncio.Event()

    async def flaky() -> None:
        runs.append(time.monotonic())
        if len(runs) <= 3:
            raise RuntimeError(f"failure {len(runs)}")
        done.set()
        await asyncio.Event().wait()  # then runs on

    with caplog.at_level(logging.ERROR, logger="gpuagent.aggregator.supervise"):
        supervisor.start("flaky", flaky)
        await asyncio.wait_for(done.wait(), 5)
    await supervisor.cancel(1.0)
    assert failures == {"flaky": 3}
    assert not supervisor.failed.is_set()
    logged = [r for r in caplog.records if "task flaky failed" in r.getMessage()]
    assert len(logged) == 3  # once per failure, each with its traceback
    assert all(r.exc_info and "failure" in str(r.exc_info[1]) for r in logged)
    gaps = [b - a for a, b in itertools.pairwise(runs)]
    assert gaps[0] >= 0.01  # backing off
    assert gaps[1] >= 0.02
    assert gaps[2] >= 0.04


async def test_a_task_failing_too_often_stops_the_aggregator(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agg = Aggregator(msg.config(tmp_path, port=free_port()))
    agg.supervisor.backoff_min = agg.supervisor.backoff_max = 0.001
    agg.supervisor.max_failures = 3

    async def broken() -> None:
        raise sqlite3.OperationalError("disk I/O error")

    agg._sweep_stale = broken  # type: ignore[method-assign]
    await agg.start()
    try:
        with pytest.raises(TaskFailedError, match="stale-sweep failed 4 times"):
            await asyncio.wait_for(agg.wait(), 10)
    finally:
        await agg.close()
    assert agg.state.counters.task_failures == {"stale-sweep": 4}


async def test_a_restarted_task_shows_in_the_metrics(tmp_path: Path) -> None:
    port = free_port()
    agg = Aggregator(msg.config(tmp_path, port=port))
    agg.supervisor.backoff_min = 0.01
    calls = 0

    async def sweep_once_broken() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyError("gone")
        await asyncio.Event().wait()

    agg._sweep_stale = sweep_once_broken  # type: ignore[method-assign]
    await agg.start()
    try:
        await until(lambda: calls == 2)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as response,
        ):
            text = await response.text()
    finally:
        await agg.close()
    samples = {
        (s.name, tuple(s.labels.values())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("gpuagent_fleet_task_failures_total", ("stale-sweep",))] == 1


async def test_run_raises_when_a_task_keeps_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervise, "BACKOFF_MIN_SECONDS", 0.001)
    monkeypatch.setattr(supervise, "BACKOFF_MAX_SECONDS", 0.001)

    async def broken(self: Aggregator) -> None:
        raise RuntimeError("broken")

    monkeypatch.setattr(Aggregator, "_sweep_stale", broken)
    config = msg.config(tmp_path, port=free_port())
    with pytest.raises(TaskFailedError):
        await asyncio.wait_for(service.run(config, asyncio.Event()), 20)


def test_the_cli_exits_1_when_run_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def failing(*_: Any) -> None:
        raise TaskFailedError("task store-writer failed 6 times within 60 s")

    monkeypatch.setattr(service, "run", failing)
    monkeypatch.setattr("gpuagent.logs.setup", lambda *_: None)
    (tmp_path / "aggregator.toml").write_text("[aggregator]\n")
    interval = sys.getswitchinterval()
    try:
        with pytest.raises(SystemExit) as exited:
            cli.main(["run", "--config", str(tmp_path / "aggregator.toml")])
    finally:
        sys.setswitchinterval(interval)
    assert exited.value.code == 1
    assert "store-writer failed 6 times" in capsys.readouterr().err


# --- the store's writer ---------------------------------------------------------------


class FlakyConnection:
    """A SQLite connection whose statements fail with OperationalError while ``failing``."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.failing = False

    def _check(self) -> None:
        if self.failing:
            raise sqlite3.OperationalError("database is locked")

    def execute(self, *args: Any) -> sqlite3.Cursor:
        self._check()
        return self.db.execute(*args)

    def executemany(self, *args: Any) -> sqlite3.Cursor:
        self._check()
        return self.db.executemany(*args)

    @property
    def in_transaction(self) -> bool:
        return self.db.in_transaction

    def close(self) -> None:
        self.db.close()


async def _store(tmp_path: Path) -> FleetStore:
    store = FleetStore(tmp_path / "fleet.sqlite", retention_seconds=3600.0, max_events=1000)
    await store.open()
    return store


async def test_a_batch_the_database_refuses_stays_queued_and_unacknowledged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = await _store(tmp_path)
    flaky = FlakyConnection(store.database._db)  # type: ignore[attr-defined]
    store.database._db = flaky  # type: ignore[attr-defined]
    acked: list[str] = []
    first = msg.event("n1", "n1:boot:1")
    store.queue_event(first, schema.encode(first).decode())
    store.after_write(lambda: acked.append("first"))
    flaky.failing = True
    try:
        with caplog.at_level(logging.ERROR, logger="gpuagent.aggregator.store"):
            await store.flush()
            assert store.retrying
            later = msg.event("n1", "n1:boot:2")
            store.queue_event(later, schema.encode(later).decode())
            store.after_write(lambda: acked.append("later"))
            await store.flush()
        assert acked == []  # nothing acknowledged while nothing is stored
        assert store.pending() == 2
        assert store.rows_dropped == {}
        assert store.batches_retried == 2
        assert len(caplog.records) == 1  # once per episode
        assert "database is locked" in caplog.records[0].getMessage()
        flaky.failing = False
        await store.flush()
        assert not store.retrying
        assert acked == ["first", "later"]  # in order, once each
        assert store.pending() == 0
        stored = await store.events(node=None, since=None, limit=10)
        assert sorted(e["id"] for e in stored) == ["n1:boot:1", "n1:boot:2"]
    finally:
        await store.close()


async def test_a_failing_prune_does_not_stop_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(store_module, "PRUNE_INTERVAL_SECONDS", 0.0)
    store = await _store(tmp_path)
    real_prune = store._prune
    prunes: list[str] = []

    def prune_once_broken(now: float) -> int:
        if not prunes:
            prunes.append("failed")
            raise sqlite3.OperationalError("database is locked")
        prunes.append("ok")
        return real_prune(now)

    store._prune = prune_once_broken  # type: ignore[method-assign]
    stop = asyncio.Event()
    acked: list[int] = []
    with caplog.at_level(logging.ERROR, logger="gpuagent.aggregator.store"):
        writer = asyncio.create_task(store.run_writer(stop))
        try:
            await until(lambda: prunes == ["failed"] or len(prunes) > 1)
            for i in range(3):
                event = msg.event("n1", f"n1:after:{i}")
                store.queue_event(event, schema.encode(event).decode())
                store.after_write(lambda i=i: acked.append(i))  # type: ignore[misc]
            await until(lambda: acked == [0, 1, 2])
            await until(lambda: "ok" in prunes)
            assert not writer.done()
        finally:
            stop.set()
            await asyncio.wait_for(writer, 5)
    try:
        assert await store.count("events") == 3
        assert store.prune_errors == 1
        (logged,) = [r for r in caplog.records if "pruning" in r.getMessage()]
        assert logged.exc_info is not None  # with its traceback
    finally:
        await store.close()
