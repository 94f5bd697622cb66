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

    async def _session(self, kwargs: dict[str, object]) -> None:
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
            async for message in client.messages:
                for out in self.handler(message.topic.value, _payload(message.payload)):
                    await client.publish(out.topic, out.payload, qos=1)
