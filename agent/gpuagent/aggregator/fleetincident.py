"""A fleet incident as the correlator keeps it: its member GPUs, how each weighs in
choosing the root, the root, and its document (the API's, the store's, the push's)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gpuagent.aggregator.domainfail import describe

Role = Literal["root", "consequence", "unrelated"]

# How a record weighs in choosing a root (higher wins).
OTHER: Final = 0
CONSEQUENCE: Final = 1
FATAL: Final = 2
LINK_FATAL: Final = 3


@dataclass(slots=True)
class Member:
    """One GPU's part in an incident."""

    node: str
    gpu: str
    index: int | None
    uuid: str
    first_time: float
    last_time: float
    weight: int  # the strongest class of record seen (OTHER ... LINK_FATAL)
    xid: int  # the XID of that record
    onset: float  # when that record came
    link: int | None = None
    count: int = 0
    # node incident id -> the count it was last reported with (None until a node incident
    # comes: most members never see one, and an empty dict each is garbage to collect)
    node_incidents: dict[str, int] | None = None

    def json(self, role: Role) -> dict[str, Any]:
        return {
            "node": self.node,
            "gpu": self.gpu,
            "index": self.index,
            "uuid": self.uuid,
            "role": role,
            "xid": self.xid,
            "link": self.link,
            "count": self.count,
            "first_time": self.first_time,
            "last_time": self.last_time,
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the arbiter makes of a node's cordon request, from its incidents."""

    deny: bool
    reason: str
    incidents: tuple[str, ...] = ()


@dataclass(slots=True, eq=False)
class FleetIncident:
    id: str
    cluster: str
    key: str  # "nvlink:<uuid>/<clique>", "job:<id>", "label:<name>=<value>", "node:<node>"
    first_time: float
    last_time: float
    members: dict[tuple[str, str], Member] = field(default_factory=dict)
    closed_at: float | None = None
    # Tuples and frozensets, replaced when they grow (rarely): a thousand open incidents
    # keep no list or set each for the collector to walk.
    approved: tuple[str, ...] = ()
    denied: tuple[str, ...] = ()
    # Kept as records come, so choosing the root never walks the members.
    _link_fatal: tuple[tuple[str, str], ...] = ()
    _earliest_fatal: tuple[str, str] | None = None
    # When its document was last handed out by `Correlator.tick` (None: never), and
    # whether a change since must go out at the next tick.
    written_at: float | None = None
    urgent: bool = True
    # A domain failing together (`domainfail`): its key ("label:rack=r12", "job:..."),
    # its node count, the nodes that faulted, and the one node let be cordoned for it.
    common_cause: str = ""
    domain_size: int = 0
    faulted: frozenset[str] = frozenset()
    cordon_node: str | None = None
    # The domain incident this node's own incident was merged into.
    merged_into: str | None = None

    @property
    def root(self) -> Member | None:
        if self.common_cause:
            return None  # the domain is the cause
        if self._link_fatal:
            if len(self._link_fatal) == 1:
                return self.members[self._link_fatal[0]]
            return None  # several GPUs' links at once: the domain, not a GPU
        return None if self._earliest_fatal is None else self.members[self._earliest_fatal]

    @property
    def domain_level(self) -> bool:
        """No GPU is the root: several links failed at once, or only consequences came."""
        return self.root is None

    @property
    def nvlink_domain(self) -> str:
        return self.key.removeprefix("nvlink:") if self.key.startswith("nvlink:") else ""

    def nodes(self) -> set[str]:
        return {node for node, _ in self.members}

    def role(self, member: Member, root: Member | None) -> Role:
        if root is not None and member is root:
            return "root"
        if root is not None and member.weight >= FATAL:
            return "unrelated"  # a fault of its own that joined before the root was known
        return "consequence"

    def node_role(self, node: str) -> Role:
        root = self.root
        roles = {self.role(m, root) for (n, _), m in self.members.items() if n == node}
        role: Role
        for role in ("root", "unrelated"):
            if role in roles:
                return role
        return "consequence"

    def take(self, member_key: tuple[str, str], weight: int) -> None:
        """Account for a member whose strongest record is now of ``weight``."""
        if weight == LINK_FATAL:
            if member_key not in self._link_fatal:
                self._link_fatal += (member_key,)
        elif weight == FATAL:
            earliest = self._earliest_fatal
            if earliest is None or self.members[member_key].onset < self.members[earliest].onset:
                self._earliest_fatal = member_key

    def summary(self) -> str:
        if self.common_cause:
            return (
                f"domain failing together: {len(self.faulted)} of {self.domain_size} nodes "
                f"of {describe(self.common_cause)} faulted at once, a common cause (power, "
                f"cooling, the switch); {len(self.members)} GPU(s) on {len(self.nodes())} node(s)"
            )
        root = self.root
        others = [m for m in self.members.values() if m is not root]
        nodes = {m.node for m in others}
        seen = f"{len(others)} GPU(s) on {len(nodes)} node(s) saw consequences" if others else ""
        if root is None:
            where = f"NVLink domain {self.nvlink_domain}" if self.nvlink_domain else self.key
            head = f"root unknown (domain-level) in {where}"
            return f"{head}: {len(self.members)} GPU(s) on {len(self.nodes())} node(s)"
        head = f"{describe_root(root)} on {root.node} GPU {index_of(root)}"
        return f"{head}; {seen}" if seen else head

    def json(self) -> dict[str, Any]:
        root = self.root
        members = [m.json(self.role(m, root)) for m in self.members.values()]
        nodes: dict[str, Role] = {}
        for member in members:
            previous = nodes.get(member["node"])
            if previous is None or _ROLE_RANK[member["role"]] > _ROLE_RANK[previous]:
                nodes[member["node"]] = member["role"]
        return {
            "id": self.id,
            "cluster": self.cluster,
            "domain": self.key,
            "nvlink_domain": self.nvlink_domain,
            "state": "open" if self.closed_at is None else "closed",
            "first_time": self.first_time,
            "last_time": self.last_time,
            "closed_at": self.closed_at,
            "root": None if root is None else root.json("root"),
            "root_unknown": root is None,
            "summary": self.summary(),
            "counts": {
                "gpus": len(self.members),
                "nodes": len(nodes),
                "records": sum(m.count for m in self.members.values()),
            },
            "members": members,
            "nodes": nodes,
            "approved": list(self.approved),
            "denied": list(self.denied),
            "common_cause": {
                "domain": describe(self.common_cause),
                "nodes_faulted": sorted(self.faulted),
                "domain_nodes": self.domain_size,
                "cordon_node": self.cordon_node,
            }
            if self.common_cause
            else None,
            "merged_into": self.merged_into,
        }


_ROLE_RANK: Final = {"consequence": 0, "unrelated": 1, "root": 2}


def describe_root(root: Member) -> str:
    link = f", link {root.link}" if root.link is not None else ""
    return f"Xid {root.xid}{link}"


def index_of(member: Member) -> str:
    return str(member.index) if member.index is not None else member.gpu


def incident_id(cluster: str, key: str, first_time: float, first_record: str) -> str:
    digest = hashlib.sha256(f"{cluster}\0{key}\0{first_time!r}\0{first_record}".encode())
    return "fi-" + digest.hexdigest()[:12]
