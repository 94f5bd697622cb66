"""One MQTT message in: checked, de-duplicated, applied to the fleet state and queued for
the store; what must go back to the node (a cordon decision, the acknowledgement that lets
its spool drop a message) is returned, not sent, so this stays free of MQTT and easy to
test. The consumer sends it once the rows are written.

Anything a node could get wrong is rejected and counted by reason, never raised: a
broken or hostile node must not be able to stop the aggregator.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpuagent.aggregator import decisions, facts, fleetrules
from gpuagent.aggregator.budget import BudgetDecision, CordonBudget
from gpuagent.aggregator.correlate import Correlator
from gpuagent.aggregator.fleetincident import Verdict
from gpuagent.aggregator.history import HistoryRecorder
from gpuagent.aggregator.records import from_online_state, with_offline
from gpuagent.aggregator.state import FleetState
from gpuagent.aggregator.store import CordonRow, FleetStore, row_key
from gpuagent.fleet import schema
from gpuagent.fleet.topics import NodeTopics, ParsedTopic, TopicError, parse_topic

log = logging.getLogger(__name__)
audit = logging.getLogger("gpuagent.aggregator.audit")

# Which message types each node channel may carry.
CHANNEL_TYPES: Final[dict[str, frozenset[str]]] = {
    "state": frozenset({"state"}),
    "events": frozenset({"event"}),
    "actions": frozenset({"action", "cordon_request"}),
    "replies": frozenset({"reply"}),
}
# What nodes spool until we acknowledge storing it (state reports and cordon requests are
# not spooled).
_SPOOLED: Final = frozenset({"event", "action", "reply"})
# Decisions remembered to answer a re-sent cordon request the same way.
_DECISIONS_KEPT = 10_000


@dataclass(frozen=True, slots=True)
class Outgoing:
    topic: str
    payload: bytes
    # The key of the cordons row this decision is stored as: it is sent only once that
    # row is committed, so a crash cannot forget an approval a node already acted on.
    record: str | None = None
    # Instead of a payload: the id of a spooled message to acknowledge to the node on
    # ``topic``; the consumer sends a node's acknowledgements of one commit together.
    acknowledges: str | None = None
    # A cordon request decided in the shared database: its decision is only known once
    # the batch is written; the payload is empty until then, and stays empty if the
    # decision could not be stored.
    deferred: Deferred | None = None

    def body(self) -> bytes | None:
        """What to send: the payload, or a deferred decision's (None: nothing)."""
        return self.payload if self.deferred is None else self.deferred.payload


@dataclass
class Deferred:
    payload: bytes | None = None


@dataclass(frozen=True, slots=True)
class HeldRequest:
    """A cordon request waiting for its NVLink domain's records to settle."""

    until: float
    message: dict[str, Any]
    key: str


class Ingest:
    def __init__(
        self,
        state: FleetState,
        store: FleetStore,
        budget: CordonBudget,
        prefix: str,
        *,
        stale_after: float,
        clock: Callable[[], float] = time.time,
        history_interval: float = 300.0,
        correlator: Correlator | None = None,
        rules: fleetrules.FleetRules | None = None,
    ) -> None:
        self.state = state
        self.store = store
        self.history = HistoryRecorder(history_interval)
        self.budget = budget
        self.prefix = prefix
        self.stale_after = stale_after
        self.clock = clock
        self._logged_reasons: set[str] = set()
        self._decisions: OrderedDict[str, bytes] = OrderedDict()
        # Fleet incidents (None: correlation off), and the cordon requests waiting on them.
        self.correlator = correlator
        self.held: list[HeldRequest] = []
        # Fleet rules (None: off), and the facts stored for them, once committed.
        self.rules = rules
        self.facts: list[facts.Fact] = []

    def reject(self, reason: schema.RejectReason, topic: str, detail: str) -> None:
        self.state.counters.rejected[reason] += 1
        # Once per reason: a misbehaving node repeats itself thousands of times.
        if reason not in self._logged_reasons:
            self._logged_reasons.add(reason)
            log.warning(
                "rejected a message on %s (%s): %s; further %r rejections are only counted "
                "(gpuagent_fleet_messages_rejected_total)",
                topic,
                reason,
                detail,
                reason,
            )

    def _check(self, topic: str, payload: bytes) -> tuple[ParsedTopic, dict[str, Any]] | None:
        try:
            where = parse_topic(self.prefix, topic)
        except TopicError as exc:
            self.reject("invalid", topic, str(exc))
            return None
        try:
            message = schema.decode(payload)
        except schema.PayloadError as exc:
            self.reject(exc.reason, topic, exc.detail)
            return None
        if message["node"] != where.node or message["cluster"] != where.cluster:
            self.reject(
                "foreign",
                topic,
                f"envelope names {message['cluster']}/{message['node']}, "
                f"topic {where.cluster}/{where.node}",
            )
            return None
        if message["type"] not in CHANNEL_TYPES.get(where.channel, frozenset()):
            self.reject("invalid", topic, f"type {message['type']!r} on {where.channel!r}")
            return None
        return where, message

    def handle(self, topic: str, payload: bytes) -> list[Outgoing]:
        checked = self._check(topic, payload)
        if checked is None:
            return []
        _, message = checked
        kind: str = message["type"]
        counters = self.state.counters
        counters.received[kind] += 1
        # State reports are not de-duplicated by id: they are idempotent, ordered by time
        # instead, and their ids repeat by design ("<node>:offline" each time the node goes
        # away; sequence numbers start over when an agent restarts).
        key = row_key(message["cluster"], message["node"], message["id"])
        if kind != "state" and self.state.seen.seen(key):
            counters.duplicates[kind] += 1
            # The node did not get our answer (or re-sent before it came): same answer.
            previous = self._decisions.get(key)
            if previous is not None:
                return [Outgoing(self._cmd_topic(message), previous, record=key)]
            return self._ack(message)
        raw = _text(payload, message)
        if kind == "state":
            self._state(message, raw)
        elif kind == "event":
            self._event(message, raw)
        elif kind == "action":
            self.store.queue_action(message, raw)
            if self.rules is not None and not self._maintained(message["cluster"], message["node"]):
                record = self.state.nodes.get((message["cluster"], message["node"]))
                self._facts([facts.action_fact(message, record)])
        elif kind == "reply":
            self.state.add_reply(message["cluster"], message["node"], message)
            self.store.queue_reply(message, raw)
        elif kind == "cordon_request":
            return self._cordon_request(topic, message, key)
        return self._ack(message)

    def _maintained(self, cluster: str, node: str) -> bool:
        """Whether planned maintenance covers the node now: what it reports is shown and
        stored, but opens no incident and feeds no rule."""
        record = self.state.nodes.get((cluster, node))
        return self.state.maintenance.covering(record, self.clock()) is not None

    def _event(self, message: dict[str, Any], raw: str) -> None:
        self.state.counters.events[message["category"]] += 1
        self.store.queue_event(message, raw)
        if message["category"] != "kernel":
            return
        cluster, node = message["cluster"], message["node"]
        if self._maintained(cluster, node):
            self.state.counters.muted_records += 1
            return
        if self.correlator is not None:
            self.correlator.observe_record(cluster, node, message["data"], self.clock())
        if self.rules is not None:
            record = self.state.nodes.get((cluster, node))
            self._facts([facts.kernel_fact(message, record, self.clock())])

    def _cordon_request(self, topic: str, message: dict[str, Any], key: str) -> list[Outgoing]:
        if not self.store.shared and not self.budget.config.arbiter:
            self._not_arbiter(topic)
            return []
        age = self.clock() - float(message["time"])
        if message["action"] == "cordon" and age > self.budget.config.max_request_age_seconds:
            return [self._too_old(message, key, age)]
        record = self.state.nodes.get((message["cluster"], message["node"]))
        window = self.state.maintenance.covering(record, self.clock())
        if window is not None and message["action"] == "cordon":
            # Muted, not decided by the budget: a reboot's faults are not the node's.
            verdict = Verdict(deny=True, reason=f"muted: {window.describe()}")
            return [self._cordon(message, key, verdict)]
        correlator = self.correlator
        if correlator is not None and message["action"] == "cordon":
            correlator.observe_fault(message["cluster"], message["node"], self.clock())
            until = correlator.hold_until(message["cluster"], message["node"], self.clock())
            if until is not None:
                self.held.append(HeldRequest(until, message, key))
                self.state.counters.cordons_held += 1
                audit.info(
                    "cordon request held: cluster=%s node=%s request=%s until=%.1f "
                    "(its NVLink domain's records settle first)",
                    message["cluster"],
                    message["node"],
                    message["id"],
                    until,
                )
                return []
        return [self._decide_request(message, key)]

    def _too_old(self, message: dict[str, Any], key: str, age: float) -> Outgoing:
        """A request from long ago (a backlog the broker kept): dropped, not decided, and
        never counted in the budget; the answer says so, in case the node still waits."""
        self.state.counters.cordons_too_old += 1
        limit = self.budget.config.max_request_age_seconds
        reason = (
            f"dropped: the request is {age:.0f} s old (aggregator.cordon_budget."
            f"max_request_age_seconds = {limit:g}); ask again if it is still needed"
        )
        return self._cordon(message, key, Verdict(deny=True, reason=reason))

    def release_held(self, now: float) -> list[Outgoing]:
        """Decide the held cordon requests whose settle time has come."""
        due = [h for h in self.held if h.until <= now]
        if not due:
            return []
        self.held = [h for h in self.held if h.until > now]
        return [self._decide_request(h.message, h.key) for h in due]

    def _decide_request(self, message: dict[str, Any], key: str) -> Outgoing:
        verdict = Verdict(deny=False, reason="")
        if self.correlator is not None and message["action"] == "cordon":
            verdict = self.correlator.verdict(message["cluster"], message["node"], self.clock())
        if verdict.deny:
            return self._cordon(message, key, verdict)
        if self.store.shared:
            return self._cordon_in_database(message, key, verdict)
        return self._cordon(message, key, verdict)

    def _ack(self, message: dict[str, Any]) -> list[Outgoing]:
        """The node keeps a spooled message (an event, action record or reply) until we say
        it is stored; sent once the rows it brought are committed."""
        if message["type"] not in _SPOOLED:
            return []
        return [Outgoing(self._cmd_topic(message), b"", acknowledges=message["id"])]

    def _not_arbiter(self, topic: str) -> None:
        # Cordon requests are the arbiter's alone (it answers this one too); only a
        # subscription an earlier configuration left in the broker brings one here.
        if "not_arbiter" not in self._logged_reasons:
            self._logged_reasons.add("not_arbiter")
            log.warning(
                "a cordon request on %s reached an aggregator that is not the cordon arbiter "
                "(aggregator.cordon_budget.arbiter = false): left to the arbiter",
                topic,
            )

    def _state(self, message: dict[str, Any], raw: str) -> None:
        now = self.clock()
        key = (message["cluster"], message["node"])
        previous = self.state.nodes.get(key)
        if message["online"]:
            record = from_online_state(message, raw, now)
            if self.correlator is not None:
                self.correlator.observe_state(key[0], key[1], record)
            # A late copy of an older report (a retained message re-read, a redelivery)
            # must not roll the node back, nor bring an offline node back online.
            if previous is not None and (
                record.last_seen < previous.last_seen
                or (not previous.online and record.last_seen <= previous.last_seen)
            ):
                return
            self.store.queue_history(self.history.rows(previous, record, message["status"]))
            window = self.state.maintenance.covering(record, now)
            if self.rules is not None and window is None:
                self._facts(facts.state_facts(previous, record))
        else:
            record = with_offline(message, previous, now)
            self.store.queue_history(self.history.offline(previous, record))
        self.store.queue_node(record, stale=record.is_stale(now, self.stale_after))
        # The document goes to the database only: a node's page reads it from there, and
        # a fleet of 100,000 reports of 10-50 KB is not kept in memory twice.
        self.state.put(dataclasses.replace(record, document="") if record.document else record)

    def _facts(self, found: Sequence[facts.Fact | None]) -> None:
        """Store facts for the fleet rules; they are judged once committed (a rule reads
        the facts before them from the database)."""
        kept = [f for f in found if f is not None]
        if not kept:
            return
        self.store.queue_facts(kept)
        self.store.after_write(lambda: self.facts.extend(kept))

    def _cmd_topic(self, message: dict[str, Any]) -> str:
        return NodeTopics(self.prefix, message["cluster"], message["node"]).topic("cmd")

    def _cordon(self, message: dict[str, Any], key: str, verdict: Verdict) -> Outgoing:
        """Decided here: denied by the fleet incident, planned maintenance or the request's
        age, or by the budget in memory (SQLite: one aggregator decides)."""
        now = self.clock()
        cluster, node, action = message["cluster"], message["node"], message["action"]
        if verdict.deny:
            result = BudgetDecision("denied", verdict.reason)
        else:
            known = self.state.cluster_size(cluster)
            known += 0 if (cluster, node) in self.state.nodes else 1
            result = _with_verdict(self.budget.decide(cluster, node, action, known, now), verdict)
        self._note_decision(message, verdict, result)
        row = CordonRow(
            request_id=message["id"],
            cluster=cluster,
            node=node,
            action=action,
            decision=result.decision,
            time=now,
            reason=result.reason,
            retry_after_seconds=result.retry_after_seconds,
        )
        self.store.queue_cordon(row)
        payload = self._decided(message, key, result)
        return Outgoing(self._cmd_topic(message), payload, record=key)

    def _note_decision(
        self, message: dict[str, Any], verdict: Verdict, result: BudgetDecision
    ) -> None:
        if self.correlator is not None and verdict.incidents:
            self.correlator.decided(
                message["cluster"],
                message["node"],
                verdict.incidents,
                approved=result.decision == "approved",
            )

    def _cordon_in_database(self, message: dict[str, Any], key: str, verdict: Verdict) -> Outgoing:
        """Decided in the shared database with the next batch (`decisions`): any
        aggregator may take the request, and all of them share one budget."""
        request = decisions.CordonRequest(
            key,
            message["cluster"],
            message["node"],
            message["action"],
            self.clock(),
            note=verdict.reason,
        )
        deferred = Deferred()

        def decided() -> None:
            done = request.decided
            if done is None:
                return  # refused by the database: the node asks again later
            if done.decision == "approved":
                # The budget in memory only feeds the metrics here; the database decides.
                decisions.replay(
                    self.budget, [(request.cluster, request.node, done.action, done.time)]
                )
            result = BudgetDecision(done.decision, done.reason, done.retry_after_seconds)
            self._note_decision(message, verdict, result)
            deferred.payload = self._decided(message, key, result)

        self.store.queue_request(request)
        self.store.after_write(decided)
        return Outgoing(self._cmd_topic(message), b"", record=key, deferred=deferred)

    def _decided(self, message: dict[str, Any], key: str, result: BudgetDecision) -> bytes:
        """Count, audit and encode a decision; remember it to answer a re-sent request."""
        cluster, node = message["cluster"], message["node"]
        self.state.counters.decisions[(cluster, result.decision)] += 1
        audit.info(
            "cordon decision: cluster=%s node=%s action=%s request=%s decision=%s reason=%s%s",
            cluster,
            node,
            message["action"],
            message["id"],
            result.decision,
            result.reason,
            ""
            if result.retry_after_seconds is None
            else f" retry_after={result.retry_after_seconds:.0f}s",
        )
        payload = schema.encode(
            schema.cordon_decision_message(
                node,
                cluster,
                message["id"],
                decision=result.decision,
                reason=result.reason,
                retry_after_seconds=result.retry_after_seconds,
            )
        )
        self._decisions[key] = payload
        if len(self._decisions) > _DECISIONS_KEPT:
            self._decisions.popitem(last=False)
        return payload


def _with_verdict(result: BudgetDecision, verdict: Verdict) -> BudgetDecision:
    """The budget's decision, saying which fleet incident it was made for."""
    return dataclasses.replace(result, reason=decisions.with_note(result.reason, verdict.reason))


def _text(payload: bytes, message: dict[str, Any]) -> str:
    """The payload as text to store; JSON in another encoding than UTF-8 is re-encoded."""
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return json.dumps(message)
