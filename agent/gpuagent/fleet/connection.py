"""Turning `[*.broker]` settings into an aiomqtt client (agent and aggregator alike)."""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import ssl
from collections import Counter
from pathlib import Path
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gpuagent.config import ConfigError, MqttConnection


def read_password(path: str) -> str:
    """The first line of the password file; a ConfigError if it can't be read."""
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()[0] if path else ""
    except (OSError, UnicodeDecodeError, IndexError) as exc:
        raise ConfigError(f"cannot read the MQTT password file {path}: {exc}") from None


# What paho logs at ERROR when the connection drops under it ("failed to receive on
# socket: [Errno 104] Connection reset by peer"). The reporter and the consumer log the loss
# themselves, once, as a warning; paho's line repeats it, so it goes down to DEBUG.
_CONNECTION_LOSS = ("failed to receive on socket: %s", "timeout on socket: %s")


class _LossIsDebug(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.ERROR or record.msg not in _CONNECTION_LOSS:
            return True
        # The level was checked as ERROR: a debug record is kept only where debug is on.
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return MQTT_LOGGER.isEnabledFor(logging.DEBUG)


# The logger aiomqtt and paho log to, beneath ours (aiomqtt's default is "mqtt").
MQTT_LOGGER = logging.getLogger("gpuagent.mqtt")
MQTT_LOGGER.addFilter(_LossIsDebug())


def settle(client: aiomqtt.Client) -> None:
    """Mark the way the connection ended as seen. aiomqtt keeps it in a future that only
    its message iterator reads; a connection that ends while nothing iterates (during the
    subscribe or the first publish, or with the iterator already cancelled) would leave it
    unread, and asyncio logs "Future exception was never retrieved" with a traceback when
    the client is collected, after the loss was handled and logged."""
    # A private attribute: a client without it (another aiomqtt) has nothing to settle.
    ended = getattr(client, "_disconnected", None)
    if isinstance(ended, asyncio.Future) and ended.done() and not ended.cancelled():
        ended.exception()


def quiet_socket_races(loop: asyncio.AbstractEventLoop) -> None:
    """aiomqtt hands paho's socket to the loop with `call_soon_threadsafe(add_writer, fd)`:
    a connection that drops before that callback runs leaves it a closed descriptor, and
    the loop logs the OSError (EBADF) with a traceback after the loss was handled and
    logged. Those callbacks, and only those, are logged at DEBUG; anything else goes to
    the handler the loop had."""
    previous = loop.get_exception_handler()
    if getattr(previous, "__name__", "") == "_quiet_handler":
        return  # installed already (the reporter and the consumer reconnect in one loop)

    def _quiet_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc, handle = context.get("exception"), context.get("handle")
        if (
            isinstance(exc, OSError)
            and exc.errno == errno.EBADF
            and any(name in repr(handle) for name in (".add_writer(", ".add_reader("))
        ):
            MQTT_LOGGER.debug("a socket closed before the loop watched it: %s", exc)
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(_quiet_handler)


# How long the broker keeps our session (subscriptions, QoS 1 messages for us) after we
# went away: MQTT 5 ends it at once unless told otherwise.
SESSION_EXPIRY_SECONDS = 86400


def client_options(
    conn: MqttConnection, *, client_id: str, will: aiomqtt.Will | None = None
) -> dict[str, Any]:
    """Keyword arguments for `aiomqtt.Client`: MQTT 5, TLS as configured, a persistent
    session (QoS 1 messages for us wait at the broker while we are away)."""
    properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    properties.SessionExpiryInterval = SESSION_EXPIRY_SECONDS
    options: dict[str, Any] = {
        "hostname": conn.host,
        "port": conn.port,
        "identifier": conn.client_id or client_id,
        "protocol": aiomqtt.ProtocolVersion.V5,
        "keepalive": conn.keepalive_seconds,
        "clean_start": False,
        "timeout": 10.0,
        "will": will,
        "properties": properties,
        "logger": MQTT_LOGGER,
    }
    if conn.username:
        options["username"] = conn.username
        options["password"] = read_password(conn.password_file)
    if conn.tls:
        options["tls_params"] = aiomqtt.TLSParameters(
            ca_certs=conn.ca_file or None,
            certfile=conn.cert_file or None,
            keyfile=conn.key_file or None,
            cert_reqs=ssl.CERT_REQUIRED,
        )
    return options


def count_disconnects(client: aiomqtt.Client, counts: Counter[str]) -> None:
    """Count each connection the broker ends by its reason ("Session taken over": another
    client connected with our id), through the paho client beneath aiomqtt, which keeps
    the reason to itself."""
    paho = client._client  # noqa: SLF001
    handler = paho.on_disconnect

    def on_disconnect(*args: Any) -> None:
        reason = args[3] if len(args) > 3 else None
        if getattr(reason, "is_failure", True):  # not our own clean disconnect
            counts[str(reason)] += 1
        if handler is not None:
            handler(*args)

    paho.on_disconnect = on_disconnect


class Backoff:
    """Reconnect delays: doubling from min to max, each drawn with full jitter so a fleet
    that lost its broker together does not come back in lockstep."""

    def __init__(self, conn: MqttConnection, rng: random.Random | None = None) -> None:
        self._min = conn.reconnect_min_seconds
        self._max = max(conn.reconnect_max_seconds, conn.reconnect_min_seconds)
        self._next = self._min
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography

    def next_delay(self) -> float:
        delay = self._rng.uniform(self._min / 2, self._next)
        self._next = min(self._next * 2, self._max)
        return delay

    def reset(self) -> None:
        self._next = self._min
