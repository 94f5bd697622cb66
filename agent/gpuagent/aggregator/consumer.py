"""The aggregator's MQTT side (the only module that speaks aiomqtt): connect, subscribe to
the node channels (shared subscriptions when a share group is set; `actions` only on the
cordon arbiter), hand each message to the ingest, publish what comes back; reconnect with
jittered backoff.

A QoS 1 message is acknowledged only once the rows it caused are committed, and what it
asks for (a cordon decision) is sent only then: if the aggregator dies first, the broker
delivers the message again to its next session. Then, too, the node is told (an ``ack``
on its ``cmd`` topic, one per node per commit) that its spool may drop the message: so a
message the broker loses (a crash, a shared subscription without members) is still in the
node's spool, and sent again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import socket
from collections.abc import Callable
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gpuagent.aggregator import paho_tables
from gpuagent.aggregator.ingest import Outgoing
from gpuagent.aggregator.state import FleetState
from gpuagent.aggregator.store import FleetStore
from gpuagent.config import AggregatorSection, ConfigError
from gpuagent.fleet import schema
from gpuagent.fleet.connection import (
    Backoff,
    client_options,
    count_disconnects,
    quiet_socket_races,
    settle,
)
from gpuagent.fleet.topics import NODE_CHANNELS, parse_topic, subscription

log = logging.getLogger(__name__)

Handler = Callable[[str, bytes], list[Outgoing]]

# The most message ids in one acknowledgement to a node (about 20 KB of JSON).
MAX_ACK_IDS = 256
# Messages the broker may send us before we acknowledge (MQTT 5 Receive Maximum; the most
# the protocol allows). Acknowledging after the next commit holds each message up to
# about 50 ms: without this, mosquitto's default of 20 unacknowledged messages would cap
# the aggregator at a few hundred messages/s.
RECEIVE_MAXIMUM = 65535
# How long the broker keeps the session of an aggregator that shares a database and a share
# group after it went away. mosquitto goes on giving such a session its turn of the
# group's messages, queued there until it returns: a long session would hold 1/N of the
# fleet's state reports and cordon requests while a dead aggregator stays dead. A restart
# within this keeps what was queued; after it, the others take everything (and the nodes
# send again what the expired session held). Shorter than stale_after_seconds' default
# (120 s), so no node looks stale for it. A lone aggregator keeps the agent's one day.
SHARED_SESSION_EXPIRY_SECONDS = 60


def _direct_queue(
    deliver: Callable[[aiomqtt.Message], None],
) -> type[asyncio.Queue[aiomqtt.Message]]:
    """An aiomqtt queue type that hands each message to ``deliver`` as paho decodes it.

    aiomqtt queues every message and its iterator wakes a task per message (a task, a
    wait and three event-loop turns each): a third of the aggregator's time at 5,000
    messages/s. paho decodes in the event loop's own reader callback, so delivering there
    is as safe as in the iterator, and costs one call.
    """

    class DirectQueue(asyncio.Queue[aiomqtt.Message]):
        def put_nowait(self, item: aiomqtt.Message) -> None:
            deliver(item)

    return DirectQueue


def _payload(value: object) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return str(value).encode() if value is not None else b""


class Consumer:
    def __init__(
        self, config: AggregatorSection, handler: Handler, state: FleetState, store: FleetStore
    ) -> None:
        self.connection = config.broker
        self.share_group = config.share_group
        # With a shared database every aggregator decides cordon requests (in the
        # database); with SQLite only the arbiter, whose budget it is.
        self.shared_database = store.shared
        self.arbiter = config.cordon_budget.arbiter
        self.command_expiry = config.command_expiry_seconds
        self.handler = handler
        self.state = state
        self.store = store
        self.client_id = self.connection.client_id or (
            f"gpuagent-aggregator-{socket.gethostname()}"
        )
        self._client: aiomqtt.Client | None = None
        # The paho client of the current session: acknowledgements go only to it.
        self._paho: paho.Client | None = None
        self._replies: set[asyncio.Task[None]] = set()
        # Acknowledgements to nodes of the current commit, by node cmd topic.
        self._acks: dict[str, list[str]] = {}
        # paho's per-message MQTT 5 property tables otherwise cap a core at ~1,500 msg/s.
        paho_tables.install()

    async def publish(self, out: Outgoing) -> None:
        """Publish at QoS 1, expiring after `command_expiry_seconds`; ConnectionError while
        not connected."""
        client = self._client
        if client is None:
            raise ConnectionError("not connected to the MQTT broker")
        properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        properties.MessageExpiryInterval = self.command_expiry
        try:
            await client.publish(out.topic, out.payload, qos=1, properties=properties)
        except aiomqtt.MqttError as exc:
            raise ConnectionError(str(exc)) from exc

    async def run(self) -> None:
        """Consume until cancelled."""
        backoff = Backoff(self.connection)
        quiet_socket_races(asyncio.get_running_loop())
        while True:
            connected = False
            try:
                await self._session(client_options(self.connection, client_id=self.client_id))
            except ConfigError as exc:  # e.g. the password file went missing
                log.error("MQTT: %s", exc)  # noqa: TRY400 - no traceback needed
            except aiomqtt.MqttError as exc:
                log.warning("MQTT: %s; reconnecting", exc)
            finally:
                connected = self._client is not None
                self._client = None
                self._paho = None
                self.state.connected = False
            if connected:
                backoff.reset()  # it worked for a while: start backing off afresh
            await asyncio.sleep(backoff.next_delay())

    def subscriptions(self) -> tuple[list[str], list[str]]:
        """(what to subscribe to, what not to hold). Every node channel, shared in the share
        group. With SQLite, ``actions`` is the exception: cordon requests travel there beside
        action records, and only one aggregator may decide them, since the budget is in its
        database. The arbiter takes every node's ``actions`` outside the share group; the
        others none. With a shared database any aggregator decides, and ``actions`` is
        shared like the rest."""
        prefix = self.connection.topic_prefix
        wanted = [
            subscription(prefix, channel, self.share_group)
            for channel in NODE_CHANNELS
            if channel != "actions" or self.shared_database
        ]
        if self.arbiter and not self.shared_database:
            wanted.append(subscription(prefix, "actions"))
        actions = {subscription(prefix, "actions", group) for group in (self.share_group, "")}
        return wanted, sorted(actions - set(wanted))

    def _deliver(self, message: aiomqtt.Message) -> None:
        try:
            outgoing = self.handler(message.topic.value, _payload(message.payload))
        # A bug in handling one message must not end the session for every node.
        except Exception:
            log.exception("MQTT: handling a message on %s failed", message.topic.value)
            outgoing = []
        self.store.after_write(
            functools.partial(self._written, self._paho, message.mid, message.qos, outgoing)
        )

    def send_when_written(self, outgoing: list[Outgoing]) -> None:
        """Send answers made outside a message's handling (a held cordon request decided),
        once the rows queued with them are committed."""
        if outgoing:
            self.store.after_write(functools.partial(self._written, None, 0, 0, outgoing))

    def _written(
        self, session: paho.Client | None, mid: int, qos: int, outgoing: list[Outgoing]
    ) -> None:
        """The message's rows are committed (or refused): acknowledge it, send its answers."""
        # A message of an earlier session is not ours to acknowledge any more: the broker
        # sends it again on this one (our session persists), and it is handled again.
        if qos > 0 and session is not None and session is self._paho:
            session.ack(mid, qos)
        for out in outgoing:
            if out.acknowledges is not None:
                if not self._acks:  # the first of this commit: send them all after it
                    asyncio.get_running_loop().call_soon(self._send_acks)
                self._acks.setdefault(out.topic, []).append(out.acknowledges)
                continue
            body = out.body()
            if body is None or (out.record is not None and self.store.refused(out.record)):
                # Unstored, an approval would be forgotten by a restart; the node's request
                # times out instead, and it asks again.
                log.error("MQTT: not sending to %s: its record could not be stored", out.topic)
                continue
            self._spawn(dataclasses.replace(out, payload=body, deferred=None))

    def _send_acks(self) -> None:
        """One acknowledgement per node of this commit, at QoS 0 and straight through paho
        (no task, no future, no expiry property: at fleet rates there is about one per
        event). Nothing is lost with a lost one: the node resends what stays
        unacknowledged, at once on every reconnect (when QoS 0 messages queued for it
        would have been dropped anyway). Not connected: the nodes resend."""
        acks, self._acks = self._acks, {}
        session = self._paho
        if session is None:
            return
        prefix = self.connection.topic_prefix
        for topic, ids in acks.items():
            where = parse_topic(prefix, topic)
            for start in range(0, len(ids), MAX_ACK_IDS):
                chunk = ids[start : start + MAX_ACK_IDS]
                message = schema.ack_message(where.node, where.cluster, chunk)
                session.publish(topic, schema.encode(message), qos=0)
                self.state.counters.acknowledged += len(chunk)

    def _spawn(self, out: Outgoing) -> None:
        # Sent from a task: this runs inside the store's flush, which must not wait.
        task = asyncio.get_running_loop().create_task(self._send(out))
        self._replies.add(task)
        task.add_done_callback(self._replies.discard)

    async def _send(self, out: Outgoing) -> None:
        try:
            await self.publish(out)
        except ConnectionError as exc:
            # The node re-sends its request, and gets the same decision then.
            log.warning("MQTT: could not send to %s: %s", out.topic, exc)

    async def _session(self, options: dict[str, Any]) -> None:
        options["properties"].ReceiveMaximum = RECEIVE_MAXIMUM
        if self.shared_database and self.share_group:
            options["properties"].SessionExpiryInterval = SHARED_SESSION_EXPIRY_SECONDS
        client = aiomqtt.Client(**options, queue_type=_direct_queue(self._deliver))
        # paho acknowledges a message when the handler returns, before its rows are
        # written; `_written` acknowledges instead.
        self._paho = client._client  # noqa: SLF001
        self._paho.manual_ack_set(on=True)
        count_disconnects(client, self.state.counters.disconnects)
        try:
            await self._connected_session(client)
        finally:
            settle(client)

    async def _connected_session(self, client: aiomqtt.Client) -> None:
        async with client:
            wanted, unwanted = self.subscriptions()
            # Our session persists: it may still hold what an earlier configuration wanted.
            if unwanted:
                await client.unsubscribe(unwanted)
            for topic in wanted:
                await client.subscribe(topic, qos=1)
            self._client = client
            self.state.connected = True
            log.info(
                "MQTT: connected to %s:%d as %s, subscribed to %s",
                self.connection.host,
                self.connection.port,
                self.client_id,
                ", ".join(wanted),
            )
            # Messages go to _deliver as they arrive; this only waits for the connection to
            # end, which the iterator reports as an MqttError.
            async for _ in client.messages:
                pass
