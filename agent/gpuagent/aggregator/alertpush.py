"""Fleet incidents as Alertmanager alerts: one alert per incident and node, so that a
route grouped by ``incident`` pages once for an NVLink domain going down, and an
inhibition rule (source ``role="root"``, target ``role="consequence"``, equal
``incident``) holds the consequences back behind their root.

Each push posts every alert that is due in one ``POST /api/v2/alerts``: an open incident
when it is new or has changed (state, last time, root or its nodes' roles), and again
every ``resend_seconds`` with ``endsAt`` three intervals ahead, as Alertmanager expects of
a client that keeps an alert firing; a closed incident once more, with ``endsAt`` its
close time, so that Alertmanager resolves it, and then it is forgotten. A closed incident
never pushed open is not pushed at all: Alertmanager would not notify of an alert that is
already resolved, and one pushed open by an earlier process resolves at its ``endsAt``.

A failed push (Alertmanager unreachable, an answer other than 2xx) is counted in
``failures`` by reason and logged once per outage, never raised; what it carried stays
due and goes with the next push, a closed incident too though it is not given again.
Memory holds one key per open incident among those the last push was given, and each
closed incident until it is pushed closed.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import aiohttp

log = logging.getLogger(__name__)

ALERTNAME = "GpuagentFleetIncident"
# Runbooks, relative to the published docs/ (the aggregator's runbook_base_url).
NVLINK_RUNBOOK = "checks.md#nvlink"
XID_RUNBOOK = "checks.md#xid"
DOMAIN_RUNBOOK = "fleet.md#fleet-incidents"
# The runbook of an incident whose root is not known: the domain as a whole.
DOMAIN_RUNBOOK_TEXT = "rack or NVSwitch tray: see docs/fleet.md#fleet-incidents"
# An open incident's alert ends this many resend intervals after it was sent.
ENDS_AFTER_RESENDS = 3
JSON = {"Content-Type": "application/json"}
# Closed incidents held while Alertmanager cannot be reached, at most (beyond that the
# oldest are dropped: their alerts end on their own, at most three resends later).
MAX_CLOSING = 10_000
# A node's own GPUs named in its alert's description, at most.
GPUS_DESCRIBED = 8

Incident = Mapping[str, Any]
# What decides that an incident is sent again before its resend interval is over.
Key = tuple[object, ...]


def rfc3339(t: float) -> str:
    """A Unix time as Alertmanager reads it: "2026-11-29T08:03:32.000Z"."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def incident_key(incident: Incident) -> Key:
    root = incident.get("root")
    nodes = incident.get("nodes") or {}
    return (
        incident.get("state"),
        incident.get("last_time"),
        tuple(root.items()) if isinstance(root, Mapping) else None,
        tuple(nodes.items()),
    )


def nvlink_domain(domain: str) -> str:
    """ "nvlink:<cluster_uuid>/<clique_id>" -> "<cluster_uuid>/<clique_id>"; else ""."""
    return domain.removeprefix("nvlink:") if domain.startswith("nvlink:") else ""


def _gpu(member: Mapping[str, Any]) -> str:
    index = member.get("index")
    return f"GPU {index}" if index is not None else f"GPU {member.get('gpu') or '?'}"


def root_text(root: Mapping[str, Any]) -> str:
    """ "Xid 149 on n03 GPU 2"."""
    xid = root.get("xid")
    event = f"Xid {xid}" if xid is not None else "an event"
    return f"{event} on {root.get('node', '?')} {_gpu(root)}"


def members_by_node(incident: Incident) -> dict[str, list[Mapping[str, Any]]]:
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for member in incident.get("members") or ():
        by_node.setdefault(str(member.get("node", "")), []).append(member)
    return by_node


def _here(mine: list[Mapping[str, Any]]) -> str:
    """A node's own GPUs in the incident: " Here: GPU 0 Xid 74 (3 times), GPU 1 Xid 74."."""
    if not mine:
        return ""
    parts = []
    for member in mine[:GPUS_DESCRIBED]:
        text = _gpu(member)
        if member.get("xid") is not None:
            text += f" Xid {member['xid']}"
        count = member.get("count") or 1
        if count > 1:
            text += f" ({count} times)"
        parts.append(text)
    if len(mine) > GPUS_DESCRIBED:
        parts.append(f"{len(mine) - GPUS_DESCRIBED} more")
    return " Here: " + ", ".join(parts) + "."


def description(incident: Incident, role: str, mine: list[Mapping[str, Any]] | None = None) -> str:
    """The alert's description for a node of ``role`` whose GPUs in it are ``mine``."""
    members, nodes = len(incident.get("members") or ()), len(incident.get("nodes") or {})
    ident = incident.get("id", "")
    size = f"incident {ident}: {members} GPUs on {nodes} nodes"
    root = incident.get("root")
    if not isinstance(root, Mapping):
        text = f"root unknown: {incident.get('domain', '')} as a whole ({size})"
    elif role == "root":
        link = root.get("link")
        on_link = f", NVLink link {link}" if link is not None else ""
        text = f"root: {root_text(root)}{on_link} ({size})"
    elif role == "consequence":
        text = f"consequence of {root_text(root)} ({size})"
    else:
        text = f"its own events, not a consequence of {root_text(root)} ({size})"
    return text + "." + _here(mine or [])


def runbook(incident: Incident) -> tuple[str, str]:
    """The runbook annotation, and the docs page it is on (relative to docs/)."""
    if not isinstance(incident.get("root"), Mapping):
        return DOMAIN_RUNBOOK_TEXT, DOMAIN_RUNBOOK
    if str(incident.get("domain", "")).startswith("nvlink:"):
        return NVLINK_RUNBOOK, NVLINK_RUNBOOK
    return XID_RUNBOOK, XID_RUNBOOK


class IncidentPusher:
    """Pushes fleet incidents to Alertmanager; ``push`` is called with every incident the
    aggregator holds (open, and closed ones it still shows), as often as it likes."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        clock: Callable[[], float],
        resend_seconds: float = 60.0,
        generator_url: str = "",
        runbook_base_url: str = "",
    ) -> None:
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.clock = clock
        self.resend_seconds = resend_seconds
        # The console (its base URL): each alert links to its node's page there.
        self.generator_url = generator_url.rstrip("/")
        self.runbook_base_url = runbook_base_url
        # Pushes refused, by reason ("unreachable", "bad_answer"), and the last one's
        # detail while they fail (empty: the last push went through).
        self.failures: Counter[str] = Counter()
        self.error = ""
        self.pushed_at: float | None = None
        # Open incidents: id -> its key when last accepted, and when (-inf: not yet).
        self._sent: dict[str, tuple[Key, float]] = {}
        # Closed incidents pushed open and not yet pushed closed, oldest first.
        self._closing: dict[str, Incident] = {}

    def alerts(self, incident: Incident, now: float) -> list[dict[str, Any]]:
        """The incident's postable alerts, one per node."""
        domain = str(incident.get("domain", ""))
        closed = incident.get("state") == "closed"
        known_root = isinstance(incident.get("root"), Mapping)
        starts = float(incident.get("first_time") or now)
        if closed:
            ends = max(float(incident.get("closed_at") or incident.get("last_time") or now), starts)
        else:
            ends = now + self.resend_seconds * ENDS_AFTER_RESENDS
        starts_at, ends_at = rfc3339(starts), rfc3339(ends)
        notes = {"summary": str(incident.get("summary", ""))}
        notes["runbook"], page = runbook(incident)
        if self.runbook_base_url:
            notes["runbook_url"] = self.runbook_base_url + page
        cluster = str(incident.get("cluster", ""))
        mine = members_by_node(incident)
        out = []
        for node, role in (incident.get("nodes") or {}).items():
            critical = role == "root" or not known_root
            labels = {
                "alertname": ALERTNAME,
                "incident": str(incident.get("id", "")),
                "nvlink_domain": nvlink_domain(domain),
                "domain": domain,
                "role": str(role),
                "node": str(node),
                "cluster": cluster,
                "severity": "critical" if critical else "warning",
            }
            alert: dict[str, Any] = {
                # An empty label is no label to Alertmanager (nvlink_domain outside NVLink).
                "labels": {name: value for name, value in labels.items() if value},
                "annotations": {
                    **notes,
                    "description": description(incident, role, mine.get(node)),
                },
                "startsAt": starts_at,
                "endsAt": ends_at,
            }
            if self.generator_url:
                alert["generatorURL"] = (
                    f"{self.generator_url}/#node/{quote(cluster, safe='')}/{quote(node, safe='')}"
                )
            out.append(alert)
        return out

    async def push(self, session: aiohttp.ClientSession, incidents: Iterable[Incident]) -> None:
        """Posts what is due of ``incidents`` in one request, never raising for
        Alertmanager. ``incidents``: every open incident, and each closed one at least once
        (it is held until pushed closed); an open incident not among them is forgotten."""
        now = self.clock()
        due = self._select(incidents, now)
        closing = list(self._closing.items())
        if not due and not closing:
            return
        sending = [incident for _, incident in due] + [incident for _, incident in closing]
        # Thousands of alerts are megabytes of JSON: built and written in a worker thread
        # (the incidents are the caller's snapshots, not changed while it runs).
        alerts, body = await asyncio.to_thread(self._encode, sending, now)
        if alerts and not await self._post(session, body):
            return
        for ident, incident in due:
            if ident in self._sent:
                self._sent[ident] = (incident_key(incident), now)
        for ident, incident in closing:
            if self._closing.get(ident) is incident:
                del self._closing[ident]

    def _select(self, incidents: Iterable[Incident], now: float) -> list[tuple[str, Incident]]:
        """The open incidents due now; closed ones to push are put in ``_closing``."""
        given: set[str] = set()
        due: list[tuple[str, Incident]] = []
        for incident in incidents:
            ident = str(incident["id"])
            given.add(ident)
            if incident.get("state") == "closed":
                # Pushed open (or closed and not yet through): it is resolved once more.
                if self._sent.pop(ident, None) is not None or ident in self._closing:
                    self._closing[ident] = incident
            elif self._due(ident, incident, now):
                due.append((ident, incident))
        for gone in self._sent.keys() - given:
            del self._sent[gone]
        while len(self._closing) > MAX_CLOSING:  # a long outage: they end on their own
            del self._closing[next(iter(self._closing))]
        return due

    async def run(self, incidents: Callable[[], Iterable[Incident]], *, interval: float) -> None:
        """Pushes ``incidents()`` every ``interval`` seconds; runs until cancelled."""
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            while True:
                await self.push(session, incidents())
                await asyncio.sleep(interval)

    def _due(self, ident: str, incident: Incident, now: float) -> bool:
        """Whether the open incident is to be pushed now (held from now on if so)."""
        sent = self._sent.get(ident)
        if sent is None:
            self._closing.pop(ident, None)  # closed, and open again
            self._sent[ident] = (incident_key(incident), -math.inf)
            return True
        return sent[0] != incident_key(incident) or now - sent[1] >= self.resend_seconds

    @property
    def pending(self) -> int:
        """Incidents held: open, or closed and not yet pushed closed."""
        return len(self._sent) + len(self._closing)

    def _encode(self, incidents: list[Incident], now: float) -> tuple[int, bytes]:
        """The number of alerts of ``incidents``, and the request's body."""
        alerts = [alert for incident in incidents for alert in self.alerts(incident, now)]
        # One alert at a time: a single dumps of megabytes would hold the GIL, and the
        # event loop, for all of it.
        return len(alerts), b"[" + b",".join(json.dumps(a).encode() for a in alerts) + b"]"

    async def _post(self, session: aiohttp.ClientSession, body: bytes) -> bool:
        try:
            async with session.post(
                self.url, data=io.BytesIO(body), headers=JSON, timeout=self.timeout
            ) as answer:
                if not 200 <= answer.status < 300:
                    said = (await answer.content.read(300)).decode(errors="replace").strip()
                    self._failed("bad_answer", f"HTTP {answer.status}: {said}")
                    return False
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._failed("unreachable", str(exc) or type(exc).__name__)
            return False
        if self.error:
            log.info("alertmanager: %s takes fleet incidents again", self.url)
        self.error = ""
        self.pushed_at = self.clock()
        return True

    def _failed(self, reason: str, detail: str) -> None:
        self.failures[reason] += 1
        if not self.error:  # once per outage, not once per push
            log.warning(
                "alertmanager: cannot push fleet incidents to %s: %s; they are pushed "
                "again with the next push",
                self.url,
                detail,
            )
        self.error = detail
