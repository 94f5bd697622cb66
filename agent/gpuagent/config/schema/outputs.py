"""[outputs]: the textfile collector, the MQTT reporter (with the broker connection the
aggregator uses too) and the Node's conditions and events in Kubernetes."""

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
class KubernetesOutput:
    # GPU health as conditions of this node's Node object, and what happens once (XID
    # incidents, lost GPUs, remediation) as events: docs/kubernetes.md. Independent of
    # remediation: observe mode writes them too.
    enabled: bool = False
    # Empty: remediation.cordon.kubernetes.kubeconfig (empty there too: the in-cluster
    # service account).
    kubeconfig: str = ""
    # Empty: remediation.cordon.kubernetes.node_name, else agent.node_name.
    node_name: str = ""
    # The summary condition (True: healthy). "AcceleratedHardwareReady" lets a repair
    # controller that keys on that name act on it (docs/kubernetes.md).
    summary_condition: str = "GpuHealthy"
    # At most one status patch per this many seconds (changes meanwhile are batched).
    min_interval_seconds: Annotated[float, NON_NEGATIVE] = 1.0
    # Every condition is written again this often (lastHeartbeatTime), changed or not.
    heartbeat_seconds: Annotated[float, POSITIVE] = 300.0
    # Events (events.k8s.io/v1) on the Node; false: conditions only.
    events: bool = True
    # Where node events live (the kubelet's are in "default").
    event_namespace: str = "default"
    # New events at most this many per minute; past it they are dropped and counted.
    events_per_minute: Annotated[int, POSITIVE] = 30
    # Each API request's timeout.
    timeout_seconds: Annotated[float, POSITIVE] = 10.0


@dataclass(frozen=True)
class OutputsSection:
    textfile: TextfileOutput = field(default_factory=TextfileOutput)
    mqtt: MqttOutput = field(default_factory=MqttOutput)
    kubernetes: KubernetesOutput = field(default_factory=KubernetesOutput)
