from __future__ import annotations

import asyncio
import errno
import socket
import threading
import time
from pathlib import Path

import pytest

from conftest import PATIENCE
from gpuagent.nvml.worker import CallTimeoutError, CallWorker
from gpuagent.sdnotify import Notifier, _pure_notify


async def test_job_result_is_returned() -> None:
    worker = CallWorker("t")
    assert await worker.run(lambda: worker.call("f", lambda: 41) + 1, 1.0) == 42
    assert not worker.busy


async def test_exception_propagates() -> None:
    worker = CallWorker("t")

    def boom() -> None:
        raise ValueError("x")

    with pytest.raises(ValueError, match="x"):
        await worker.run(lambda: worker.call("f", boom), 1.0)


async def test_each_call_is_timed_not_the_whole_job() -> None:
    worker = CallWorker("t")

    def many_short_calls() -> int:
        # 6 calls of 0.1 s: 0.6 s in all, but no single call near the 0.3 s limit.
        for _ in range(6):
            worker.call("short", time.sleep, 0.1)
        return 6

    assert await worker.run(many_short_calls, 0.3) == 6


async def test_blocked_call_times_out_and_worker_stays_busy_until_it_returns() -> None:
    worker = CallWorker("t")
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(CallTimeoutError) as info:
        await worker.run(lambda: worker.call("nvmlDeviceGetTemperature", release.wait), 0.2)
    assert 0.15 < time.monotonic() - started < PATIENCE  # the call never returns
    assert info.value.call == "nvmlDeviceGetTemperature"
    assert worker.busy
    blocked = worker.blocked_call()
    assert blocked is not None
    assert blocked[0] == "nvmlDeviceGetTemperature"
    release.set()
    for _ in range(50):
        if not worker.busy:
            break
        await asyncio.sleep(0.01)
    assert not worker.busy
    assert await worker.run(lambda: worker.call("f", lambda: 1), 1.0) == 1


async def test_event_loop_is_not_blocked_by_a_hung_call() -> None:
    worker = CallWorker("t")
    release = threading.Event()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    with pytest.raises(CallTimeoutError):
        await worker.run(lambda: worker.call("hang", release.wait), 0.3)
    task.cancel()
    release.set()
    assert ticks >= 10


def test_notify_fallback_sends_datagrams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        notifier = Notifier(_pure_notify)
        notifier.ready("8 GPUs")
        assert server.recv(100) == b"READY=1\nSTATUS=8 GPUs"
        notifier.watchdog()
        assert server.recv(100) == b"WATCHDOG=1"


def test_notify_outside_systemd_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert _pure_notify("READY=1") is False


def test_notify_out_of_descriptors_is_a_missed_ping_not_a_crash(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Out of descriptors the notification socket cannot be made; the watchdog loop must
    carry on (it ended the daemon when this raised)."""
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))

    def no_descriptors(*_args: object, **_kwargs: object) -> socket.socket:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(socket, "socket", no_descriptors)
    assert _pure_notify("WATCHDOG=1") is False


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [("30000000", None, 15.0), (None, None, None), ("x", None, None), ("1000000", "1", None)],
)
def test_watchdog_interval(
    monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None, expected: float | None
) -> None:
    for name, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert Notifier(_pure_notify).watchdog_interval == expected
