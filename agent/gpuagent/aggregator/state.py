"""The aggregator's in-memory fleet state: the node table, recent replies and counters.

Everything the API, the page and /metrics read comes from here, so a scrape or a page
load never waits on SQLite; the store only persists it (write-behind). Owned by the event
loop: nothing here is touched from another thread.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from gpuagent.aggregator.alerts import FleetAlerts
from gpuagent.aggregator.maintenance import Maintenance
from gpuagent.aggregator.onsets import Onsets
from gpuagent.aggregator.records import NodeRecord

# Replies kept per node for GET /api/v1/nodes/<node>.
REPLIES_PER_NODE = 10


class RecentIds:
    """The last ``capacity`` message keys (`store.row_key`: cluster, node and id):
    at-least-once delivery repeats a message soon after the first copy, so a bounded window
    catches the duplicates without growing forever (the store's primary keys catch any
    older ones)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def seen(self, message_id: str) -> bool:
        """True if ``message_id`` was already seen; remembers it either way."""
        if message_id in self._ids:
            return True
        self._ids[message_id] = None
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
        return False


@dataclass
class Counters:
    received: Counter[str] = field(default_factory=Counter)  # by message type
    rejected: Counter[str] = field(default_factory=Counter)  # by reject reason
    duplicates: Counter[str] = field(default_factory=Counter)  # by message type
    events: Counter[str] = field(default_factory=Counter)  # by category
    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)  # (cluster, decision)
    commands: Counter[str] = field(default_factory=Counter)  # sent, by command
    bad_requests: Counter[str] = field(default_factory=Counter)  # by API endpoint
    commands_rejected: Counter[str] = field(default_factory=Counter)  # by reason
    requests_rejected: Counter[str] = field(default_factory=Counter)  # HTTP, by reason
    disconnects: Counter[str] = field(default_factory=Counter)  # by the broker's reason
    acknowledged: int = 0  # node messages acknowledged to their nodes (end to end)
    connections_rejected: Counter[str] = field(default_factory=Counter)  # HTTP, by reason
    task_failures: Counter[str] = field(default_factory=Counter)  # by background task
    cordons_held: int = 0  # cordon requests held for their NVLink domain to settle
    cordons_too_old: int = 0  # cordon requests dropped: older than max_request_age_seconds
    muted_records: int = 0  # kernel records of nodes under planned maintenance


@dataclass
class FleetState:
    nodes: dict[tuple[str, str], NodeRecord] = field(default_factory=dict)
    replies: dict[tuple[str, str], deque[dict[str, Any]]] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)
    seen: RecentIds = field(default_factory=lambda: RecentIds(200_000))
    # Whether the MQTT consumer is connected right now.
    connected: bool = False
    # Nodes per cluster, kept as nodes are added (read per cordon request and per scrape).
    sizes: Counter[str] = field(default_factory=Counter)
    # When each node's findings started (the page shows their age).
    onsets: Onsets = field(default_factory=Onsets)
    # Each node's alerts in Alertmanager (aggregator.alertmanager), when configured.
    alerts: FleetAlerts = field(default_factory=FleetAlerts)
    # Planned maintenance windows not yet over.
    maintenance: Maintenance = field(default_factory=Maintenance)

    def put(self, record: NodeRecord) -> None:
        if record.key not in self.nodes:
            self.sizes[record.cluster] += 1
        self.nodes[record.key] = record
        self.onsets.observe(record)

    def find(self, node: str, cluster: str | None = None) -> list[NodeRecord]:
        """Records named ``node`` (one per cluster it appears in), or just ``cluster``'s."""
        if cluster is not None:
            record = self.nodes.get((cluster, node))
            return [record] if record else []
        return [r for (_, name), r in self.nodes.items() if name == node]

    def cluster_size(self, cluster: str) -> int:
        return self.sizes[cluster]

    def clusters(self) -> list[str]:
        return sorted(self.sizes)

    def add_reply(self, cluster: str, node: str, reply: dict[str, Any]) -> None:
        recent = self.replies.setdefault((cluster, node), deque(maxlen=REPLIES_PER_NODE))
        recent.append(reply)
