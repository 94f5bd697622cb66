"""Connection limits for the aggregator's HTTP server, which aiohttp lacks: a timeout for
the request head, a cap on open connections.

aiohttp reads a request head for as long as the client cares to send it (its keep-alive
timer, an hour by default, is the only bound), so a few thousand half-sent requests would
hold as many sockets open. `ConnectionGuard` wraps aiohttp's protocol factory:

- at most ``max_connections`` connections are open; one more is closed as it is accepted
  (``limit``);
- a connection that has not delivered a whole request head within ``header_timeout`` of
  opening, or of its first byte after the previous request, is closed
  (``header_timeout``). Its `middleware` tells it when a head is complete: a request that
  reaches the application has one.

Body timeouts are the application's (`http._body`): it reads the body under a timeout and
answers 408. Every refusal is counted in ``counter`` by reason and logged once per episode
(again only after `EPISODE_QUIET_SECONDS` without one of that reason).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

EPISODE_QUIET_SECONDS = 60.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Episodes:
    """Log a recurring problem once per episode: an episode ends after `quiet` seconds
    without the problem."""

    def __init__(self, quiet: float = EPISODE_QUIET_SECONDS) -> None:
        self.quiet = quiet
        self._last: dict[str, float] = {}

    def starts(self, reason: str) -> bool:
        now = time.monotonic()
        last = self._last.get(reason)
        self._last[reason] = now
        return last is None or now - last > self.quiet


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol, with a head timer and a place in the connection count."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner: asyncio.Protocol | None = inner
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        guard = self._guard
        if len(guard.connections) >= guard.max_connections:
            self._inner = None
            guard.refuse(
                "limit",
                "%d connections open (aggregator.http.max_connections): closing new ones",
                guard.max_connections,
            )
            transport.abort()
            return
        self._transport = transport
        guard.connections[transport] = self
        self.start_timer()
        assert self._inner is not None
        self._inner.connection_made(transport)

    def start_timer(self) -> None:
        self.cancel_timer()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._guard.header_timeout, self._head_timed_out)

    def cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timed_out(self) -> None:
        self._timer = None
        if self.busy or self._transport is None:
            return
        self._guard.refuse(
            "header_timeout",
            "closed a connection that sent no complete request head within %.0f s "
            "(aggregator.http.header_timeout_seconds)",
            self._guard.header_timeout,
        )
        self._transport.abort()

    def request_started(self) -> None:
        self.busy = True
        self.cancel_timer()

    def request_done(self) -> None:
        # The next request's head is timed from its first byte; until then the
        # connection is idle, which aiohttp's keep-alive timeout bounds.
        self.busy = False

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return
        if not self.busy and self._timer is None:
            self.start_timer()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_timer()
        if self._inner is None:
            return
        self._guard.connections.pop(self._transport, None)  # type: ignore[arg-type]
        self._transport = None
        inner, self._inner = self._inner, None
        inner.connection_lost(exc)


class ConnectionGuard:
    def __init__(
        self, *, header_timeout: float, max_connections: int, counter: Counter[str]
    ) -> None:
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self.counter = counter
        self.connections: dict[asyncio.Transport, _Guarded] = {}
        self.episodes = Episodes()

    def refuse(self, reason: str, message: str, *args: Any) -> None:
        """Count a refusal; log it if it starts an episode."""
        self.counter[reason] += 1
        if self.episodes.starts(reason):
            log.warning(
                "aggregator HTTP: %s; more are only counted "
                "(gpuagent_fleet_http_connections_rejected_total{reason=%r})",
                message % args,
                reason,
            )

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Guarded(self, inner())

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        connection = self.connections.get(request.transport)  # type: ignore[arg-type]
        if connection is not None:
            connection.request_started()
        try:
            return await handler(request)
        finally:
            if connection is not None:
                connection.request_done()


class GuardedSite(web.BaseSite):
    """A TCP site whose connections go through ``guard``."""

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._guard = guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._guard.factory(server), self._host, self._port, backlog=1024
        )
