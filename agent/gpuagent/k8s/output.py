"""The Kubernetes output: GPU health as the Node's conditions, and what happens once as
events on it (`[outputs.kubernetes]`, docs/kubernetes.md).

One task writes both, off the event loop (the client is synchronous), one request at a
time. Conditions: the first snapshot after start writes them all (so a condition left
from before a restart is cleared by what the agent sees now); after that one strategic
merge patch of the Node's status per change of what they say, at most one per
`min_interval_seconds`, and all of them again every `heartbeat_seconds`. The patch names
only our condition types: the API server merges conditions by type, so the kubelet's and
others' stay as they are. Events: created under a rate limit, counted on (``series``) as
their incident grows. A failed request is retried with backoff; the API server being away
loses the events of that time (counted), never a condition's latest state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from gpuagent.config import Config
from gpuagent.k8s.client import (
    ApiError,
    KubernetesConfigError,
    NodeApi,
    kubernetes_node_name,
    load_api_client,
    retried,
)
from gpuagent.k8s.conditions import Condition, node_conditions
from gpuagent.k8s.events import (
    NodeEvent,
    action_event,
    availability_event,
    event_body,
    event_name,
    kernel_event,
    series_patch,
)
from gpuagent.model import GpuEvent, NodeSnapshot, Severity
from gpuagent.supervisor import SourceTracker

if TYPE_CHECKING:
    from gpuagent.incidents import Incident
    from gpuagent.remediation.audit import AuditRecord

log = logging.getLogger("gpuagent.kubernetes")
T = TypeVar("T")

# Events waiting to be created at most; past it new ones are dropped (and counted).
MAX_PENDING_EVENTS = 256
# Events remembered as created (so an incident's growth is counted on its event).
MAX_KNOWN_EVENTS = 4096
_MAX_BACKOFF_SECONDS = 60.0


class KubernetesOutput:
    def __init__(self, config: Config, tracker: SourceTracker) -> None:
        self._config = config.outputs.kubernetes
        self.node = self._config.node_name or kubernetes_node_name(config)
        self._kubeconfig = (
            self._config.kubeconfig or config.remediation.cordon.kubernetes.kubeconfig
        )
        self._tracker = tracker
        self._api: NodeApi | None = None
        self._snapshot: NodeSnapshot | None = None
        # Our conditions as they are on the Node (None until the Node has been read).
        self._on_node: dict[str, dict[str, Any]] | None = None
        self._node_uid = ""
        self._written: dict[str, tuple[object, ...]] = {}  # type -> the key last written
        self._written_at = -math.inf
        self._all_written_at = -math.inf
        self._lost: dict[str, bool] | None = None  # per GPU: lost at its last known state
        self._pending: deque[NodeEvent] = deque()
        self._series: dict[str, tuple[int, float]] = {}  # event key -> (count, last seen)
        self._known: OrderedDict[str, None] = OrderedDict()  # keys of events that exist
        self._tokens = float(self._config.events_per_minute)
        self._tokens_at = time.monotonic()
        self._failures = 0
        self._answered = False  # some request of this round got its answer
        self.dropped_events = 0
        self._wake = asyncio.Event()

    # --- what the daemon hands over (on the event loop; never blocks) -------------------

    def offer_snapshot(self, snapshot: NodeSnapshot) -> None:
        self._note_availability(snapshot)
        self._snapshot = snapshot
        self._wake.set()

    def offer_event(self, event: GpuEvent) -> None:
        made = kernel_event(event)
        if made is not None:
            self._offer(made)

    def offer_incident(self, incident: Incident) -> None:
        if self._config.events and kernel_event(incident.first) is not None:
            self._series[incident.id] = (incident.count, incident.last.time)
            self._wake.set()

    def audit_written(self, record: AuditRecord) -> None:
        made = action_event(record)
        if made is not None:
            self._offer(made)

    # --- the writer ---------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                self._wake.clear()
                delay = await self._step()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
        finally:
            if self._api is not None:
                self._api.close()
                self._api = None

    async def _step(self) -> float:
        """One round: read the Node if not yet, write conditions if due, send events.
        Returns how long to wait for the next round at most."""
        started = time.monotonic()
        self._answered = False
        try:
            if self._on_node is None:
                await self._read_node()
            delay = await self._write_conditions()
            await self._send_events()
        except ApiError as exc:
            error = str(exc)
        except Exception as exc:  # an output's failure must not stop the daemon
            if not self._failures:
                log.exception("the Kubernetes output failed")
            error = f"{type(exc).__name__}: {exc}"
        else:
            self._failures = 0
            if self._answered:
                self._tracker.success(time.monotonic() - started)
            return delay
        self._failures += 1
        self._tracker.failure(time.monotonic() - started, error)
        return min(_MAX_BACKOFF_SECONDS, 2.0 ** min(self._failures, 6))

    async def _read_node(self) -> None:
        node = await self._request(NodeApi.read_node)
        metadata = node["metadata"]
        self._node_uid = str(metadata.get("uid") or "")
        status = node.get("status")
        conditions = status.get("conditions") if isinstance(status, dict) else None
        self._on_node = {
            str(c["type"]): c
            for c in (conditions if isinstance(conditions, list) else [])
            if isinstance(c, dict) and "type" in c
        }

    async def _write_conditions(self) -> float:
        heartbeat = self._config.heartbeat_seconds
        if self._snapshot is None:
            return heartbeat
        now = time.monotonic()
        wanted = node_conditions(self._snapshot, self._config.summary_condition)
        changed = [c for c in wanted if self._written.get(c.type) != c.key]
        beat = now - self._all_written_at >= heartbeat
        if not changed and not beat:
            return self._all_written_at + heartbeat - now
        wait = self._written_at + self._config.min_interval_seconds - now
        if wait > 0:
            return wait
        sending = list(wanted) if beat else changed
        body = [self._condition_json(c) for c in sending]
        await self._request(partial(NodeApi.patch_conditions, conditions=body))
        assert self._on_node is not None  # read before any write
        for condition, written in zip(sending, body, strict=True):
            before = self._on_node.get(condition.type, {})
            if before.get("status") != condition.status or before.get("reason") != condition.reason:
                log.info(
                    "node condition %s=%s (%s): %s",
                    condition.type,
                    condition.status,
                    condition.reason,
                    condition.message,
                )
            self._on_node[condition.type] = written
            self._written[condition.type] = condition.key
        self._written_at = time.monotonic()
        if beat:
            self._all_written_at = self._written_at
        return heartbeat

    def _condition_json(self, condition: Condition) -> dict[str, str]:
        assert self._on_node is not None
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        before = self._on_node.get(condition.type, {})
        # The transition time moves only when the status does (as the kubelet keeps it).
        transition = before.get("lastTransitionTime")
        if before.get("status") != condition.status or not isinstance(transition, str):
            transition = now
        return {
            "type": condition.type,
            "status": condition.status,
            "reason": condition.reason,
            "message": condition.message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": transition,
        }

    async def _send_events(self) -> None:
        await self._create_events()
        await self._count_on_events()

    async def _create_events(self) -> None:
        while self._pending:
            event = self._pending[0]
            body = event_body(
                event, node=self.node, node_uid=self._node_uid, namespace=self._namespace
            )
            try:
                await self._request(partial(NodeApi.create_event, body=body))
            except ApiError as exc:
                if retried(exc):
                    raise  # kept, for the next try
                if exc.status != 409:  # 409: made before a restart; count on it
                    self._pending.popleft()
                    self._drop(f"{event.reason} not created: {exc}")
                    continue
            self._pending.popleft()
            self._known[event.key] = None
            while len(self._known) > MAX_KNOWN_EVENTS:
                self._known.popitem(last=False)

    async def _count_on_events(self) -> None:
        """An incident's growth, as its event's series (only for events that exist)."""
        for key, (count, last_seen) in list(self._series.items()):
            del self._series[key]
            if key not in self._known:
                continue  # its event was dropped, or is older than this agent
            try:
                name, patch = event_name(self.node, key), series_patch(count, last_seen)
                await self._request(partial(NodeApi.patch_event, name=name, body=patch))
            except ApiError as exc:
                if retried(exc):
                    self._series.setdefault(key, (count, last_seen))
                    raise
                del self._known[key]  # gone (the API keeps events about an hour) or refused

    @property
    def _namespace(self) -> str:
        return self._config.event_namespace

    async def _request(self, call: Callable[[NodeApi], T]) -> T:
        """``call`` on the API, in a worker thread, under the timeout."""
        timeout = self._config.timeout_seconds + 1.0  # the client's, plus the thread's
        try:
            async with asyncio.timeout(timeout):
                answer = await asyncio.to_thread(self._request_sync, call)
        except TimeoutError:
            raise ApiError(0, f"no answer from the Kubernetes API within {timeout:g} s") from None
        self._answered = True
        return answer

    def _request_sync(self, call: Callable[[NodeApi], T]) -> T:
        """In the worker thread: the client too is made there (importing the kubernetes
        package takes a second or more, which the event loop must not wait for)."""
        if self._api is None:
            try:
                client = load_api_client(self._kubeconfig)
            except (KubernetesConfigError, ImportError) as exc:
                raise ApiError(0, str(exc) or "the kubernetes package is not installed") from None
            self._api = NodeApi(client, self.node, self._namespace, self._config.timeout_seconds)
        return call(self._api)

    # --- events -------------------------------------------------------------------------

    def _offer(self, event: NodeEvent) -> None:
        if not self._config.events:
            return
        now = time.monotonic()
        rate = self._config.events_per_minute
        self._tokens = min(rate, self._tokens + (now - self._tokens_at) * rate / 60.0)
        self._tokens_at = now
        if self._tokens < 1.0 or len(self._pending) >= MAX_PENDING_EVENTS:
            self._drop(f"more than {rate} events a minute")
            return
        self._tokens -= 1.0
        self._pending.append(event)
        self._wake.set()

    def _drop(self, why: str) -> None:
        """An event not sent: counted, and logged on the first and every thousandth (the
        agent's own log, status and the fleet have every one)."""
        self.dropped_events += 1
        if self.dropped_events == 1 or self.dropped_events % 1000 == 0:
            log.warning("Kubernetes events dropped: %d so far; now: %s", self.dropped_events, why)

    def _note_availability(self, snapshot: NodeSnapshot) -> None:
        """A GPU whose availability finding turned CRITICAL is lost; back to OK, it is
        back (UNKNOWN in between is neither). The first snapshot only sets the baseline
        (the conditions say the rest)."""
        findings = {
            f.gpu: f
            for f in snapshot.health.findings
            if f.check == "availability" and f.gpu is not None
        }
        known = {
            bus: f.severity is Severity.CRITICAL
            for bus, f in findings.items()
            # The baseline counts every GPU not lost as there; later, UNKNOWN changes nothing.
            if self._lost is None or f.severity in (Severity.CRITICAL, Severity.OK)
        }
        before, self._lost = self._lost, {**(self._lost or {}), **known}
        if before is None:
            return
        for bus, is_lost in known.items():
            if before.get(bus, is_lost) == is_lost:
                continue
            gpu = snapshot.gpu(bus)
            index = gpu.identity.index if gpu is not None else None
            reason = findings[bus].reason or "answers again"
            self._offer(availability_event(bus, index, is_lost, reason, snapshot.taken_at))
