"""The local API server (newline-delimited JSON over a Unix socket) on a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import resource
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import DaemonProcess, deadline_in, parse_metrics
from gpuagent import api
from gpuagent.api import CONNECTION_REASON_PREFIX, ApiServer


async def _ask(path: Path, line: bytes) -> dict[str, Any]:
    reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 20)
    try:
        writer.write(line)
        await writer.drain()
        answer: dict[str, Any] = json.loads(await asyncio.wait_for(reader.readline(), 5))
        return answer
    finally:
        writer.close()


async def test_deeply_nested_json_is_answered_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """'[' * 30000 makes Python's JSON decoder raise RecursionError, which used to drop the
    connection with a traceback; it is a malformed request like any other."""
    server = ApiServer(tmp_path / "api.sock")

    async def ping(_: dict[str, Any]) -> str:
        return "pong"

    server.route("ping", ping)
    await server.start()
    nested = b"[" * 30000 + b"]" * 30000 + b"\n"
    try:
        with caplog.at_level(logging.WARNING, logger="gpuagent.api"):
            for _ in range(2):
                answer = await _ask(server.path, nested)
                assert answer["ok"] is False
                assert "not valid JSON" in answer["error"]
        assert await _ask(server.path, b'{"method": "ping"}\n') == {"ok": True, "result": "pong"}
    finally:
        await server.stop()
    assert server.rejected == {"malformed": 2}
    assert [
        r.getMessage().startswith("rejected API request (malformed)") for r in caplog.records
    ] == [True]
    assert not any(r.exc_info for r in caplog.records)


# --- connection limits, idle timeouts and running out of descriptors ---------------------


async def _pinging_server(path: Path, **limits: Any) -> ApiServer:
    server = ApiServer(path, **limits)

    async def ping(_: dict[str, Any]) -> str:
        return "pong"

    server.route("ping", ping)
    await server.start()
    return server


async def _until(condition: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def _closed_by_server(reader: asyncio.StreamReader, timeout: float = 5.0) -> bool:
    """True when the server closes the connection (EOF) within ``timeout``."""
    try:
        return await asyncio.wait_for(reader.read(1), timeout) == b""
    except ConnectionError:
        return True


async def test_idle_connections_over_the_cap_make_room_and_are_counted(tmp_path: Path) -> None:
    """The drill: idle connections piled up without bound. At the cap, a new connection
    takes the place of the one idle longest, so the API keeps answering."""
    server = await _pinging_server(tmp_path / "api.sock", max_connections=3)
    idle = [await asyncio.open_unix_connection(str(server.path)) for _ in range(5)]
    try:
        await _until(lambda: server.rejected[CONNECTION_REASON_PREFIX + "limit"] == 2)
        assert server.connections <= 3
        # The two idle longest were closed to make room for the last two.
        assert [await _closed_by_server(reader) for reader, _ in idle[:2]] == [True, True]
        assert await _ask(server.path, b'{"method": "ping"}\n') == {"ok": True, "result": "pong"}
        assert server.connections <= 3
    finally:
        for _, writer in idle:
            writer.close()
        await server.stop()
    assert server.rejected[CONNECTION_REASON_PREFIX + "limit"] == 3


async def test_at_the_cap_with_every_connection_busy_the_new_one_is_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = ApiServer(tmp_path / "api.sock", max_connections=2)
    release = asyncio.Event()
    entered = 0

    async def slow(_: dict[str, Any]) -> str:
        nonlocal entered
        entered += 1
        await release.wait()
        return "done"

    server.route("slow", slow)
    await server.start()
    busy = [await asyncio.open_unix_connection(str(server.path)) for _ in range(2)]
    try:
        for _, writer in busy:
            writer.write(b'{"method": "slow"}\n')
        await _until(lambda: entered == 2)
        with caplog.at_level(logging.WARNING, logger="gpuagent.api"):
            for _ in range(3):
                reader, writer = await asyncio.open_unix_connection(str(server.path))
                assert await _closed_by_server(reader)
                writer.close()
        assert server.rejected[CONNECTION_REASON_PREFIX + "limit"] == 3
        assert sum("connections open, the limit" in r.getMessage() for r in caplog.records) == 1
        release.set()
        for reader, _ in busy:  # the busy ones were not dropped
            assert json.loads(await asyncio.wait_for(reader.readline(), 5))["result"] == "done"
    finally:
        for _, writer in busy:
            writer.close()
        await server.stop()


async def test_idle_connections_are_closed_after_the_timeouts(tmp_path: Path) -> None:
    """No first request within request_timeout, or no next one within idle_timeout: closed."""
    server = await _pinging_server(tmp_path / "api.sock", request_timeout=0.3, idle_timeout=0.8)
    try:
        silent_reader, silent = await asyncio.open_unix_connection(str(server.path))
        started = time.monotonic()
        assert await _closed_by_server(silent_reader)
        assert 0.3 <= time.monotonic() - started < 3
        silent.close()

        reader, writer = await asyncio.open_unix_connection(str(server.path))
        writer.write(b'{"method": "ping"}\n')
        assert json.loads(await asyncio.wait_for(reader.readline(), 5))["result"] == "pong"
        answered = time.monotonic()
        assert await _closed_by_server(reader)
        assert 0.8 <= time.monotonic() - answered < 3
        writer.close()
    finally:
        await server.stop()
    assert server.rejected[CONNECTION_REASON_PREFIX + "idle"] == 2
    assert server.connections == 0


async def test_running_out_of_descriptors_is_logged_once_per_episode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """accept() failing with EMFILE used to log a traceback per attempt; now one line an
    episode, a count per attempt, and serving resumes when descriptors are free again."""
    monkeypatch.setattr(api, "ACCEPT_RETRY_SECONDS", 0.01)
    loop = asyncio.get_running_loop()
    real_accept = loop.sock_accept
    failures = 0

    async def short_of_descriptors(sock: socket.socket) -> tuple[socket.socket, Any]:
        nonlocal failures
        if 0 < failures < 6:  # an episode of five failed accepts, then descriptors again
            failures += 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return await real_accept(sock)

    monkeypatch.setattr(loop, "sock_accept", short_of_descriptors)
    server = await _pinging_server(tmp_path / "api.sock")
    try:
        with caplog.at_level(logging.DEBUG, logger="gpuagent.api"):
            assert await _ask(server.path, b'{"method": "ping"}\n') == {
                "ok": True,
                "result": "pong",
            }
            failures = 1  # the next accepts fail
            for _ in range(2):
                assert await _ask(server.path, b'{"method": "ping"}\n') == {
                    "ok": True,
                    "result": "pong",
                }
    finally:
        await server.stop()
    assert server.rejected[CONNECTION_REASON_PREFIX + "descriptors"] == 5
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot accept connections: Too many open files" in m for m in messages) == 1
    assert sum("accepting connections again after 5 failed attempts" in m for m in messages) == 1
    assert not any(r.exc_info for r in caplog.records)


# --- the same on the real daemon ------------------------------------------------------------

H100 = '[node]\ngpus = 2\nmodel = "NVIDIA H100 80GB HBM3"\n'


def _rejected_connections(daemon: DaemonProcess) -> dict[str, float]:
    return {
        sample.labels["reason"]: sample.value
        for family in parse_metrics(daemon.metrics())
        for sample in family.samples
        if sample.name == "gpuagent_api_connections_rejected_total"
    }


def _open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _wait(condition: Any, timeout: float = 10.0, what: str = "") -> None:
    deadline = deadline_in(timeout)
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def test_daemon_serves_through_idle_floods_and_descriptor_exhaustion(
    run_daemon: Callable[..., DaemonProcess],
) -> None:
    daemon = run_daemon(H100)
    pid = daemon.process.pid
    quiet = _open_fds(pid)
    log_file = daemon.workdir / "daemon.log"
    flood = []
    try:
        # More idle connections than the cap: the API and /metrics still answer.
        for _ in range(api.MAX_CONNECTIONS + 20):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(str(daemon.socket))
            flood.append(sock)
        assert daemon.call("ping")["node"] == "test-node"
        _wait(lambda: _rejected_connections(daemon).get("limit", 0) >= 20, what="limit count")
        assert _open_fds(pid) < 2 * api.MAX_CONNECTIONS
    finally:
        for sock in flood:
            sock.close()
    flood.clear()
    _wait(lambda: _open_fds(pid) <= quiet, what="the flood's connections closed")

    # Out of descriptors: a few to spare under RLIMIT_NOFILE, then more clients than that.
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (_open_fds(pid) + 3, hard))
    try:
        for _ in range(20):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(str(daemon.socket))  # waits in the listen backlog
            flood.append(sock)
        marker = "cannot accept connections: Too many open files"
        _wait(lambda: marker in log_file.read_text(), what="exhaustion logged")
        # A scrape meanwhile waits in the metrics listener's backlog, its accept failing
        # too, for long enough that both accepts are retried a few times (counted below).
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=2)
    finally:
        for sock in flood:
            sock.close()
    # Once the connections close, the daemon serves again, still under the low limit.
    _wait(lambda: "accepting connections again" in log_file.read_text(), what="recovery")
    assert daemon.call("ping")["node"] == "test-node"
    assert _rejected_connections(daemon).get("descriptors", 0) >= 2
    assert "# HELP gpuagent_build_info" in daemon.metrics()
    text = log_file.read_text()
    assert text.count(f"local API {daemon.socket}: {marker}") == 1
    assert text.count(f"metrics 127.0.0.1:{daemon.port}: {marker}") == 1
    assert "Traceback" not in text
    assert "out of system resource" not in text
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
    assert daemon.stop() == 0
