"""Fleet incidents: what many nodes see of one fault, joined into one, with its root named.

When one GPU of an NVLink domain loses a link, every GPU of the job on every tray logs the
consequences (Xid 145 downstream, Xid 45 "caused by previous Xid 149", Xid 154 recovery
changes). Each node reports its own kernel records; here the records of GPUs that share
something join one fleet incident, within ``join_window_seconds`` of each other:

- by NVLink domain first (the pair cluster UUID / clique id the GPU's fabric reports: a
  clique id alone is shared by unrelated racks, and an unassigned GPU joins nothing);
- then, for a GPU without one, by the job it serves (Slurm job, Kubernetes pod);
- then, for a consequence on a GPU with neither, by a declared label of its node
  (``[aggregator.correlation] join_labels``, e.g. rack);
- else the record is its node's own incident.

The root follows NVIDIA's catalog: a fatal NVLink5 link error (Xid 144-150 but 145, the
line saying Fatal or link down) on exactly one GPU is the root; on several at once no GPU
is ("root unknown (domain-level)": a switch tray, a rack's power); without one, the
earliest other fatal XID is. Xid 145, 45, 154 and any "caused by previous Xid N" are
consequences. A fatal XID of another GPU, once a root is known, is a fault of its own:
its own incident.

Faults of their own on half the nodes of a declared domain (a rack, leaf or power label)
within minutes are one incident with no GPU root, and the arbiter lets one of its nodes be
cordoned (`domainfail`).

Cost: each record touches one incident through dictionaries keyed by its domain, job or
label; incidents close ``join_window_seconds`` after their last record and leave memory.
Nothing here reads history, so the cost per record does not depend on how much is kept.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from typing import Any, Final

from gpuagent.aggregator.domainfail import Crossing, DomainFailures, describe
from gpuagent.aggregator.fleetincident import (
    CONSEQUENCE,
    FATAL,
    LINK_FATAL,
    OTHER,
    FleetIncident,
    Member,
    Verdict,
    describe_root,
    incident_id,
    index_of,
)
from gpuagent.aggregator.records import NodeRecord
from gpuagent.incidents import SAMPLES
from gpuagent.kernel.xid import caused_by, lookup

# Downstream of a link failure elsewhere in the domain (NVIDIA's catalog).
DOWNSTREAM_XIDS: Final = frozenset({45, 145, 154})
NVLINK5_XIDS: Final = frozenset(range(144, 151))
# The immediate actions that mean the GPU itself is at fault.
_FATAL_ACTIONS: Final = frozenset(
    {"RESET_GPU", "RESTART_BM", "RESTART_VM", "CONTACT_SUPPORT", "CHECK_MECHANICALS"}
)
# Fatal by the catalog's decode workflow: a DBE, an NVLink error.
_FATAL_WORKFLOW_XIDS: Final = frozenset({48, 74})
_LINK = re.compile(r"\bLink (\d+)")  # "Link -1": the unit, no one link
_FATAL_WORD = re.compile(r"\bFatal\b")  # not "Nonfatal"
# Node incidents remembered per GPU to turn their growing counts into record counts.
_NODE_INCIDENTS_KEPT = 64
# A growing incident's document is rewritten (stored, pushed) at most this often; a new,
# closed or newly decided one at the next tick.
REWRITE_SECONDS = 5.0


def classify(xid: int, line: str) -> int:
    """OTHER, CONSEQUENCE, FATAL or LINK_FATAL for an XID record's code and text."""
    if xid in DOWNSTREAM_XIDS or caused_by(line) is not None:
        return CONSEQUENCE
    if xid in NVLINK5_XIDS:
        return LINK_FATAL if _FATAL_WORD.search(line) or "LINK_DOWN" in line else OTHER
    if xid in _FATAL_WORKFLOW_XIDS:
        return FATAL
    info = lookup(xid)
    return FATAL if info is not None and info.action in _FATAL_ACTIONS else OTHER


# What a node's state report says a GPU shares with others: (index, UUID, NVLink domain
# "<cluster UUID>/<clique id>", job "slurm:<id>" or "pod:<namespace>/<name>", and the key
# its records join under by what it shares: "nvlink:<domain>", else "job:<job>", else
# None). A plain tuple of strings and numbers, because 10,000 nodes keep 80,000 of them:
# the garbage collector stops tracking such tuples (not a NamedTuple), so full collections
# do not walk them. The join key is made once per change, not per record.
GpuPlace = tuple[int | None, str, str | None, str | None, str | None]
# What a state report says that the places come from: its labels and each GPU's (bus id,
# index, UUID, NVLink domain, job); compared first, so an unchanged report (nearly all of
# them) builds nothing.
Signature = tuple[tuple[tuple[str, str], ...], tuple[tuple[str, int | None, str, str, str], ...]]
# A node's (signature, GPU places by bus id, labels): a plain tuple of untracked parts as
# well, so the 10,000 nodes' places leave the collector's full collections once built.
NodePlaces = tuple[Signature, dict[str, GpuPlace], dict[str, str]]

# A node that has not reported yet shares nothing.
_NOWHERE: Final[NodePlaces] = (((), ()), {}, {})


def _signature(record: NodeRecord) -> Signature:
    """What the node's places are built from, to compare with the last report's."""
    return (
        record.labels,
        tuple([(g.pci_bus_id, g.index, g.uuid, g.nvlink_domain, g.job) for g in record.gpus]),
    )


def _places_from(signature: Signature) -> NodePlaces:
    labels, gpus = signature
    places: dict[str, GpuPlace] = {}
    for bus, index, uuid, domain, job in gpus:
        if bus:
            key = f"nvlink:{domain}" if domain else f"job:{job}" if job else None
            places[bus] = (index, uuid, domain or None, job or None, key)
    return (signature, places, dict(labels))


class Correlator:
    """The open fleet incidents, fed with state reports and kernel records."""

    def __init__(
        self,
        *,
        join_window_seconds: float,
        settle_seconds: float,
        join_labels: Iterable[str] = (),
        domain_labels: Iterable[str] = (),
        domain_window_seconds: float = 300.0,
        domain_fraction: float = 0.5,
    ) -> None:
        self.domains = DomainFailures(
            domain_labels, window=domain_window_seconds, fraction=domain_fraction
        )
        self.window = join_window_seconds
        self.settle = settle_seconds
        self.join_labels = tuple(join_labels)
        self._places: dict[tuple[str, str], NodePlaces] = {}
        # (cluster, NVLink domain) -> the nodes with a GPU in it
        self._domain_nodes: dict[tuple[str, str], set[str]] = {}
        # (cluster, key) -> the open incident joining records under that key
        self._open: dict[tuple[str, str], FleetIncident] = {}
        # (cluster, node) -> the open incidents it is a member of
        self._of_node: dict[tuple[str, str], set[FleetIncident]] = {}
        self._changed: dict[str, FleetIncident] = {}
        self.opened = 0  # incidents opened since start (a counter for the metrics)

    # --- what nodes share ------------------------------------------------------------------

    def observe_state(self, cluster: str, node: str, record: NodeRecord) -> None:
        """What an online state report says the node's GPUs share, and its labels."""
        key = (cluster, node)
        previous = self._places.get(key)
        signature = _signature(record)
        if previous is not None and previous[0] == signature:
            return
        places = _places_from(signature)
        old = _domains(previous)
        new = _domains(places)
        for domain in old - new:
            nodes = self._domain_nodes.get((cluster, domain))
            if nodes is not None:
                nodes.discard(node)
                if not nodes:
                    del self._domain_nodes[(cluster, domain)]
        for domain in new - old:
            nodes = self._domain_nodes.get((cluster, domain))
            if nodes is None:
                self._domain_nodes[(cluster, domain)] = {node}
            else:
                nodes.add(node)
        self._places[key] = places
        # Jobs and NVLink domains join their records themselves; a declared label's
        # nodes share nothing else, so their own faults are counted by the domain.
        labels = self.domains.labels
        self.domains.observe(
            cluster,
            node,
            frozenset(f"label:{n}={v}" for n, v in signature[0] if n in labels),
        )

    # --- records ---------------------------------------------------------------------------

    def observe_record(self, cluster: str, node: str, data: dict[str, Any], now: float) -> None:
        """One kernel record (an event message's data) of ``node``; XIDs only: SXids, AER
        and the rest stay the node's. Runs for every record of a storm: one lookup of the
        node's places, the join key made when the places changed."""
        if data.get("kind") != "xid":
            return
        code, gpu, line = data.get("code"), data.get("gpu"), data.get("line")
        if not isinstance(code, int) or not isinstance(gpu, str):
            return
        weight = classify(code, line if isinstance(line, str) else "")
        _, gpus, labels = self._places.get((cluster, node), _NOWHERE)
        place = gpus.get(gpu)
        if place is None or place[4] is None:
            key = self._local_key(cluster, node, labels, weight, now)
        else:
            key = place[4]
            if weight >= FATAL and place[2] is None:
                # A job's GPU: a fault of the node's own (an NVLink domain's records have
                # their root there): does a domain it is declared in fail together?
                self._fault(cluster, node, now)
        incident = self._open.get((cluster, key))
        if incident is not None and now - incident.last_time > self.window:
            self._close(incident, incident.last_time + self.window)
            incident = None
        if (
            incident is not None
            and weight == FATAL
            and incident.root is not None
            and incident.root is not incident.members.get((node, gpu))
        ):
            # Another GPU's own fault in the same window: an incident of its own.
            key = f"gpu:{node}/{gpu}"
            incident = self._open.get((cluster, key))
        if incident is None:
            record_id = data.get("id")
            first = str(record_id) if record_id is not None else f"{node}/{gpu}/{code}"
            incident = FleetIncident(incident_id(cluster, key, now, first), cluster, key, now, now)
            self._open[(cluster, key)] = incident
            self.opened += 1
        self._add(
            incident, cluster=cluster, node=node, gpu=gpu, place=place, code=code,
            weight=weight, data=data, now=now,
        )  # fmt: skip

    def _local_key(
        self, cluster: str, node: str, labels: dict[str, str], weight: int, now: float
    ) -> str:
        """The join key of a record on a GPU that shares no NVLink domain or job: a
        declared label for a consequence, a domain failing together, else the node."""
        if weight <= CONSEQUENCE:
            for name in self.join_labels:
                if labels.get(name):
                    return f"label:{name}={labels[name]}"
        if weight >= FATAL:
            self._fault(cluster, node, now)
        return self._failing(cluster, node) or f"node:{node}"

    # --- domains failing together ----------------------------------------------------

    def observe_fault(self, cluster: str, node: str, now: float) -> None:
        """A fault the node judged (a cordon request): its own, unless the node is in an
        NVLink domain (whose records say where the fault is)."""
        _, gpus, _ = self._places.get((cluster, node), _NOWHERE)
        if any(place[2] for place in gpus.values()):
            return
        self._fault(cluster, node, now)
        incident = self._open.get((cluster, self._failing(cluster, node) or ""))
        if incident is not None and node not in incident.nodes():
            self._node_member(incident, cluster, node, now)

    def _fault(self, cluster: str, node: str, now: float) -> None:
        for crossing in self.domains.fault(cluster, node, now):
            self._open_domain(cluster, crossing, now)
        for key in self.domains.keys_of(cluster, node):
            incident = self._open.get((cluster, f"domain:{key}"))
            if incident is not None:
                incident.faulted |= {node}

    def _failing(self, cluster: str, node: str) -> str | None:
        """The key of an open domain incident the node's domains are in."""
        for key in self.domains.keys_of(cluster, node):
            if (cluster, f"domain:{key}") in self._open:
                return f"domain:{key}"
        return None

    def _open_domain(self, cluster: str, crossing: Crossing, now: float) -> None:
        """Half a domain faulted: one incident; the own incidents of its faulted nodes
        are merged into it (closed, saying where they went)."""
        key = f"domain:{crossing.key}"
        if (cluster, key) in self._open:
            return
        incident = FleetIncident(
            incident_id(cluster, key, now, ",".join(crossing.nodes)), cluster, key, now, now,
            common_cause=crossing.key, domain_size=crossing.size, faulted=frozenset(crossing.nodes),
            cordon_node=self.domains.cordoned_node(cluster, crossing.key, now),
        )  # fmt: skip
        self._open[(cluster, key)] = incident
        self.opened += 1
        for node in crossing.nodes:
            for own in list(self._of_node.get((cluster, node), ())):
                if own.key.startswith(("node:", "gpu:")):
                    self._merge(own, incident, now)
            if node not in incident.nodes():
                self._node_member(incident, cluster, node, now)
        self._changed[incident.id] = incident

    def _merge(self, own: FleetIncident, into: FleetIncident, now: float) -> None:
        for member_key, member in own.members.items():
            into.members.setdefault(member_key, member)
        into.first_time = min(into.first_time, own.first_time)
        self._close(own, now)
        own.merged_into = into.id
        for node in into.nodes():
            self._of_node.setdefault((into.cluster, node), set()).add(into)

    def _node_member(self, incident: FleetIncident, cluster: str, node: str, now: float) -> None:
        """A node in the incident by a fault it judged itself (no GPU record here)."""
        incident.members[(node, "")] = Member(
            node=node, gpu="", index=None, uuid="", first_time=now, last_time=now,
            weight=FATAL, xid=0, onset=now,
        )  # fmt: skip
        self._of_node.setdefault((cluster, node), set()).add(incident)
        self._changed[incident.id] = incident

    def _domain_verdict(self, incident: FleetIncident, node: str, ids: tuple[str, ...]) -> Verdict:
        """At most one node of a domain failing together is cordoned."""
        if incident.cordon_node in {None, node}:
            incident.cordon_node = node
            return Verdict(
                deny=False,
                reason=f"the one node cordoned for fleet incident {incident.id} "
                f"({describe(incident.common_cause)} failing together)",
                incidents=ids,
            )
        return Verdict(
            deny=True,
            reason=f"{incident.summary()}; only {incident.cordon_node} is cordoned for it "
            f"(fleet incident {incident.id}); see the rack and facility runbook",
            incidents=ids,
        )

    def _add(
        self,
        incident: FleetIncident,
        *,
        cluster: str,
        node: str,
        gpu: str,
        place: GpuPlace | None,
        code: int,
        weight: int,
        data: dict[str, Any],
        now: float,
    ) -> None:
        member_key = (node, gpu)
        member = incident.members.get(member_key)
        if member is None:
            member = Member(
                node=node,
                gpu=gpu,
                index=None if place is None else place[0],
                uuid="" if place is None else place[1],
                first_time=now,
                last_time=now,
                weight=weight,
                xid=code,
                onset=_onset(data, now),
            )
            incident.members[member_key] = member
            incident.members.pop((node, ""), None)  # a GPU record now stands for the node
            of_node = self._of_node.get((cluster, node))
            if of_node is None:
                self._of_node[(cluster, node)] = {incident}
            else:
                of_node.add(incident)
            if weight >= FATAL:
                incident.take(member_key, weight)
        elif weight > member.weight:
            member.weight, member.xid, member.onset = weight, code, _onset(data, now)
            incident.take(member_key, weight)
        if weight >= FATAL and weight == member.weight and member.link is None:
            line = data.get("line")
            found = _LINK.search(line) if isinstance(line, str) else None
            member.link = int(found[1]) if found else None
        member.count += _new_records(member, data)
        member.last_time = max(member.last_time, now)
        incident.last_time = max(incident.last_time, now)
        self._changed[incident.id] = incident

    # --- the arbiter's questions -----------------------------------------------------------

    def hold_until(self, cluster: str, node: str, now: float) -> float | None:
        """Until when a cordon request of ``node`` waits for its domain's records to
        settle; None: decide now. A node in an NVLink domain with other nodes waits
        ``settle_seconds`` from the domain's incident's first record (or from now, when
        none has come yet: the node's own records may still be on their way); so does a
        member of any incident that spans nodes."""
        starts = [
            incident.first_time
            for incident in self._of_node.get((cluster, node), ())
            if len(incident.nodes()) > 1
        ]
        for domain in _domains(self._places.get((cluster, node))):
            if len(self._domain_nodes.get((cluster, domain), ())) > 1:
                incident = self._open.get((cluster, f"nvlink:{domain}"))
                starts.append(now if incident is None else incident.first_time)
        if not starts:
            return None
        until = min(starts) + self.settle
        return until if until > now else None

    def verdict(self, cluster: str, node: str, now: float) -> Verdict:
        """Deny a node whose every open incident has its root on another node, and all
        but one node of a domain failing together; anything else (a root, a fault of its
        own, no GPU root) is for the budget to decide."""
        incidents = sorted(self._of_node.get((cluster, node), ()), key=lambda i: i.first_time)
        ids = tuple(i.id for i in incidents)
        for incident in incidents:
            if incident.common_cause:
                return self._domain_verdict(incident, node, ids)
        verdict = self._by_root(node, incidents, ids)
        if verdict.deny:
            return verdict
        # The root of what other nodes saw is cordoned whatever its neighbours did.
        shared_root = any(len(i.nodes()) > 1 and i.node_role(node) == "root" for i in incidents)
        other = None if shared_root else self.domains.others_cordoned(cluster, node, now)
        if other is not None:
            key, cordoned = other
            return Verdict(
                deny=True,
                reason=f"{cordoned} of {describe(key)} was cordoned for a fault within "
                f"{self.domains.window:g} s: a second node of the domain waits (if half of "
                "it fails, that is a domain failing together); ask again later",
                incidents=ids,
            )
        self.domains.cordoned(cluster, node, now)
        return verdict

    @staticmethod
    def _by_root(node: str, incidents: list[FleetIncident], ids: tuple[str, ...]) -> Verdict:
        if not incidents:
            return Verdict(deny=False, reason="")
        roles = [(i, i.node_role(node)) for i in incidents]
        for incident, role in roles:
            if role == "root":
                return Verdict(
                    deny=False, reason=f"root of fleet incident {incident.id}", incidents=ids
                )
            if role == "unrelated":
                return Verdict(
                    deny=False, reason=f"own fault in fleet incident {incident.id}", incidents=ids
                )
        for incident, _ in roles:
            if incident.domain_level:
                return Verdict(
                    deny=False,
                    reason=f"fleet incident {incident.id}: root unknown (domain-level); "
                    "see the rack and NVSwitch runbook",
                    incidents=ids,
                )
        incident = roles[0][0]
        root = incident.root
        assert root is not None  # not domain-level
        return Verdict(
            deny=True,
            reason=f"consequence of {describe_root(root)} on {root.node} GPU {index_of(root)} "
            f"(fleet incident {incident.id})",
            incidents=ids,
        )

    def decided(self, cluster: str, node: str, incidents: Iterable[str], approved: bool) -> None:
        """Note a cordon decision in the incidents it was made for."""
        wanted = set(incidents)
        for incident in self._of_node.get((cluster, node), ()):
            if incident.id in wanted:
                if approved:
                    incident.approved += (node,)
                else:
                    incident.denied += (node,)
                incident.urgent = True
                self._changed[incident.id] = incident

    # --- time ------------------------------------------------------------------------------

    def tick(self, now: float) -> list[FleetIncident]:
        """Close incidents quiet for the join window; what changed since the last tick
        and is due to be written (a growing incident every `REWRITE_SECONDS`)."""
        for incident in [i for i in self._open.values() if now - i.last_time > self.window]:
            self._close(incident, now)
        due = [
            incident
            for incident in self._changed.values()
            if incident.urgent
            or incident.written_at is None
            or now - incident.written_at >= REWRITE_SECONDS
        ]
        for incident in due:
            incident.written_at, incident.urgent = now, False
            del self._changed[incident.id]
        return due

    def _close(self, incident: FleetIncident, when: float) -> None:
        incident.closed_at = when
        incident.urgent = True
        self._open.pop((incident.cluster, incident.key), None)
        for node in incident.nodes():
            of_node = self._of_node.get((incident.cluster, node))
            if of_node is not None:
                of_node.discard(incident)
                if not of_node:
                    del self._of_node[(incident.cluster, node)]
        self._changed[incident.id] = incident

    def open_incidents(self) -> Iterator[FleetIncident]:
        return iter(list(self._open.values()))


def _domains(places: NodePlaces | None) -> set[str]:
    if places is None:
        return set()
    _, gpus, _ = places
    return {place[2] for place in gpus.values() if place[2]}


def _onset(data: dict[str, Any], now: float) -> float:
    """The record's own time, which orders onsets (reports of several nodes arrive in any
    order); the window runs on arrival times."""
    sent = data.get("time")
    return float(sent) if isinstance(sent, int | float) and math.isfinite(sent) else now


def _new_records(member: Member, data: dict[str, Any]) -> int:
    """How many kernel records this message adds. A record on its own is one. A node
    incident that grew (a storm folded on the node) says its total: its first `SAMPLES`
    records came on their own already, so it adds what its total grew past those and past
    the total it said last."""
    incident = data.get("incident")
    if not isinstance(incident, dict):
        return 1
    node_id, count = incident.get("id"), incident.get("count")
    if not isinstance(node_id, str) or not isinstance(count, int):
        return 1
    kept = member.node_incidents
    if kept is None:
        kept = member.node_incidents = {}
    before = kept.pop(node_id, 0)  # re-inserted: the newest last
    if len(kept) >= _NODE_INCIDENTS_KEPT:
        kept.pop(next(iter(kept)))
    kept[node_id] = max(before, count)
    return max(0, count - max(before, min(count, SAMPLES)))
