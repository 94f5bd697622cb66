"""The local API: newline-delimited JSON over a Unix socket.

Request:  {"method": "status"}            Response: {"ok": true, "result": {...}}
          {"method": "inject", "params": {...}}        {"ok": false, "error": "..."}

The socket file is owner-only (0600) unless `api.group` is set (0660, that group). Reads
are open to whoever can connect; anything that changes state also requires the peer to be
root or the daemon's own user, checked with SO_PEERCRED. Malformed or oversized requests
are answered with an error, counted, and logged once per kind; the daemon carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import logging
import os
import socket
import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class ApiError(Exception):
    """An error the client should see (bad parameters, not allowed, not ready)."""


class ApiServer:
    def __init__(self, path: Path, group: str = "") -> None:
        self.path = path
        self.group = group
        self.rejected: Counter[str] = Counter()
        self._reads: dict[str, Handler] = {}
        self._writes: dict[str, Handler] = {}
        self._server: asyncio.Server | None = None

    def route(self, method: str, handler: Handler, *, changes_state: bool = False) -> None:
        (self._writes if changes_state else self._reads)[method] = handler

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            if await _is_listening(self.path):
                raise OSError(f"another gpuagent is already serving {self.path}")
            self.path.unlink()
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others connect
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, path=str(self.path), limit=MAX_REQUEST_BYTES
            )
        finally:
            os.umask(old_umask)
        if self.group:
            os.chown(self.path, -1, grp.getgrnam(self.group).gr_gid)
            self.path.chmod(0o660)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _reject(self, kind: str, detail: str) -> dict[str, Any]:
        self.rejected[kind] += 1
        if self.rejected[kind] == 1:
            log.warning(
                "rejected API request (%s): %s; further ones are only counted", kind, detail
            )
        return {"ok": False, "error": detail}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError:
                    return
                except asyncio.LimitOverrunError:
                    await _send(writer, self._reject("oversized", "request too large"))
                    return
                response = await self._dispatch(line, writer)
                await _send(writer, response)
        except (ConnectionError, OSError):
            return
        finally:
            writer.close()

    async def _dispatch(  # noqa: PLR0911 - one return per way a request can fail
        self, line: bytes, writer: asyncio.StreamWriter
    ) -> dict[str, Any]:
        try:
            request = json.loads(line)
        except ValueError:  # not JSON, not UTF-8
            return self._reject("malformed", "request is not valid JSON")
        except RecursionError:  # "[" * 30000: nested deeper than the decoder goes
            return self._reject("malformed", "request is not valid JSON (nested too deeply)")
        if not isinstance(request, dict) or not isinstance(request.get("method"), str):
            return self._reject("malformed", 'request must be an object with a "method"')
        params = request.get("params", {})
        if not isinstance(params, dict):
            return self._reject("malformed", '"params" must be an object')
        method = request["method"]
        handler = self._reads.get(method)
        if handler is None and method in self._writes:
            uid = _peer_uid(writer)
            if uid not in (0, os.geteuid()):
                return self._reject("forbidden", f"{method} requires root")
            handler = self._writes[method]
        if handler is None:
            return self._reject("unknown_method", f"unknown method {method!r}")
        try:
            return {"ok": True, "result": await handler(params)}
        except ApiError as exc:
            return {"ok": False, "error": str(exc)}


def _peer_uid(writer: asyncio.StreamWriter) -> int | None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


async def _send(writer: asyncio.StreamWriter, response: dict[str, Any]) -> None:
    writer.write(json.dumps(response, separators=(",", ":")).encode() + b"\n")
    await writer.drain()


async def _is_listening(path: Path) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), 1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True
