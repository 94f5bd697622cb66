"""The aggregator's MQTT side (the only module that speaks aiomqtt): connect, subscribe to
every node channel (shared subscriptions when a share group is set), hand each message
to the ingest, publish what comes back; reconnect with jittered backoff."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

import aiomqtt

from gpuagent.aggregator import paho_tables
from gpuagent.aggregator.ingest import Outgoing
from gpuagent.aggregator.state import FleetState
from gpuagent.config import ConfigError, MqttConnection
from gpuagent.fleet.connection import Backoff, client_options
from gpuagent.fleet.topics import NODE_CHANNELS, subscription

log = logging.getLogger(__name__)

Handler = Callable[[str, bytes], list[Outgoing]]


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
        self,
        connection: MqttConnection,
        share_group: str,
        handler: Handler,
        state: FleetState,
    ) -> None:
        self.connection = connection
        self.share_group = share_group
        self.handler = handler
        self.state = state
        self.client_id = connection.client_id or f"gpuagent-aggregator-{socket.gethostname()}"
        self._client: aiomqtt.Client | None = None
        self._replies: set[asyncio.Task[None]] = set()
        # paho's per-message MQTT 5 property tables otherwise cap a core at ~1,500 msg/s.
        paho_tables.install()

    async def publish(self, out: Outgoing) -> None:
        """Publish at QoS 1; ConnectionError while not connected."""
        client = self._client
        if client is None:
            raise ConnectionError("not connected to the MQTT broker")
        try:
            await client.publish(out.topic, out.payload, qos=1)
        except aiomqtt.MqttError as exc:
            raise ConnectionError(str(exc)) from exc

    async def run(self) -> None:
        """Consume until cancelled."""
        backoff = Backoff(self.connection)
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
                self.state.connected = False
            if connected:
                backoff.reset()  # it worked for a while: start backing off afresh
            await asyncio.sleep(backoff.next_delay())

    def _deliver(self, message: aiomqtt.Message) -> None:
        try:
            outgoing = self.handler(message.topic.value, _payload(message.payload))
        # A bug in handling one message must not end the session for every node.
        except Exception:
            log.exception("MQTT: handling a message on %s failed", message.topic.value)
            return
        for out in outgoing:
            # Sent from a task: this runs inside paho's read callback, which cannot wait.
            task = asyncio.get_running_loop().create_task(self._send(out))
            self._replies.add(task)
            task.add_done_callback(self._replies.discard)

    async def _send(self, out: Outgoing) -> None:
        try:
            await self.publish(out)
        except ConnectionError as exc:
            # The node re-sends its request, and gets the same decision then.
            log.warning("MQTT: could not send to %s: %s", out.topic, exc)

    async def _session(self, kwargs: dict[str, object]) -> None:
        kwargs = {**kwargs, "queue_type": _direct_queue(self._deliver)}
        async with aiomqtt.Client(**kwargs) as client:  # type: ignore[arg-type]
            prefix = self.connection.topic_prefix
            for channel in NODE_CHANNELS:
                await client.subscribe(subscription(prefix, channel, self.share_group), qos=1)
            self._client = client
            self.state.connected = True
            log.info(
                "MQTT: connected to %s:%d as %s, subscribed to %s/+/+/{%s}%s",
                self.connection.host,
                self.connection.port,
                self.client_id,
                prefix,
                ",".join(NODE_CHANNELS),
                f" (share group {self.share_group})" if self.share_group else "",
            )
            # Messages go to _deliver as they arrive; this only waits for the connection to
            # end, which the iterator reports as an MqttError.
            async for _ in client.messages:
                pass
