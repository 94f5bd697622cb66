"""Source supervision: restarts with backoff, sources that never worked, facilities absent
from the host (gpuagent.supervisor)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import DaemonProcess, start_daemon
from gpuagent.supervisor import SourceTracker, SourceUnavailable, supervise


class SleptEnoughError(Exception):
    """Raised by the fake sleep once the test has seen enough."""


def _fake_sleep(slept: list[float], limit: int) -> Callable[[float], Awaitable[None]]:
    """A sleep that records how long it was asked for, and returns at once."""

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) >= limit:
            raise SleptEnoughError
        await asyncio.sleep(0)

    return sleep


async def test_a_source_failing_right_after_ready_keeps_backing_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ready, then a failure at once, again and again: the backoff grows as for any
    failure; a source that never stayed up must not be retried every second."""
    slept: list[float] = []
    sleep = _fake_sleep(slept, limit=8)

    async def run(ready: Callable[[], None]) -> None:
        ready()
        raise OSError("gone at once")

    tracker = SourceTracker("s")
    with pytest.raises(SleptEnoughError):
        await supervise(tracker, run, lambda: None, sleep=sleep)
    assert slept == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert not tracker.status.up


async def test_an_unavailable_facility_is_logged_once_and_never_a_success(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    slept: list[float] = []
    sleep = _fake_sleep(slept, limit=3 * 30)
    runs = 0

    async def run(ready: Callable[[], None]) -> None:
        nonlocal runs
        runs += 1
        raise SourceUnavailable("no udevd runs here", lambda: False)

    tracker = SourceTracker("udev")
    caplog.set_level(logging.INFO, logger="gpuagent.supervisor")
    with pytest.raises(SleptEnoughError):
        await supervise(tracker, run, lambda: None, sleep=sleep)
    # Three tries in 90 checks of 10 s: one every 5 minutes.
    assert runs == 3
    assert set(slept) == {10.0}
    status = tracker.status
    assert (status.up, status.available, status.last_success) == (False, False, None)
    assert (status.last_error, status.consecutive_failures) == ("no udevd runs here", 0)
    logged = [r.getMessage() for r in caplog.records]
    assert logged == ["source udev is unavailable here: no udevd runs here"]


async def test_a_facility_that_appears_is_used_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    sleep = _fake_sleep(slept, limit=10)
    there = False
    runs: list[str] = []

    async def run(ready: Callable[[], None]) -> None:
        nonlocal there
        if not there:
            runs.append("absent")
            there = True  # udevd starts while the supervisor waits
            raise SourceUnavailable("no udevd", lambda: there)
        runs.append("up")
        ready()
        await asyncio.Event().wait()

    tracker = SourceTracker("udev")
    task = asyncio.create_task(supervise(tracker, run, lambda: None, sleep=sleep))
    for _ in range(100):
        await asyncio.sleep(0)
        if tracker.status.up:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert runs == ["absent", "up"]
    assert slept == [10.0]  # found at the first check, not 5 minutes later
    assert (tracker.status.up, tracker.status.available) == (True, True)


def test_a_daemon_without_udev_says_so_once_and_keeps_it_out_of_source_down(
    tmp_path: Path,
) -> None:
    """The real daemon, no simulator (no GPU here, so NVML is absent too), on a host whose
    udevd does not run: the udev source is unavailable, logged once, not down."""
    control = tmp_path / "no-udevd" / "control"
    config = f'[sources.udev]\nenabled = true\ncontrol = "{control}"\n'
    daemon: DaemonProcess = start_daemon(tmp_path / "d", "", config_extra=config, simulate=False)
    try:

        def udev(doc: dict[str, Any]) -> dict[str, Any]:
            found: dict[str, Any] = next((s for s in doc["sources"] if s["name"] == "udev"), {})
            return found

        daemon.wait_for(lambda d: udev(d).get("available") is False)
        seen = daemon.status()["sequence"]
        daemon.wait_for(lambda d: d["sequence"] >= seen + 5)  # several polls on
        assert daemon.metric("gpuagent_source_available", source="udev") == 0.0
        assert daemon.metric("gpuagent_source_up", source="udev") == 0.0
        assert daemon.log().count("source udev") == 1
        table = daemon.cli("status", "--socket", str(daemon.socket)).stdout
        assert "udev unavailable (no udevd runs here" in table
    finally:
        assert daemon.stop() == 0
