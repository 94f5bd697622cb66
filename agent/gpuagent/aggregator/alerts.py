"""Each node's alerts, as Alertmanager has them: what is firing for it and what somebody
silenced, for the fleet table and the node and GPU pages.

The aggregator reads Alertmanager's v2 API (`GET /api/v2/alerts`) every
``interval_seconds``: one request for the whole fleet, whatever its size. The answer is
parsed and indexed by node in a worker thread (a fleet in an alert storm answers with tens
of megabytes), and the index replaced in one step on the event loop. An alert belongs to
the node its first ``node_labels`` label names ("instance" by its host part, without the
port); an alert with a ``cluster`` label belongs only to that cluster's node. When
Alertmanager cannot be read, the last index is kept and the status says since when it is
old: the page never shows "no alerts" for "could not ask".
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp

from gpuagent.aggregator.records import NodeRecord
from gpuagent.config.schema.aggregator import AlertmanagerSection

log = logging.getLogger(__name__)

# Alertmanager's state of an alert, and what the page calls it.
STATES = {"active": "firing", "suppressed": "silenced", "unprocessed": "firing"}
# An answer larger than this is refused rather than held in memory (about 100,000 alerts).
MAX_ANSWER_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str
    # "firing", or "silenced" (a silence or an inhibition holds its notifications back).
    state: str
    since: float | None
    summary: str
    # The GPU it names (its "gpu" label: the index), or "" for the whole node.
    gpu: str
    cluster: str

    def json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "severity": self.severity,
            "state": self.state,
            "since": self.since,
            "summary": self.summary,
            "gpu": self.gpu,
        }


class BadAnswerError(ValueError):
    """Alertmanager's answer is not a list of alerts."""


def _host(value: str) -> str:
    """The host part of an "instance" label: "gpu-node-1:19400" -> "gpu-node-1"."""
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def node_of(labels: dict[str, Any], node_labels: Iterable[str]) -> str:
    """The node an alert is about: its first label of ``node_labels`` that is set."""
    for name in node_labels:
        value = str(labels.get(name) or "")
        if value:
            return _host(value) if name == "instance" else value
    return ""


def _time(text: object) -> float | None:
    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None


def _alert(item: object) -> Alert | None:
    if not isinstance(item, dict):
        return None
    labels, annotations, status = item.get("labels"), item.get("annotations"), item.get("status")
    if not isinstance(labels, dict) or not isinstance(status, dict):
        return None
    notes = annotations if isinstance(annotations, dict) else {}
    suppressed = status.get("silencedBy") or status.get("inhibitedBy")
    state = STATES.get(str(status.get("state")), "firing")
    return Alert(
        name=str(labels.get("alertname", "")),
        severity=str(labels.get("severity", "")),
        state="silenced" if suppressed else state,
        since=_time(item.get("startsAt")),
        summary=str(notes.get("summary", "")),
        gpu=str(labels.get("gpu", "")),
        cluster=str(labels.get("cluster", "")),
    )


def index_alerts(
    body: bytes | bytearray, node_labels: tuple[str, ...]
) -> tuple[dict[str, list[Alert]], int, int]:
    """Alertmanager's answer by node name, firing first then by name; with the number of
    alerts that name no node and of entries that are not alerts. Raises BadAnswerError if
    the answer is not a JSON list."""
    try:
        items = json.loads(body)
    except ValueError as exc:
        raise BadAnswerError(f"not JSON: {exc}") from None
    if not isinstance(items, list):
        raise BadAnswerError(f"a JSON {type(items).__name__}, not a list of alerts")
    by_node: dict[str, list[Alert]] = {}
    nameless = malformed = 0
    for item in items:
        alert = _alert(item)
        if alert is None:
            malformed += 1
            continue
        node = node_of(item["labels"], node_labels)
        if not node:
            nameless += 1
            continue
        by_node.setdefault(node, []).append(alert)
    for alerts in by_node.values():
        alerts.sort(key=lambda a: (a.state != "firing", a.name, a.gpu))
    return by_node, nameless, malformed


async def read_body(answer: aiohttp.ClientResponse, limit: int) -> bytearray:
    """The whole body of ``answer``, however it arrives (chunked, slowly, in many small
    reads); BadAnswerError once it is larger than ``limit`` bytes, without reading on."""
    size = answer.content_length
    if size is not None and size > limit:
        raise BadAnswerError(f"answer larger than {limit} bytes")
    body = bytearray()
    async for chunk in answer.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise BadAnswerError(f"answer larger than {limit} bytes")
    return body


@dataclass
class FleetAlerts:
    """The last alert index and how it was got; the API and page read it."""

    configured: bool = False
    by_node: dict[str, list[Alert]] = field(default_factory=dict)
    # When Alertmanager last answered, and what went wrong since (empty: nothing).
    checked_at: float | None = None
    error: str = ""
    # Alerts in the last answer with no node label, and answers refused, by reason.
    nameless: int = 0
    failures: Counter[str] = field(default_factory=Counter)

    def _of(self, record: NodeRecord) -> list[Alert]:
        alerts = self.by_node.get(record.node, ())
        return [a for a in alerts if not a.cluster or a.cluster == record.cluster]

    def for_node(self, record: NodeRecord) -> list[dict[str, Any]]:
        return [a.json() for a in self._of(record)]

    def weight(self, record: NodeRecord) -> tuple[int, int]:
        """Sorts the node with the most firing, then silenced, alerts first."""
        alerts = self._of(record)
        firing = sum(a.state == "firing" for a in alerts)
        return -firing, firing - len(alerts)

    def status(self) -> dict[str, Any]:
        return {
            "configured": self.configured,
            "checked_at": self.checked_at,
            "error": self.error,
            "alerts": sum(len(a) for a in self.by_node.values()),
            "without_node": self.nameless,
        }


class AlertmanagerReader:
    """Reads Alertmanager into ``alerts`` every interval; runs until cancelled."""

    def __init__(
        self,
        config: AlertmanagerSection,
        alerts: FleetAlerts,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.alerts = alerts
        self.clock = clock
        self._url = config.url.rstrip("/") + "/api/v2/alerts"
        self._params = [("active", "true"), ("silenced", "true"), ("inhibited", "true")]
        self._params += [("filter", m) for m in config.matchers]

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_seconds)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await self.read_once(session)
                await asyncio.sleep(self.config.interval_seconds)

    async def read_once(self, session: aiohttp.ClientSession) -> None:
        try:
            async with session.get(self._url, params=self._params) as answer:
                if answer.status != 200:
                    raise BadAnswerError(f"HTTP {answer.status}")  # noqa: TRY301
                body = await read_body(answer, MAX_ANSWER_BYTES)
            labels = tuple(self.config.node_labels)
            by_node, nameless, malformed = await asyncio.to_thread(index_alerts, body, labels)
        except BadAnswerError as exc:
            self._failed("bad_answer", str(exc))
            return
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._failed("unreachable", str(exc) or type(exc).__name__)
            return
        if self.alerts.error:
            log.info("alertmanager: %s answers again", self.config.url)
        if malformed:
            self.alerts.failures["malformed_alert"] += malformed
        self.alerts.by_node = by_node
        self.alerts.nameless = nameless
        self.alerts.checked_at = self.clock()
        self.alerts.error = ""

    def _failed(self, reason: str, detail: str) -> None:
        self.alerts.failures[reason] += 1
        if not self.alerts.error:  # once per outage, not once per interval
            log.warning(
                "alertmanager: cannot read %s: %s; the page shows the alerts of %s",
                self._url,
                detail,
                "the last answer" if self.alerts.checked_at else "nothing yet",
            )
        self.alerts.error = detail
