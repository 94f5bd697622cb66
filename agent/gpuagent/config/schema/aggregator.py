"""[aggregator]: the fleet aggregator (its own file has the agent's format)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from gpuagent.config.ranges import MQTT_EXPIRY, NON_NEGATIVE, PERCENT, POSITIVE
from gpuagent.config.schema.agent import split_listen
from gpuagent.config.schema.outputs import MqttConnection


@dataclass(frozen=True)
class CordonBudgetSection:
    # Approve a cordon request only while, counting it, at most max_nodes nodes and at most
    # max_percent of the cluster's known nodes were cordoned within window_seconds.
    max_nodes: Annotated[int, NON_NEGATIVE] = 2
    max_percent: Annotated[float, PERCENT] = 10.0
    window_seconds: Annotated[float, POSITIVE] = 3600.0
    # A cordon request older than this when it arrives (it waited in the broker while the
    # aggregator was away) is dropped, not decided: what the node saw then may be over,
    # and a backlog replayed at once would spend the budget on the past. The node asks
    # again if it still needs to.
    max_request_age_seconds: Annotated[float, POSITIVE] = 600.0
    # With SQLite: whether this aggregator decides cordon requests. Exactly one of the
    # aggregators in a share group must (docs/fleet.md): the budget lives in its database.
    # With PostgreSQL every aggregator decides, each decision in one transaction on the
    # shared database, and this is ignored.
    arbiter: bool = True


@dataclass(frozen=True)
class CorrelationSection:
    # Fleet incidents (docs/fleet.md#fleet-incidents): kernel records of GPUs that share an
    # NVLink domain, a job or a join label, within join_window_seconds of each other, are
    # one incident, and the cordon arbiter decides by its root.
    enabled: bool = True
    join_window_seconds: Annotated[float, POSITIVE] = 30.0
    # How long a cordon request of a node in a shared NVLink domain (or in an incident that
    # spans nodes) waits for the domain's records to arrive before it is decided.
    settle_seconds: Annotated[float, NON_NEGATIVE] = 10.0
    # Node labels ([agent] labels) that join a node's consequence records when its GPUs
    # have neither an NVLink domain nor a job, e.g. ["rack"]; empty: none.
    join_labels: list[str] = field(default_factory=list)
    # A domain failing together (docs/fleet.md#a-domain-failing-together): when at least
    # domain_fraction_percent of the nodes of a domain (a node label named here) report a
    # fault of their own within domain_window_seconds, that is one incident, and at most
    # one of its nodes is cordoned. Domains of fewer than 4 nodes never count.
    domain_labels: list[str] = field(default_factory=lambda: ["rack", "leaf", "power"])
    domain_window_seconds: Annotated[float, POSITIVE] = 300.0
    domain_fraction_percent: Annotated[float, PERCENT] = 50.0
    # Fleet incidents are listed (API, console) this long after their last record.
    retention_seconds: Annotated[float, POSITIVE] = 7 * 86400.0


@dataclass(frozen=True)
class RulesSection:
    # Rules over each GPU's and node's history (docs/fleet.md#fleet-rules); the defaults
    # and where they come from are documented there.
    enabled: bool = True
    # A GPU CRITICAL again within this long of recovering is a repeat offender.
    repeat_window_seconds: Annotated[float, POSITIVE] = 7 * 86400.0
    # This many automatic remediation attempts on one node within remediation_window_seconds:
    # the node is put in observe mode and paged until a person clears it.
    remediation_attempts: Annotated[int, POSITIVE] = 3
    remediation_window_seconds: Annotated[float, POSITIVE] = 7 * 86400.0
    # This many Xid 13s on the same GPC and TPC of one GPU within die_defect_window_seconds:
    # a die defect is suspected.
    die_defect_count: Annotated[int, POSITIVE] = 2
    die_defect_window_seconds: Annotated[float, POSITIVE] = 86400.0
    # The facts the rules read (gpu_history) are kept this long; at least every window.
    history_retention_seconds: Annotated[float, POSITIVE] = 30 * 86400.0


@dataclass(frozen=True)
class PostgresSection:
    # The database password: the first line of this file (a systemd credential, e.g.
    # /run/credentials/gpuagent-aggregator.service/db-password). Empty: none, or libpq's
    # own ways (client certificate in the URL, ~/.pgpass). Never in the URL itself.
    password_file: str = ""
    # Connections per aggregator: one writes, the others serve reads (API, refresh).
    pool_max_size: Annotated[int, POSITIVE] = 8
    connect_timeout_seconds: Annotated[float, POSITIVE] = 10.0
    # How often each aggregator reads what the others wrote into its in-memory fleet view
    # (the API, page and fleet metrics answer from it): the staleness bound across
    # aggregators is this plus the write-behind interval (50 ms).
    refresh_interval_seconds: Annotated[float, POSITIVE] = 0.5


@dataclass(frozen=True)
class AggregatorHttpSection:
    # A connection that has not sent a whole request head (request line and headers) this
    # long after it opened, or after its previous request, is closed.
    header_timeout_seconds: Annotated[float, POSITIVE] = 10.0
    # A request body not received within this many seconds is answered 408.
    body_timeout_seconds: Annotated[float, POSITIVE] = 10.0
    # An idle keep-alive connection is closed after this many seconds.
    keepalive_timeout_seconds: Annotated[float, POSITIVE] = 15.0
    # At most this many connections are open at once; further ones are closed at accept.
    max_connections: Annotated[int, POSITIVE] = 256


@dataclass(frozen=True)
class AlertmanagerSection:
    # Alertmanager's address ("http://alertmanager.monitoring:9093"): the fleet table and
    # the node and GPU pages show each node's firing and silenced alerts from it. Empty: none.
    url: str = ""
    # How often it is read (one request for the whole fleet), and how long a read may take.
    interval_seconds: Annotated[float, POSITIVE] = 30.0
    timeout_seconds: Annotated[float, POSITIVE] = 10.0
    # The labels that name an alert's node, the first one set wins: "node" where the
    # scrape sets it (agent.node_name), Hostname (gpuagent's and dcgm-exporter's GPU
    # alerts), "instance" by its host part.
    node_labels: list[str] = field(default_factory=lambda: ["node", "Hostname", "instance"])
    # Only alerts that match all of these Alertmanager matchers (e.g. 'alertname=~"Gpu.*"');
    # empty: every alert that names a node.
    matchers: list[str] = field(default_factory=list)


# Where systemd hands the aggregator its command token (LoadCredential= in its unit).
DEFAULT_COMMAND_TOKEN_FILE = "/run/credentials/gpuagent-aggregator.service/command-token"  # noqa: S105


@dataclass(frozen=True)
class AggregatorSection:
    # HTTP: the JSON API (/api/v1/...), the fleet page (/) and fleet metrics (/metrics).
    listen: str = "127.0.0.1:19500"
    # Fleet state: a SQLite file (one aggregator), or a PostgreSQL URL
    # ("postgresql://user@host/db?sslmode=verify-full&...") shared by several.
    database: str = "/var/lib/gpuagent-aggregator/fleet.sqlite"
    # Shared-subscription group: every aggregator with the same group splits the fleet's
    # messages; empty: plain subscriptions (one aggregator sees everything).
    share_group: str = "gpuagent"
    # A node whose last report is older than this is shown as stale (offline comes from
    # its Last Will at once).
    stale_after_seconds: Annotated[float, POSITIVE] = 120.0
    # History (events, action records, replies, commands, cordon decisions) older than this
    # is deleted; cordon decisions are kept at least for the cordon budget's window.
    events_retention_seconds: Annotated[float, POSITIVE] = 7 * 86400.0
    max_events: Annotated[int, POSITIVE] = 1_000_000
    # Each node's history for the console's timelines: health transitions (node and GPUs)
    # and every GPU's trend values sampled once per history_interval_seconds; kept this long.
    history_retention_seconds: Annotated[float, POSITIVE] = 7 * 86400.0
    history_interval_seconds: Annotated[float, POSITIVE] = 300.0
    # Sending commands to nodes (POST .../commands) needs "Authorization: Bearer <token>"
    # with the token in this file; without a readable token (empty, missing file), commands
    # are refused.
    command_token_file: str = DEFAULT_COMMAND_TOKEN_FILE
    # Host header names (with or without a port) the HTTP server answers besides the
    # listen address, localhost, 127.0.0.1 and [::1]; others get 421 (DNS rebinding).
    http_hosts: list[str] = field(default_factory=list)
    # MQTT 5 message expiry of commands and cordon decisions: the broker drops one that has
    # waited this long for a node that is away, rather than deliver it when the node comes
    # back (the node's session lasts a day).
    command_expiry_seconds: Annotated[int, MQTT_EXPIRY] = 300
    # The fleet page links each node and GPU to Grafana through this URL, with {node},
    # {cluster} and {gpu} (the GPU's index; "All" for the node) replaced; empty: no links.
    # For example
    # "https://grafana.example/d/gpuagent?var-cluster={cluster}&var-node={node}&var-gpu={gpu}".
    grafana_url_template: str = ""
    # Where docs/ is published (absolute, ending in "/"): the page links each finding's
    # runbook to <base>checks.md#<runbook>; empty: runbooks are shown as plain text.
    runbook_base_url: str = ""
    broker: MqttConnection = field(default_factory=MqttConnection)
    cordon_budget: CordonBudgetSection = field(default_factory=CordonBudgetSection)
    correlation: CorrelationSection = field(default_factory=CorrelationSection)
    rules: RulesSection = field(default_factory=RulesSection)
    postgres: PostgresSection = field(default_factory=PostgresSection)
    http: AggregatorHttpSection = field(default_factory=AggregatorHttpSection)
    alertmanager: AlertmanagerSection = field(default_factory=AlertmanagerSection)

    @property
    def host_port(self) -> tuple[str, int]:
        return split_listen(self.listen)
