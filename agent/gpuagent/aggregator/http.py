"""The aggregator's HTTP side (aiohttp): the JSON API under /api/v1, the fleet page at /
and fleet metrics at /metrics. Reads the in-memory state; only the event, action and
cordon history comes from the store."""

from __future__ import annotations

import hmac
import ipaddress
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpuagent.aggregator import views
from gpuagent.aggregator.commands import CommandError, command
from gpuagent.aggregator.drift import fleet_drift
from gpuagent.aggregator.ingest import Outgoing
from gpuagent.aggregator.page import PAGE
from gpuagent.aggregator.records import NodeRecord
from gpuagent.aggregator.state import FleetState
from gpuagent.aggregator.store import FleetStore
from gpuagent.fleet import schema
from gpuagent.fleet.topics import TopicError, check_name

DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000

Publish = Callable[[Outgoing], Awaitable[None]]


class BadRequestError(ValueError):
    pass


class NotFoundError(LookupError):
    pass


@dataclass(frozen=True)
class Api:
    state: FleetState
    store: FleetStore
    registry: CollectorRegistry
    prefix: str
    stale_after: float
    # Sends a command; raises ConnectionError while the broker is away.
    publish: Publish
    clock: Callable[[], float] = field(default=time.time)
    # Bearer token for sending commands; empty: loopback clients only.
    command_token: str = ""

    # --- helpers --------------------------------------------------------------------------

    def _bad(self, endpoint: str, problem: str) -> web.Response:
        self.state.counters.bad_requests[endpoint] += 1
        return _error(400, problem)

    @staticmethod
    def _name(request: web.Request, key: str) -> str | None:
        value = request.query.get(key)
        if value is None:
            return None
        try:
            return check_name(key, value)
        except TopicError as exc:
            raise BadRequestError(str(exc)) from None

    @staticmethod
    def _limit(request: web.Request) -> int:
        raw = request.query.get("limit", str(DEFAULT_LIMIT))
        try:
            limit = int(raw)
        except ValueError:
            raise BadRequestError(f"limit must be an integer, got {raw!r}") from None
        if not 1 <= limit <= MAX_LIMIT:
            raise BadRequestError(f"limit must be 1 to {MAX_LIMIT}")
        return limit

    @staticmethod
    def _since(request: web.Request) -> float | None:
        raw = request.query.get("since")
        if raw is None:
            return None
        try:
            since = float(raw)
        except ValueError:
            raise BadRequestError(f"since must be a Unix time in seconds, got {raw!r}") from None
        if not math.isfinite(since):
            raise BadRequestError("since must be finite")
        return since

    def _record(self, request: web.Request) -> NodeRecord:
        node = request.match_info["node"]
        cluster = self._name(request, "cluster")
        matches = self.state.find(node, cluster)
        if not matches:
            raise NotFoundError(f"unknown node {node!r}")
        if len(matches) > 1:
            clusters = ", ".join(sorted(r.cluster for r in matches))
            raise BadRequestError(
                f"node {node!r} is in several clusters ({clusters}): add ?cluster="
            )
        return matches[0]

    # --- handlers -----------------------------------------------------------------------

    async def nodes(self, request: web.Request) -> web.Response:
        try:
            limit = self._limit(request) if "limit" in request.query else None
        except BadRequestError as exc:
            return self._bad("nodes", str(exc))
        now = self.clock()
        return _json(
            {
                "nodes": views.nodes_json(self.state, now, self.stale_after, limit),
                "counts": views.node_counts(self.state, now, self.stale_after),
            }
        )

    async def node(self, request: web.Request) -> web.Response:
        try:
            record = self._record(request)
        except BadRequestError as exc:
            return self._bad("node", str(exc))
        except NotFoundError as exc:
            return _error(404, str(exc))
        return _json(views.node_detail(self.state, record, self.clock(), self.stale_after))

    async def events(self, request: web.Request) -> web.Response:
        try:
            node, since, limit = (
                self._name(request, "node"),
                self._since(request),
                self._limit(request),
            )
        except BadRequestError as exc:
            return self._bad("events", str(exc))
        return _json({"events": await self.store.events(node=node, since=since, limit=limit)})

    async def actions(self, request: web.Request) -> web.Response:
        try:
            node, limit = self._name(request, "node"), self._limit(request)
        except BadRequestError as exc:
            return self._bad("actions", str(exc))
        return _json({"actions": await self.store.actions(node=node, limit=limit)})

    async def cordons(self, request: web.Request) -> web.Response:
        try:
            since, limit = self._since(request), self._limit(request)
        except BadRequestError as exc:
            return self._bad("cordons", str(exc))
        rows = await self.store.cordons(since=since, limit=limit)
        return _json({"cordons": [r.json() for r in rows]})

    async def drift(self, _: web.Request) -> web.Response:
        return _json({"clusters": [c.json() for c in fleet_drift(self.state.nodes.values())]})

    def _command_refusal(self, request: web.Request) -> web.Response | None:
        """Commands change nodes: a token, or (without one configured) this host only."""
        if self.command_token:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.command_token}".encode()):
                return _error(401, "sending commands needs the aggregator's bearer token")
            return None
        if _loopback(request.remote):
            return None
        return _error(403, "commands from other hosts need aggregator.command_token_file")

    async def send_command(self, request: web.Request) -> web.Response:
        refusal = self._command_refusal(request)
        if refusal is None and request.content_type != "application/json":
            # A browser sends a cross-origin text/plain or form POST without asking first
            # (no CORS preflight), so any page open on this host could reach a loopback-only
            # aggregator; a JSON POST from another origin needs a preflight, which is refused.
            refusal = _error(415, "commands must be sent with Content-Type: application/json")
        if refusal is not None:
            self.state.counters.bad_requests["commands"] += 1
            return refusal
        try:
            record = self._record(request)
            body = await _body(request)
            out, message = command(
                self.prefix, record.cluster, record.node, body.get("command"), body.get("args")
            )
        except (BadRequestError, CommandError) as exc:
            return self._bad("commands", str(exc))
        except NotFoundError as exc:
            return _error(404, str(exc))
        try:
            await self.publish(out)
        except ConnectionError as exc:
            return _error(503, f"not connected to the broker: {exc}")
        self.state.counters.commands[message["command"]] += 1
        self.store.queue_command(message)
        return _json({"id": message["id"], "topic": out.topic, "command": message}, status=202)

    async def page(self, _: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html", charset="utf-8")

    async def metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise BadRequestError("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequestError("the body must be a JSON object")
    return body


def _loopback(remote: str | None) -> bool:
    try:
        address = ipaddress.ip_address(remote or "")
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _json(doc: object, status: int = 200) -> web.Response:
    # Strict JSON: a node's NaN would otherwise make the whole answer unreadable to a browser.
    return web.Response(text=schema.dumps(doc), status=status, content_type="application/json")


def _error(status: int, problem: str) -> web.Response:
    return _json({"error": problem}, status=status)


def application(api: Api) -> web.Application:
    app = web.Application(client_max_size=64 * 1024)
    app.router.add_get("/", api.page)
    app.router.add_get("/metrics", api.metrics)
    app.router.add_get("/api/v1/nodes", api.nodes)
    app.router.add_get("/api/v1/nodes/{node}", api.node)
    app.router.add_post("/api/v1/nodes/{node}/commands", api.send_command)
    app.router.add_get("/api/v1/events", api.events)
    app.router.add_get("/api/v1/actions", api.actions)
    app.router.add_get("/api/v1/cordons", api.cordons)
    app.router.add_get("/api/v1/drift", api.drift)
    return app
