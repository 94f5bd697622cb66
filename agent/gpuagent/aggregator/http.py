"""The aggregator's HTTP side (aiohttp): the JSON API under /api/v1, the fleet page at /
and fleet metrics at /metrics. Reads the in-memory state; only the event, action and
cordon history comes from the store."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpuagent.aggregator import page, peers, views
from gpuagent.aggregator.budget import CordonBudget
from gpuagent.aggregator.commands import CommandError, command
from gpuagent.aggregator.drift import fleet_drift, settings_drift
from gpuagent.aggregator.fleetview import FleetView, Query
from gpuagent.aggregator.ingest import Outgoing
from gpuagent.aggregator.maintenance import MaintenanceError, parse_duration
from gpuagent.aggregator.records import NodeRecord
from gpuagent.aggregator.state import FleetState
from gpuagent.aggregator.store import FleetStore
from gpuagent.fleet import schema
from gpuagent.fleet.topics import TopicError, check_name
from gpuagent.links import Links

DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000
# Host header names always answered (with any port), besides the listen address and IP
# literals: a DNS-rebinding page can only ever send its own domain name as Host.
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
NO_TOKEN = "commands are disabled: no command token (aggregator.command_token_file)"  # noqa: S105

Publish = Callable[[Outgoing], Awaitable[None]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

log = logging.getLogger(__name__)
# Who sent which command, accepted or refused.
audit = logging.getLogger("gpuagent.aggregator.audit")


class BadRequestError(ValueError):
    pass


class BodyTimeoutError(TimeoutError):
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
    # Bearer token for sending commands; empty: commands are refused.
    command_token: str = ""
    # Host header names answered (`allowed_hosts`); others get 421.
    hosts: frozenset[str] = LOCAL_HOSTS
    # A command's body must arrive within this many seconds (408 otherwise).
    body_timeout: float = 10.0
    # Grafana and runbook links on the page.
    links: Links = field(default_factory=Links)
    # Clears an open fleet rule finding: (id, by, reason) -> its document; KeyError if
    # none is open with that id. None: the fleet rules are off.
    clear_rule: Callable[..., Awaitable[dict[str, Any]]] | None = None
    # The fleet cordon budget in memory (`GET /api/v1/budget`).
    budget: CordonBudget | None = None

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

    @classmethod
    def _listing(cls, request: web.Request) -> tuple[str | None, float | None, int]:
        """A list's ?node=, ?since= and ?limit= (BadRequestError if one is bad)."""
        return cls._name(request, "node"), cls._since(request), cls._limit(request)

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
        found = await self._node_and_document(request, "node")
        if isinstance(found, web.Response):
            return found
        record, document = found
        detail = views.node_detail(self.state, record, self.clock(), self.stale_after, document)
        return _json(detail)

    async def _node_and_document(
        self, request: web.Request, endpoint: str
    ) -> tuple[NodeRecord, str] | web.Response:
        """The node the request names and its last report as stored (the record's own,
        or the database's: the fleet state keeps none); or the error to answer."""
        try:
            record = self._record(request)
        except BadRequestError as exc:
            return self._bad(endpoint, str(exc))
        except NotFoundError as exc:
            return _error(404, str(exc))
        if record.document:
            return record, record.document
        try:
            return record, await self.store.node_document(record.cluster, record.node)
        except Exception:  # the page without its status, rather than no page
            log.exception("API: reading the last report of %s failed", record.node)
            return record, ""

    async def fleet(self, request: web.Request) -> web.Response:
        """The page's fleet table: filtered and sorted here, not in the browser."""
        q = request.query
        try:
            query = Query(
                cluster=q.get("cluster", ""),
                health=q.get("health", ""),
                model=q.get("model", ""),
                driver=q.get("driver", ""),
                text=q.get("q", ""),
                kind=q.get("kind", ""),
                sort=q.get("sort", "health"),
                descending=q.get("order", "asc") == "desc",
                limit=self._limit(request) if "limit" in q else page.MAX_ROWS,
            )
        except (BadRequestError, ValueError) as exc:
            return self._bad("fleet", str(exc))
        fleet = FleetView(self.state, self.stale_after).fleet(query, self.clock())
        return _json_unless_seen(request, fleet)

    async def fleet_node(self, request: web.Request) -> web.Response:
        """The page's node view: the node's detail, with shown health and finding onsets."""
        found = await self._node_and_document(request, "fleet_node")
        if isinstance(found, web.Response):
            return found
        record, document = found
        view = FleetView(self.state, self.stale_after)
        return _json_unless_seen(request, view.node(record, self.clock(), document))

    async def events(self, request: web.Request) -> web.Response:
        try:
            node, since, limit = self._listing(request)
        except BadRequestError as exc:
            return self._bad("events", str(exc))
        events = await self.store.events(node=node, since=since, limit=limit)
        return _json_unless_seen(request, {"events": events})

    async def incidents(self, request: web.Request) -> web.Response:
        """Fleet incidents changed since ?since= (the last day by default), the latest
        first; ?state=open|closed and ?node= narrow the list."""
        try:
            node, since, limit = self._listing(request)
            state = request.query.get("state")
            if state not in {None, "open", "closed"}:
                raise BadRequestError("state must be open or closed")  # noqa: TRY301
        except BadRequestError as exc:
            return self._bad("incidents", str(exc))
        since = self.clock() - 86400.0 if since is None else since
        # Filtered here, so read as many as may be listed before cutting to the limit.
        filtered = state is not None or node is not None
        found = await self.store.incidents(since=since, limit=MAX_LIMIT if filtered else limit)
        listed = [
            i
            for i in found
            if (state is None or i.get("state") == state)
            and (node is None or node in i.get("nodes", {}))
        ]
        return _json_unless_seen(request, {"incidents": listed[:limit]})

    async def incident(self, request: web.Request) -> web.Response:
        found = await self.store.incident(request.match_info["incident"])
        if found is None:
            return _error(404, f"no fleet incident {request.match_info['incident']!r}")
        return _json_unless_seen(request, found)

    async def rule_findings(self, request: web.Request) -> web.Response:
        """Fleet rule findings: the open ones, or (?since=UNIX time) every one changed
        since then, the latest first; ?node= and ?rule= narrow the list."""
        try:
            node, since, limit = self._listing(request)
        except BadRequestError as exc:
            return self._bad("rules", str(exc))
        rule = request.query.get("rule")
        found = await self.store.rule_findings(since=since, limit=MAX_LIMIT)
        listed = [
            f
            for f in found
            if (node is None or f.get("node") == node) and (rule is None or f.get("rule") == rule)
        ]
        return _json_unless_seen(request, {"findings": listed[:limit]})

    async def maintenance_windows(self, request: web.Request) -> web.Response:
        """Planned maintenance: the windows running, and (?since=UNIX time) those that
        ended since then, the latest started first."""
        try:
            since = self._since(request)
        except BadRequestError as exc:
            return self._bad("maintenance", str(exc))
        now = self.clock()
        windows = await self.store.maintenance_windows(ending_after=now if since is None else since)
        for window in windows:
            window["running"] = window["start"] <= now < window["end"]
        return _json_unless_seen(request, {"windows": windows})

    async def _operator(
        self, request: web.Request, what: str, *, reason: bool = True
    ) -> tuple[dict[str, Any], str] | web.Response:
        """An operator's change (the bearer token, as for commands): its JSON body and who
        sent it ("<by> from <peer>"), or the refusal to answer. ``reason``: the body must
        say why ("reason", a non-empty string)."""
        refusal = self._command_refusal(request)
        if refusal is not None:
            return await self.refuse_command(request, *refusal, what)
        try:
            body = await _body(request, self.body_timeout)
            why, by = body.get("reason"), body.get("by", "")
            if reason and (not isinstance(why, str) or not why.strip()):
                raise BadRequestError('"reason" (a non-empty string) is required')  # noqa: TRY301
            if not isinstance(by, str):
                raise BadRequestError('"by" must be a string')  # noqa: TRY301
        except BadRequestError as exc:
            return await self.refuse_command(request, "invalid", _error(400, str(exc)), what)
        except BodyTimeoutError:
            response = _error(408, f"the body did not arrive within {self.body_timeout:g} s")
            return await self.refuse_command(request, "body_timeout", response, what)
        return body, f"{by or 'unnamed'} from {await sender(request)}"

    async def clear_rule_finding(self, request: web.Request) -> web.Response:
        """POST {"reason": TEXT, "by": NAME}: a person says an open finding is dealt with."""
        if self.clear_rule is None:
            return _error(404, "the fleet rules are off (aggregator.rules.enabled)")
        sent = await self._operator(request, "clear")
        if isinstance(sent, web.Response):
            return sent
        body, who = sent
        finding_id = request.match_info["finding"]
        try:
            doc = await self.clear_rule(finding_id, by=who, reason=body["reason"].strip())
        except KeyError:
            return _error(404, f"no open fleet rule finding {finding_id!r}")
        return _json(doc)

    async def start_maintenance(self, request: web.Request) -> web.Response:
        """POST {"domain": "rack=r129", "for": "2h", "cluster": "", "reason": TEXT,
        "by": NAME}: a window from now."""
        sent = await self._operator(request, "maintenance")
        if isinstance(sent, web.Response):
            return sent
        body, who = sent
        try:
            cluster = body.get("cluster", "")
            if not isinstance(cluster, str):
                raise MaintenanceError('"cluster" must be a string')  # noqa: TRY301
            window = self.state.maintenance.start(
                str(body.get("domain", "")),
                parse_duration(str(body.get("for", ""))),
                cluster=cluster,
                by=who,
                reason=body["reason"].strip(),
                now=self.clock(),
            )
        except MaintenanceError as exc:
            response = _error(400, str(exc))
            return await self.refuse_command(request, "invalid", response, "maintenance")
        self.store.queue_window(window, self.clock())
        audit.info("maintenance started: %s until %.0f", window.describe(), window.end)
        return _json(window.json(), status=201)

    async def end_maintenance(self, request: web.Request) -> web.Response:
        """POST {"by": NAME}: end a running window now."""
        sent = await self._operator(request, "maintenance", reason=False)
        if isinstance(sent, web.Response):
            return sent
        _, who = sent
        window_id = request.match_info["window"]
        try:
            window = self.state.maintenance.end(window_id, by=who, now=self.clock())
        except KeyError:
            return _error(404, f"no running maintenance window {window_id!r}")
        self.store.queue_window(window, self.clock())
        audit.info("maintenance ended early by %s: %s", who, window.describe())
        return _json(window.json())

    async def history(self, request: web.Request) -> web.Response:
        """A node's health transitions and trend samples (the console's timelines), the
        last day by default (?since=UNIX time)."""
        try:
            found = self._record(request)
            since = self._since(request)
            limit = self._limit(request) if "limit" in request.query else MAX_LIMIT
        except BadRequestError as exc:
            return self._bad("history", str(exc))
        except NotFoundError as exc:
            return _error(404, str(exc))
        since = self.clock() - 86400.0 if since is None else since
        rows = await self.store.history(found.cluster, found.node, since, limit)
        doc = {
            "node": found.node,
            "cluster": found.cluster,
            "since": since,
            "transitions": [r for r in rows if r.get("kind") == "transition"],
            "samples": [r for r in rows if r.get("kind") == "sample"],
        }
        return _json_unless_seen(request, doc)

    async def actions(self, request: web.Request) -> web.Response:
        try:
            node, limit = self._name(request, "node"), self._limit(request)
        except BadRequestError as exc:
            return self._bad("actions", str(exc))
        actions = await self.store.actions(node=node, limit=limit)
        return _json_unless_seen(request, {"actions": actions})

    async def cordons(self, request: web.Request) -> web.Response:
        try:
            since, limit = self._since(request), self._limit(request)
        except BadRequestError as exc:
            return self._bad("cordons", str(exc))
        rows = await self.store.cordons(since=since, limit=limit)
        return _json_unless_seen(request, {"cordons": [r.json() for r in rows]})

    async def budget_state(self, request: web.Request) -> web.Response:
        """The fleet cordon budget now, per cluster: its limit, the slots used and by
        whom, when each frees, whether it is spent. With SQLite only the arbiter's budget
        is the fleet's; with a shared database it is the in-memory mirror of the
        database's approvals (as the metrics report it)."""
        budget = self.budget
        doc: dict[str, Any] = {"source": "none", "clusters": []}
        if budget is None:
            return _json_unless_seen(request, doc)
        config = budget.config
        doc |= {
            "max_nodes": config.max_nodes,
            "max_percent": config.max_percent,
            "window_seconds": config.window_seconds,
        }
        # An aggregator that is not the SQLite arbiter decides none: it has no budget.
        if self.store.shared or config.arbiter:
            now = self.clock()
            clusters = sorted({*self.state.clusters(), *budget.clusters()})
            doc["source"] = "database" if self.store.shared else "memory"
            doc["clusters"] = [
                budget.state(c, self.state.cluster_size(c), now).json() for c in clusters
            ]
        return _json_unless_seen(request, doc)

    async def drift(self, request: web.Request) -> web.Response:
        """Software drift per cluster ("clusters") and settings drift ("settings": each
        group's majority, the expectation a node or operator can take, and who is off it)."""
        records = self.state.nodes.values()
        drift = [c.json() for c in fleet_drift(records)]
        settings = [c.json() for c in settings_drift(records)]
        return _json_unless_seen(request, {"clusters": drift, "settings": settings})

    def _command_refusal(self, request: web.Request) -> tuple[str, web.Response] | None:
        """Commands change nodes: every one needs the bearer token, sent as JSON."""
        if not self.command_token:
            return "no_token", _error(403, NO_TOKEN)
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.command_token}".encode()):
            return "bad_token", _error(401, "sending commands needs the aggregator's bearer token")
        if request.content_type != "application/json":
            # A browser sends a cross-origin text/plain or form POST without asking first
            # (no CORS preflight); a JSON POST from another origin needs a preflight, which
            # is refused.
            return "content_type", _error(
                415, "commands must be sent with Content-Type: application/json"
            )
        return None

    async def refuse_command(
        self, request: web.Request, reason: str, response: web.Response, command: object = None
    ) -> web.Response:
        """Count and log a refused command request; answer ``response``."""
        self.state.counters.commands_rejected[reason] += 1
        if response.status not in (404, 503):  # the request itself was at fault
            self.state.counters.bad_requests["commands"] += 1
        audit.warning(
            "command refused (%s, %d): node=%r command=%r from %s",
            reason,
            response.status,
            request.match_info.get("node", ""),
            command,
            await sender(request),
        )
        return response

    async def send_command(  # noqa: PLR0911 - one answer per way a command is refused
        self, request: web.Request
    ) -> web.Response:
        refusal = self._command_refusal(request)
        if refusal is not None:
            return await self.refuse_command(request, *refusal)
        name: object = None
        try:
            record = self._record(request)
            body = await _body(request, self.body_timeout)
            name = body.get("command")
            out, message = command(self.prefix, record.cluster, record.node, name, body.get("args"))
        except (BadRequestError, CommandError) as exc:
            return await self.refuse_command(request, "invalid", _error(400, str(exc)), name)
        except NotFoundError as exc:
            return await self.refuse_command(request, "unknown_node", _error(404, str(exc)))
        except web.HTTPRequestEntityTooLarge as exc:
            return await self.refuse_command(request, "too_large", _error(413, exc.text or ""))
        except BodyTimeoutError:
            self.state.counters.connections_rejected["body_timeout"] += 1
            response = _error(408, f"the body did not arrive within {self.body_timeout:g} s")
            response.force_close()
            await self.refuse_command(request, "body_timeout", response)
            # Send it and close now: aiohttp would otherwise linger, reading what is left
            # of the body for another while.
            await response.prepare(request)
            await response.write_eof()
            request.protocol.force_close()
            return response
        try:
            await self.publish(out)
        except ConnectionError as exc:
            response = _error(503, f"not connected to the broker: {exc}")
            return await self.refuse_command(request, "not_connected", response, name)
        self.state.counters.commands[message["command"]] += 1
        self.store.queue_command(message)
        audit.info(
            "command accepted: node=%s cluster=%s command=%s id=%s from %s",
            record.node,
            record.cluster,
            message["command"],
            message["id"],
            await sender(request),
        )
        return _json({"id": message["id"], "topic": out.topic, "command": message}, status=202)

    @web.middleware
    async def check_host(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse a Host header that is not ours (DNS rebinding): a page from evil.example
        whose name an attacker re-points at 127.0.0.1 would otherwise read the API, as
        the same origin, from a browser on this host or the management network."""
        host = request.headers.get("Host")
        if host_allowed(host, self.hosts):
            return await handler(request)
        self.state.counters.requests_rejected["host"] += 1
        response = _error(421, f"this server does not answer for Host {host!r}")
        if request.method == "POST" and request.path.endswith("/commands"):
            return await self.refuse_command(request, "host", response)
        return response

    async def page(self, _: web.Request) -> web.Response:
        return web.Response(text=page.render(self.links), content_type="text/html", charset="utf-8")

    async def metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _body(request: web.Request, seconds: float) -> dict[str, Any]:
    try:
        raw = await asyncio.wait_for(request.read(), seconds)
    except TimeoutError:
        raise BodyTimeoutError from None
    try:
        body = json.loads(raw)
    except ValueError:  # not JSON, not UTF-8
        raise BadRequestError("the body must be a JSON object") from None
    except RecursionError:  # '[' * 30000: the decoder gives up rather than overflow
        raise BadRequestError("the body is not a JSON object (nested too deeply)") from None
    if not isinstance(body, dict):
        raise BadRequestError("the body must be a JSON object")
    return body


def allowed_hosts(listen_host: str, extra: list[str]) -> frozenset[str]:
    """Host header values answered: the listen host, localhost and ``extra`` (lower case;
    an entry with a port matches only that port)."""
    names = set(LOCAL_HOSTS)
    if listen_host:
        names.add(f"[{listen_host}]" if ":" in listen_host else listen_host)
    names.update(name.lower() for name in extra)
    return frozenset(n.lower() for n in names)


def host_allowed(header: str | None, names: frozenset[str]) -> bool:
    """Whether a request with Host ``header`` is ours: a name in ``names`` (with any port,
    or the port it gives), or an IP literal, which no DNS answer can re-point."""
    value = (header or "").strip().lower()
    if value in names:
        return bool(value)
    host = _host_part(value)
    if host is None:
        return False
    if host in names:
        return True
    try:
        ipaddress.ip_address(host[1:-1] if host.startswith("[") else host)
    except ValueError:
        return False
    return True


def _host_part(value: str) -> str | None:
    """ "name:port" → "name", "[v6]:port" → "[v6]"; None if malformed."""
    if value.startswith("["):
        close = value.find("]")
        host, port = value[: close + 1], value[close + 1 :]
        if close < 0 or (port and not (port[0] == ":" and port[1:].isdigit())):
            return None
        return host
    host, colon, port = value.partition(":")
    if not host or (colon and not port.isdigit()):
        return None
    return host


async def sender(request: web.Request) -> str:
    """Who sent a request: the peer's address and, for a loopback peer, the local user
    owning its socket (from /proc/net/tcp)."""
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    if not peer:
        return str(request.remote or "unknown")
    host, port = peer[0], int(peer[1])
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not _loopback(host):
        return shown
    ours = transport.get_extra_info("sockname") if transport is not None else None
    try:
        server = peers.address(ours[0], int(ours[1])) if ours else None
        uid = await asyncio.to_thread(peers.peer_uid, peers.address(host, port), server)
    except ValueError:
        uid = None
    return f"{shown} uid={uid if uid is not None else 'unknown'}"


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


def _json_unless_seen(request: web.Request, doc: object) -> web.Response:
    """The answer with an ETag (a hash of it), or 304 and no body when the client's copy
    (If-None-Match) is still right: the page refreshes every few seconds, mostly to find
    nothing changed, and then neither sends nor parses the fleet again."""
    text = schema.dumps(doc)
    etag = '"' + hashlib.blake2b(text.encode(), digest_size=12).hexdigest() + '"'
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers=headers)
    return web.Response(text=text, content_type="application/json", headers=headers)


def _error(status: int, problem: str) -> web.Response:
    return _json({"error": problem}, status=status)


def application(api: Api, middlewares: tuple[Any, ...] = ()) -> web.Application:
    """The app; ``middlewares`` run first (the connection guard's)."""
    app = web.Application(client_max_size=64 * 1024, middlewares=[*middlewares, api.check_host])
    app.router.add_get("/", api.page)
    app.router.add_get("/metrics", api.metrics)
    app.router.add_get("/api/v1/nodes", api.nodes)
    app.router.add_get("/api/v1/nodes/{node}", api.node)
    app.router.add_post("/api/v1/nodes/{node}/commands", api.send_command)
    app.router.add_get("/api/v1/events", api.events)
    app.router.add_get("/api/v1/actions", api.actions)
    app.router.add_get("/api/v1/cordons", api.cordons)
    app.router.add_get("/api/v1/budget", api.budget_state)
    app.router.add_get("/api/v1/incidents", api.incidents)
    app.router.add_get("/api/v1/incidents/{incident}", api.incident)
    app.router.add_get("/api/v1/drift", api.drift)
    app.router.add_get("/api/v1/rules", api.rule_findings)
    app.router.add_get("/api/v1/maintenance", api.maintenance_windows)
    app.router.add_post("/api/v1/maintenance", api.start_maintenance)
    app.router.add_post("/api/v1/maintenance/{window}/end", api.end_maintenance)
    app.router.add_post("/api/v1/rules/{finding:.+}/clear", api.clear_rule_finding)
    app.router.add_get("/api/v1/fleet", api.fleet)
    app.router.add_get("/api/v1/fleet/{node}", api.fleet_node)
    app.router.add_get("/api/v1/history/{node}", api.history)
    return app
