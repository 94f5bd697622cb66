"""The local API: newline-delimited JSON over a Unix socket.

Request:  {"method": "status"}            Response: {"ok": true, "result": {...}}
          {"method": "inject", "params": {...}}        {"ok": false, "error": "..."}

The socket file is owner-only (0600) unless `api.group` is set (0660, that group). Reads
are open to whoever can connect; anything that changes state also requires the peer to be
root or the daemon's own user, checked with SO_PEERCRED. Malformed or oversized requests
are answered with an error, counted, and logged once per kind; the daemon carries on.

Connections are bounded so that clients cannot use up the daemon's file descriptors (and
with them /metrics): at most ``max_connections`` are open at once. At the cap, a new
connection takes the place of the one idle longest (waiting for a request), so idle
clients cannot lock the others out; when none is idle, the new one is closed as soon as it
is accepted. A connection must send its first request within
``request_timeout`` seconds and each later one within ``idle_timeout`` seconds of the last
answer, and running out of descriptors anyway (EMFILE, ENFILE) is logged once per episode
while the accept is retried. Each connection refused or dropped is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import grp
import json
import logging
import os
import socket
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
# Far more than the CLI, benchmarks and monitoring ever hold open, far fewer than the
# descriptors the unit allows (LimitNOFILE= in systemd/gpuagent.service).
MAX_CONNECTIONS = 64
# The first request must arrive this soon after connecting (and an answer must be taken
# off the socket this soon); later requests on a kept-open connection within IDLE.
REQUEST_TIMEOUT_SECONDS = 10.0
IDLE_TIMEOUT_SECONDS = 30.0
# Out of descriptors, accept is tried again this often (nothing can be served meanwhile).
ACCEPT_RETRY_SECONDS = 0.5
_BACKLOG = 128
# Connection-level reasons share the server's `rejected` counter (and the snapshot's
# rejected_api_requests) with request-level ones, under this prefix; the metrics collector
# exports them as gpuagent_api_connections_rejected_total{reason}.
CONNECTION_REASON_PREFIX = "connection:"
# accept() failing for want of resources: the process's or the system's descriptors, or
# kernel memory. Anything else (a peer that hung up in the backlog) is per connection.
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class ApiError(Exception):
    """An error the client should see (bad parameters, not allowed, not ready)."""


class ExhaustionLog:
    """Accepts that fail for want of descriptors, logged once per episode.

    The first failure of an episode is an error line, the rest are only counted, and the
    first accept that works again ends the episode with one line saying how many failed.
    One instance belongs to one accepting thread or loop.
    """

    def __init__(
        self, what: str, logger: logging.Logger, retry_seconds: float = ACCEPT_RETRY_SECONDS
    ) -> None:
        self.what = what
        self.retry_seconds = retry_seconds
        self.failures = 0  # since start
        self._episode = 0
        self._log = logger

    def failed(self, exc: OSError) -> None:
        self.failures += 1
        self._episode += 1
        if self._episode == 1:
            self._log.error(
                "%s: cannot accept connections: %s; retrying every %.1f s, further failures "
                "are only counted until one succeeds",
                self.what,
                exc.strerror or exc,
                self.retry_seconds,
            )

    def accepted(self) -> None:
        if self._episode:
            self._log.warning(
                "%s: accepting connections again after %d failed attempts",
                self.what,
                self._episode,
            )
            self._episode = 0


class ApiServer:
    def __init__(
        self,
        path: Path,
        group: str = "",
        *,
        max_connections: int = MAX_CONNECTIONS,
        request_timeout: float = REQUEST_TIMEOUT_SECONDS,
        idle_timeout: float = IDLE_TIMEOUT_SECONDS,
    ) -> None:
        self.path = path
        self.group = group
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        # Request-level reasons ("malformed", ...) and, prefixed, connection-level ones.
        self.rejected: Counter[str] = Counter()
        self.descriptors = ExhaustionLog(f"local API {path}", log)
        self._reads: dict[str, Handler] = {}
        self._writes: dict[str, Handler] = {}
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        # Each connection's handler, and since when it has been waiting for a request
        # (time.monotonic()), or None while it is being answered.
        self._connections: dict[asyncio.Task[None], float | None] = {}
        self._evicted: set[asyncio.Task[None]] = set()  # cancelled, not yet ended
        self._at_limit = False

    @property
    def connections(self) -> int:
        """Connections being served now."""
        return len(self._connections)

    def route(self, method: str, handler: Handler, *, changes_state: bool = False) -> None:
        (self._writes if changes_state else self._reads)[method] = handler

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            if await _is_listening(self.path):
                raise OSError(f"another gpuagent is already serving {self.path}")
            self.path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            old_umask = os.umask(0o177)  # the socket is born 0600: no window where others connect
            try:
                listener.bind(str(self.path))
            finally:
                os.umask(old_umask)
            listener.listen(_BACKLOG)
            listener.setblocking(False)  # noqa: FBT003 - the stdlib signature
            if self.group:
                os.chown(self.path, -1, grp.getgrnam(self.group).gr_gid)
                self.path.chmod(0o660)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._accepting = asyncio.get_running_loop().create_task(
            self._accept_loop(listener), name="api-accept"
        )

    async def stop(self) -> None:
        """Stop accepting, close every connection and wait for their handlers to end.

        Unbounded only if a handler ignores cancellation; callers bound it with their own
        deadline (the daemon's stop budget).
        """
        accepting, self._accepting = self._accepting, None
        listener, self._listener = self._listener, None
        tasks = {t for t in (accepting, *self._connections, *self._evicted) if t is not None}
        for task in tasks:
            task.cancel()
        try:
            if tasks:
                await asyncio.wait(tasks)
        finally:
            if listener is not None:
                listener.close()
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()

    def _reject(self, kind: str, detail: str) -> dict[str, Any]:
        self.rejected[kind] += 1
        if self.rejected[kind] == 1:
            log.warning(
                "rejected API request (%s): %s; further ones are only counted", kind, detail
            )
        return {"ok": False, "error": detail}

    def _drop(self, reason: str) -> None:
        """Count a connection refused or closed unserved (``reason``: limit, idle, ...)."""
        self.rejected[CONNECTION_REASON_PREFIX + reason] += 1

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _address = await loop.sock_accept(listener)
            except OSError as exc:
                if exc.errno not in OUT_OF_DESCRIPTORS:
                    log.debug("local API: accept failed: %s", exc)
                    continue
                self._drop("descriptors")
                self.descriptors.failed(exc)
                # The pending connection stays in the backlog; try again once some
                # descriptors may have been freed, not in a busy loop.
                await asyncio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            self.descriptors.accepted()
            if len(self._connections) >= self.max_connections:
                self._drop("limit")
                if not self._at_limit:
                    self._at_limit = True
                    log.warning(
                        "local API: %d connections open, the limit; closing the idle ones "
                        "(or new ones) to make room (counted in "
                        "gpuagent_api_connections_rejected_total)",
                        self.max_connections,
                    )
                if not self._evict_idle():
                    conn.close()
                    continue
            elif self._at_limit:
                self._at_limit = False
                log.info("local API: below the connection limit again")
            try:
                reader, writer = await asyncio.open_unix_connection(
                    sock=conn, limit=MAX_REQUEST_BYTES
                )
            except OSError as exc:
                conn.close()
                log.debug("local API: cannot set up a connection: %s", exc)
                continue
            task = loop.create_task(self._serve(reader, writer), name="api-connection")
            self._connections[task] = time.monotonic()
            task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._connections.pop(task, None)
        self._evicted.discard(task)

    def _evict_idle(self) -> bool:
        """Close the connection that has waited longest for a request; False if none waits."""
        waiting = {task: since for task, since in self._connections.items() if since is not None}
        if not waiting:
            return False
        task = min(waiting, key=waiting.__getitem__)
        task.cancel()  # its handler closes the socket
        del self._connections[task]
        self._evicted.add(task)
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        wait = self.request_timeout  # for the first request; idle_timeout after an answer
        task = asyncio.current_task()
        try:
            while True:
                try:
                    async with asyncio.timeout(wait):
                        line = await reader.readuntil(b"\n")
                except TimeoutError:
                    self._drop("idle")
                    return
                except asyncio.IncompleteReadError:
                    return
                except asyncio.LimitOverrunError:
                    await self._answer(writer, self._reject("oversized", "request too large"))
                    return
                if task in self._connections:
                    self._connections[task] = None  # busy: not to be evicted
                response = await self._dispatch(line, writer)
                if not await self._answer(writer, response):
                    return
                if task in self._connections:
                    self._connections[task] = time.monotonic()
                wait = self.idle_timeout
        except (ConnectionError, OSError):
            return
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, response: dict[str, Any]) -> bool:
        """Send ``response``; False when the client does not take it off the socket in time."""
        try:
            async with asyncio.timeout(self.request_timeout):
                await _send(writer, response)
        except TimeoutError:
            self._drop("idle")
            return False
        return True

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
