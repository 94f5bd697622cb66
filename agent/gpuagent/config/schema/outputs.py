"""[outputs]: the textfile collector and the MQTT reporter (with the broker connection
the aggregator uses too)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from gpuagent.config.ranges import MQTT_EXPIRY, MQTT_KEEPALIVE, NON_NEGATIVE, PORT, POSITIVE


@dataclass(frozen=True)
class TextfileOutput:
    # node_exporter's textfile collector directory (e.g.
    # /var/lib/prometheus/node-exporter); empty: off. gpuagent.prom is written atomically.
    dir: str = ""
    # At most one write per this many seconds.
    min_interval_seconds: Annotated[float, NON_NEGATIVE] = 5.0


@dataclass(frozen=True)
class MqttConnection:
    """How to reach the MQTT broker (the agent's reporter and the aggregator alike)."""

    host: str = "localhost"
    port: Annotated[int, PORT] = 8883
    # TLS (on by default: credentials and node reports never cross the network in clear).
    tls: bool = True
    # CA bundle to verify the broker with; empty: the system's.
    ca_file: str = ""
    # Client certificate and key (with the broker's use_identity_as_username, the
    # certificate's CN is the MQTT user name, and must be the node name).
    cert_file: str = ""
    key_file: str = ""
    # Username/password authentication; the password is read from a file (mode 0600).
    username: str = ""
    password_file: str = ""
    # Empty: "gpuagent-<node>" for an agent, "gpuagent-aggregator-<host>" for the aggregator.
    client_id: str = ""
    topic_prefix: str = "gpuagent/v1"
    keepalive_seconds: Annotated[int, MQTT_KEEPALIVE] = 30
    # Reconnect backoff: doubles from min to max, with jitter.
    reconnect_min_seconds: Annotated[float, POSITIVE] = 1.0
    reconnect_max_seconds: Annotated[float, POSITIVE] = 60.0


@dataclass(frozen=True)
class SpoolSection:
    # Events and action records wait here (SQLite under agent.state_dir) until the broker
    # acknowledges them. The oldest are dropped (and counted) past either bound.
    max_bytes: Annotated[int, POSITIVE] = 64 * 1024 * 1024
    max_age_seconds: Annotated[float, POSITIVE] = 7 * 86400.0


@dataclass(frozen=True)
class MqttOutput:
    enabled: bool = False
    broker: MqttConnection = field(default_factory=MqttConnection)
    # The retained state report is sent on every change and at least this often.
    state_interval_seconds: Annotated[float, POSITIVE] = 30.0
    # MQTT 5 message expiry of events and action records (a broker drops older ones for
    # a subscriber that was away longer).
    event_expiry_seconds: Annotated[int, MQTT_EXPIRY] = 86400
    spool: SpoolSection = field(default_factory=SpoolSection)
    # Remote commands that can destroy work (GPU reset) are refused unless this is true.
    allow_remote_reset: bool = False
    # Largest command payload accepted from the broker.
    max_command_bytes: Annotated[int, POSITIVE] = 65536
    # Commands sent longer ago than this (or this far in the future: clock skew) are
    # refused, so one queued for a node that was away does not run when it returns.
    max_command_age_seconds: Annotated[float, POSITIVE] = 300.0
    # A spooled message leaves the spool once the aggregator acknowledges storing it; one
    # not acknowledged within this is sent again (the wait doubling with each try, up to
    # 32x). 0: the broker's acknowledgement is enough (for a consumer that sends no acks).
    ack_timeout_seconds: Annotated[float, NON_NEGATIVE] = 30.0


@dataclass(frozen=True)
class OutputsSection:
    textfile: TextfileOutput = field(default_factory=TextfileOutput)
    mqtt: MqttOutput = field(default_factory=MqttOutput)
