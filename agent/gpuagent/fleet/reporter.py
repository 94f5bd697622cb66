"""The node's MQTT reporter: state, events, action records, cordon requests and replies up
to the aggregator; allowlisted commands down from it.

- ``state`` (retained, QoS 1): published on connect (the birth message), whenever the
  node's health changes, and every ``state_interval_seconds``. The Last Will, and an
  explicit message on clean shutdown, replace it with ``online: false``.
- Everything else goes through the on-disk spool first and leaves it only once the
  aggregator acknowledged storing it (an ``ack`` on ``.../cmd``; with end-to-end acks off,
  the broker's QoS 1 PUBACK), in order, so no outage or crash of the broker, the
  aggregator or this agent loses anything. Kernel-log events already spooled are not
  spooled again when a restarted agent re-reads the kernel's buffer.
- MQTT 5: a publish the broker refuses (its ACL: a node may publish only as itself) comes
  back with a failure reason code; it is counted, logged once, and not retried.
- Commands arrive on ``.../cmd`` and are handled by `fleet.commands.Commands`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import typing
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gpuagent.config import MqttOutput
from gpuagent.diskio import DiskThread
from gpuagent.fleet import schema
from gpuagent.fleet.commands import Commands, CommandTarget
from gpuagent.fleet.connection import (
    Backoff,
    client_options,
    count_disconnects,
    quiet_socket_races,
    settle,
)
from gpuagent.fleet.outbox import Outbox, Pending
from gpuagent.fleet.spool import SpoolError, ThreadedSpool
from gpuagent.fleet.topics import Channel, NodeTopics
from gpuagent.incidents import Incident
from gpuagent.model import GpuEvent, MqttStatus, NodeSnapshot
from gpuagent.remediation.audit import AuditRecord, AuditStore
from gpuagent.remediation.types import CordonRequest
from gpuagent.statusview import finding_json

log = logging.getLogger(__name__)

_SHUTDOWN_PUBLISH_SECONDS = 2.0
_STATE_DEBOUNCE_SECONDS = 0.2
_AUDIT_CURSOR = "audit"
# PUBACK reason codes (MQTT 5) that say "not now" rather than "never": unspecified error,
# implementation specific error (both what an overloaded broker says), packet identifier
# in use, quota exceeded. The others (not authorized, topic name invalid, payload format
# invalid) would fail the same way again.
_TRANSIENT = frozenset((0x80, 0x83, 0x91, 0x97))
_TRANSIENT_RETRY_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """The broker refused a publish: why, and whether trying again later can succeed."""

    reason: str
    transient: bool


def _health_key(snapshot: NodeSnapshot) -> tuple[object, ...]:
    """What makes a state report worth sending before its interval: the findings'
    identities and severities (not their reasons, whose numbers move at every poll), and
    actions."""
    findings = tuple((*f.identity, f.severity.name) for f in snapshot.health.problems())
    status = snapshot.remediation
    remediation = (status.mode, status.paused, status.cordoned_by_us) if status else None
    return (findings, remediation, tuple(g.status for g in snapshot.gpus))


class Reporter:
    def __init__(
        self,
        config: MqttOutput,
        *,
        node: str,
        cluster: str,
        agent_version: str,
        state_dir: Path,
        audit: AuditStore | None = None,
        disk: DiskThread | None = None,
    ) -> None:
        self.config = config
        self.node = node
        self.cluster = cluster
        self.topics = NodeTopics(config.broker.topic_prefix, cluster, node)
        self._version = agent_version
        self._audit = audit
        self._disk = disk or DiskThread()
        self._own_disk = disk is None
        spool = ThreadedSpool(
            state_dir / "mqtt-spool.sqlite",
            self._disk,
            max_bytes=config.spool.max_bytes,
            max_age_seconds=config.spool.max_age_seconds,
        )
        self.outbox = Outbox(spool, resend_after=config.ack_timeout_seconds)
        self._flushing: asyncio.Task[None] | None = None
        self._work = asyncio.Event()
        self._state_changed = asyncio.Event()
        self._snapshot: NodeSnapshot | None = None
        self._health_key: tuple[object, ...] | None = None
        self._severities: dict[tuple[str | None, str], str] = {}
        self._client: aiomqtt.Client | None = None
        self._publish_lock = asyncio.Lock()
        self._refused: Any = None  # the broker's reason code for refusing our publish
        self._decisions: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._commands = Commands(
            config,
            node,
            cluster,
            reply=lambda reply: self._enqueue(reply["id"], "replies", reply),
            acknowledged=self._acknowledged,
            decisions=self._decisions,
        )
        self._shutting_down = False
        self.connected = False
        self.connections = 0
        self.published: Counter[str] = Counter()
        self.acknowledged = 0
        self.disconnects: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    # --- fed by the daemon, on the event loop ------------------------------------------

    def offer_snapshot(self, snapshot: NodeSnapshot) -> None:
        """Every finding that changed severity becomes an event; a health change wakes the
        state report."""
        # A masked finding (a lost GPU's check that cannot read it) changes nothing: its
        # last real severity stands, and the availability finding says what happened.
        masked = {(f.gpu, f.check) for f in snapshot.health.findings if f.masked}
        current = {(f.gpu, f.check): f for f in snapshot.health.findings if not f.masked}
        for key, finding in current.items():
            before = self._severities.get(key, "OK")
            if before != finding.severity.name:
                message = schema.finding_event_message(
                    snapshot, finding.gpu, finding.check, before, finding_json(finding)
                )
                self._enqueue(message["id"], "events", message)
        for (gpu, check), before in self._severities.items():
            if (gpu, check) not in current and (gpu, check) not in masked and before != "OK":
                cleared = {"check": check, "severity": "OK", "reason": "no longer reported"}
                message = schema.finding_event_message(snapshot, gpu, check, before, cleared)
                self._enqueue(message["id"], "events", message)
        kept = {k: v for k, v in self._severities.items() if k in masked}
        self._severities = kept | {k: f.severity.name for k, f in current.items()}
        self._snapshot = snapshot
        health = _health_key(snapshot)
        if health != self._health_key:
            self._health_key = health
            self._state_changed.set()

    def offer_event(self, event: GpuEvent) -> None:
        message = schema.kernel_event_message(self.node, self.cluster, event)
        self._enqueue(message["id"], "events", message)

    def offer_incident(self, incident: Incident) -> None:
        message = schema.incident_message(self.node, self.cluster, incident)
        self._enqueue(message["id"], "events", message)

    def audit_written(self, _record: AuditRecord) -> None:
        """New audit records: copy them to the spool (from the audit trail's own cursor)."""
        self._work.set()

    async def ask_aggregator(
        self, request: CordonRequest, action: str, wait_seconds: float
    ) -> dict[str, Any]:
        """Send a cordon request and wait up to ``wait_seconds`` for the decision.

        Unlike events, a request is not spooled: it is a question for now. One that cannot
        be sent now, or is not answered in time, is void (TimeoutError), and its MQTT
        expiry keeps the broker from delivering it later, so it can never take a slot of
        the fleet's cordon budget for a node that stopped waiting.
        """
        message = schema.cordon_request_message(request, action)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._decisions[request.request_id] = future
        try:
            async with asyncio.timeout(wait_seconds):
                client = self._client
                if client is None:
                    raise TimeoutError  # not connected: no answer can come in time
                payload = schema.encode(message)
                expiry = max(1, math.ceil(wait_seconds))
                if await self._publish(client, "actions", payload, expiry=expiry):
                    raise TimeoutError  # refused: no answer will come
                return await future
        finally:
            self._decisions.pop(request.request_id, None)

    def status(self) -> MqttStatus:
        return MqttStatus(
            connected=self.connected,
            connections=self.connections,
            spool_depth=self.outbox.depth,
            spool_bytes=self.outbox.spool.size,
            awaiting_ack=self.outbox.awaiting_ack,
            acknowledged=self.acknowledged,
            spool_dropped=self.outbox.spool.dropped + self.outbox.dropped,
            spool_error=self.outbox.error,
            published=tuple(sorted(self.published.items())),
            refused=tuple(sorted(self.refused.items())),
            commands=tuple(sorted(self.commands.items())),
            rejected_commands=tuple(sorted(self.rejected_commands.items())),
            disconnects=tuple(sorted(self.disconnects.items())),
        )

    # --- the spool ------------------------------------------------------------------------

    def _enqueue(self, message_id: str, channel: Channel, message: dict[str, Any]) -> None:
        self.outbox.add(message_id, channel, schema.encode(message))
        # A burst (a page of kernel log) goes to disk in one transaction, right after it.
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # the rest of the burst first
        await self.outbox.flush()
        self._work.set()

    async def _copy_audit(self) -> None:
        """Audit records not yet spooled go to the spool, from a cursor kept there; while
        the spool cannot be written they wait in the audit trail itself."""
        if self._audit is None or not self.outbox.spool.ready or self.outbox.error:
            return
        try:
            after = await self.outbox.spool.cursor(_AUDIT_CURSOR)
            records = self._audit.since(after, limit=500)
            if not records:
                return
            for record in records:
                message = schema.action_message(self.node, self.cluster, record)
                self.outbox.add(message["id"], "actions", schema.encode(message))
            await self.outbox.flush()
            if not self.outbox.error:  # written: move the cursor (else from it again later)
                await self.outbox.spool.set_cursor(_AUDIT_CURSOR, records[-1].id)
        except SpoolError as exc:
            log.warning("MQTT spool: audit records not copied yet: %s", exc)

    # --- the connection -------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, report, reconnect with jittered backoff, until cancelled."""
        backoff = Backoff(self.config.broker)
        quiet_socket_races(asyncio.get_running_loop())
        await self.outbox.open()
        await self._copy_audit()
        will = aiomqtt.Will(
            self.topics.topic("state"),
            schema.encode(schema.offline_message(self.node, self.cluster, "connection lost")),
            qos=1,
            retain=True,
        )
        options = client_options(self.config.broker, client_id=f"gpuagent-{self.node}", will=will)
        while True:
            try:
                await self._connection(options, backoff)
            except Exception:  # a reporter bug must not take monitoring down: reconnect
                log.exception("MQTT reporter failed")
            finally:
                self.connected = False
                self._client = None
            await asyncio.sleep(backoff.next_delay())

    async def _connection(self, options: dict[str, Any], backoff: Backoff) -> None:
        client = aiomqtt.Client(**options)
        try:
            async with client:
                self._attach(client)
                backoff.reset()
                log.info("MQTT connected to %s:%d", options["hostname"], options["port"])
                await self._session(client)
        except aiomqtt.MqttError as error:
            # The session's tasks all end with the connection: one line, not a traceback.
            if self.connected:
                log.warning("MQTT connection lost: %s", error)
            else:
                log.debug("MQTT connect failed: %s", error)
        finally:
            settle(client)

    def _attach(self, client: aiomqtt.Client) -> None:
        # aiomqtt drops PUBACK reason codes; read them from the paho client beneath it so
        # a publish the broker refuses (MQTT 5, e.g. "Not authorized") is seen as such.
        paho = client._client  # noqa: SLF001
        acknowledge = paho.on_publish

        def on_publish(*args: Any) -> None:
            reason_code = args[3]
            if getattr(reason_code, "is_failure", False):
                self._refused = reason_code
            if acknowledge is not None:
                acknowledge(*args)

        paho.on_publish = on_publish
        count_disconnects(client, self.disconnects)
        self._client = client
        self.connected = True
        self.connections += 1

    async def _session(self, client: aiomqtt.Client) -> None:
        await client.subscribe(self.topics.topic("cmd"), qos=1)
        await self._publish_state(client)
        # Not a TaskGroup: one whose task fails as we are cancelled (SIGTERM just as the
        # connection drops) raises the failure instead of the cancellation, and the
        # reporter would reconnect instead of stopping.
        tasks = [
            asyncio.create_task(self._drain(client), name="mqtt-drain"),
            asyncio.create_task(self._state_loop(client), name="mqtt-state"),
            asyncio.create_task(self._command_loop(client), name="mqtt-commands"),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # the connection's end, as an MqttError
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _publish(
        self,
        client: aiomqtt.Client,
        channel: Channel,
        payload: bytes,
        *,
        retain: bool = False,
        expiry: int | None = None,
        online: bool = False,
    ) -> Refusal | None:
        """One QoS 1 publish, acknowledged; the broker's refusal, or None. An ``online``
        state report is skipped once shutdown began: after the offline report it would
        stand until the aggregator marks the node stale."""
        properties = None
        if expiry is not None:
            properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            properties.MessageExpiryInterval = expiry
        # One publish in flight at a time: the acknowledgement we read is ours, and the
        # spool drains in order.
        async with self._publish_lock:
            if online and self._shutting_down:
                return None
            self._refused = None
            await client.publish(
                self.topics.topic(channel),
                payload,
                qos=1,
                retain=retain,
                properties=properties,
            )
            code, self._refused = self._refused, None
        if code is not None:
            refusal = Refusal(str(code), transient=getattr(code, "value", None) in _TRANSIENT)
            if not self.refused[channel]:
                log.error(
                    "the MQTT broker refused a publish on %s: %s (%s)",
                    self.topics.topic(channel),
                    refusal.reason,
                    "will retry"
                    if refusal.transient
                    else "not retried: check the broker's ACL and this node's identity",
                )
            self.refused[channel] += 1
            return refusal
        self.published[channel] += 1
        return None

    async def _drain(self, client: aiomqtt.Client) -> None:
        expiry = self.config.event_expiry_seconds
        acks = self.config.ack_timeout_seconds > 0
        await self.outbox.connected()
        while True:
            self._work.clear()
            await self.outbox.flush()
            await self._copy_audit()
            batch = await self.outbox.due()
            sent: list[Pending] = []
            done: list[Pending] = []
            retry_later = False
            try:
                for item in batch:
                    channel = typing.cast("Channel", item.channel)
                    refusal = await self._publish(client, channel, item.payload, expiry=expiry)
                    if refusal is not None and refusal.transient:
                        retry_later = True  # the broker is busy or over quota: keep it
                        break
                    # Refused for good, or (acks off) the broker's PUBACK is the end of it.
                    (sent if refusal is None and acks else done).append(item)
            finally:
                # One transaction per batch; a crash before it only means a resend.
                await self._settle(sent, done)
            if retry_later:
                await asyncio.sleep(_TRANSIENT_RETRY_SECONDS)
            elif not batch:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(await self.outbox.next_due()):
                        await self._work.wait()

    async def _settle(self, sent: list[Pending], done: list[Pending]) -> None:
        try:
            if done:
                await self.outbox.done(done)
            if sent:
                await self.outbox.sent(sent)
        except SpoolError as exc:  # they are sent again: the aggregator drops the copies
            log.warning("MQTT spool: %s", exc)

    async def _state_loop(self, client: aiomqtt.Client) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.state_interval_seconds):
                    await self._state_changed.wait()
                    # A burst of events is one report, not one per snapshot.
                    await asyncio.sleep(_STATE_DEBOUNCE_SECONDS)
            await self._publish_state(client)

    async def _publish_state(self, client: aiomqtt.Client) -> None:
        self._state_changed.clear()
        if self._snapshot is None:
            return
        message = schema.state_message(self._snapshot, self._version)
        await self._publish(client, "state", schema.encode(message), retain=True, online=True)

    async def shutdown(self) -> None:
        """Say goodbye: the retained state becomes offline ("shutdown")."""
        self._shutting_down = True
        client = self._client
        if client is None:
            return
        message = schema.offline_message(self.node, self.cluster, "shutdown")
        with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
            async with asyncio.timeout(_SHUTDOWN_PUBLISH_SECONDS):
                await self._publish(client, "state", schema.encode(message), retain=True)

    def close(self) -> None:
        self.outbox.spool.close_soon()
        if self._own_disk:
            self._disk.close()

    # --- commands -------------------------------------------------------------------------

    async def _command_loop(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            payload = message.payload
            if not isinstance(payload, bytes | bytearray):
                payload = str(payload).encode()
            self._commands.handle(payload)

    def handle_command(self, payload: bytes | bytearray) -> asyncio.Task[None] | None:
        return self._commands.handle(payload)

    async def _acknowledged(self, ids: list[str]) -> None:
        """The aggregator stored these messages: they leave the spool."""
        self.acknowledged += await self.outbox.acknowledge(ids)

    # What tests and the daemon reach: the command handler's own.
    @property
    def target(self) -> CommandTarget | None:
        return self._commands.target

    @target.setter
    def target(self, target: CommandTarget | None) -> None:
        self._commands.target = target

    @property
    def commands(self) -> Counter[str]:
        return self._commands.received

    @property
    def rejected_commands(self) -> Counter[str]:
        return self._commands.rejected
