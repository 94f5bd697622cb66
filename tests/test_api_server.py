"""The local API server (newline-delimited JSON over a Unix socket) on a real socket."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from gpuagent.api import ApiServer


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
