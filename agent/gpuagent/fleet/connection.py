"""Turning `[*.broker]` settings into an aiomqtt client (agent and aggregator alike)."""

from __future__ import annotations

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
