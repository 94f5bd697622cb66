"""Fleet incidents: joining nodes' kernel records by what their GPUs share, choosing the
root by NVIDIA's catalog, and what the cordon arbiter makes of each node."""

from __future__ import annotations

from typing import Any

import pytest

from gpuagent.aggregator.correlate import (
    CONSEQUENCE,
    FATAL,
    LINK_FATAL,
    OTHER,
    Correlator,
    classify,
)
from gpuagent.aggregator.records import NodeRecord, from_online_state
from gpuagent.incidents import SAMPLES

UUID_A = "1b6a4c1e-0000-4000-8000-00000000000a"
UUID_B = "1b6a4c1e-0000-4000-8000-00000000000b"
UUID_C = "1b6a4c1e-0000-4000-8000-00000000000c"
SENTINEL_CLIQUE = 32766
BUSES = [f"0000:{b:02x}:00.0" for b in (0x01, 0x02, 0x41, 0x42)]

# Real GB200 lines (../shared/data/kmsg_corpus.tsv and the public NVL72 incident), with
# the PCI address of each GPU filled in.
LINK_DOWN = "NVRM: Xid (PCI:{pci}): 149, pid=8123, name=python3, NETIR_LINK_EVT Fatal XC0 i0 Link 14 (0x00000001 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"  # noqa: E501
DOWNSTREAM = "NVRM: Xid (PCI:{pci}): 145, pid=8123, name=python3, RLW_TAGSTATE Fatal XC0 i0 Link 03 (0x00000004 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"  # noqa: E501
TEARDOWN = "NVRM: Xid (PCI:{pci}): 45, pid=8123, name=python3, Ch 00000008, errorString CTX SWITCH TIMEOUT, caused by previous Xid 145"  # noqa: E501
RECOVERY = "NVRM: Xid (PCI:{pci}): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"  # noqa: E501
DBE = "NVRM: Xid (PCI:{pci}): 48, pid=2214, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0."  # noqa: E501


def status(
    uuid: str, clique: int, *, job: str | None = None, state: str = "completed"
) -> dict[str, Any]:
    domain = f"{uuid}/{clique}" if state == "completed" and clique else None
    workloads = [{"hpc_job": job}] if job else []
    return {
        "node": {"labels": {"rack": "r1"}},
        "gpus": [
            {
                "index": i,
                "pci_bus_id": bus,
                "uuid": f"GPU-{i}",
                "fabric": {
                    "state": state,
                    "cluster_uuid": uuid,
                    "clique_id": clique,
                    "nvlink_domain": domain,
                },
                "workloads": workloads,
            }
            for i, bus in enumerate(BUSES)
        ],
    }


def report(status_doc: dict[str, Any]) -> NodeRecord:
    """The record of a state report with this status document."""
    message = {"cluster": "c1", "node": "n", "time": 0.0, "status": status_doc}
    return from_online_state(message, "", 0.0)


def record(code: int, line: str, bus: str, time: float, seq: int = 0) -> dict[str, Any]:
    text = line.format(pci=bus[:-2])
    return {
        "id": f"{bus}:{code}:{seq}:{time}",
        "kind": "xid",
        "code": code,
        "gpu": bus,
        "time": time,
        "line": text,
    }


def correlator(**kwargs: Any) -> Correlator:
    return Correlator(join_window_seconds=30.0, settle_seconds=10.0, **kwargs)


def rack(c: Correlator, uuid: str, nodes: list[str], clique: int = SENTINEL_CLIQUE) -> None:
    for node in nodes:
        c.observe_state("c1", node, report(status(uuid, clique, job="4242")))


def cascade(c: Correlator, nodes: list[str], start: float) -> None:
    """One GPU's link goes down; every other GPU of the job on the other nodes logs the
    downstream errors within 7 s."""
    root_node = nodes[0]
    c.observe_record("c1", root_node, record(149, LINK_DOWN, BUSES[0], start), start)
    for n, node in enumerate(nodes[1:]):
        for g, bus in enumerate(BUSES):
            t = start + 0.5 + n * 0.4 + g * 0.01
            for code, line in ((145, DOWNSTREAM), (45, TEARDOWN), (154, RECOVERY)):
                c.observe_record("c1", node, record(code, line, bus, t), t)


@pytest.mark.parametrize(
    ("code", "line", "weight"),
    [
        (149, LINK_DOWN, LINK_FATAL),
        (145, DOWNSTREAM, CONSEQUENCE),
        (45, TEARDOWN, CONSEQUENCE),
        (154, RECOVERY, CONSEQUENCE),
        (48, DBE, FATAL),
        (149, "NVRM: Xid (PCI:0000:01:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 02", OTHER),
        # ../shared/data/kmsg_corpus.tsv
        (
            149,
            "NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",  # noqa: E501
            LINK_FATAL,
        ),
        (
            149,
            "NVRM: Xid (PCI:0018:01:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00086226 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)",  # noqa: E501
            OTHER,
        ),
        (
            149,
            "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",  # noqa: E501
            LINK_FATAL,
        ),
        (
            145,
            "NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 00 (0x00000000 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",  # noqa: E501
            CONSEQUENCE,
        ),
        (79, "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.", FATAL),
        (13, "NVRM: Xid (PCI:0000:01:00): 13, Graphics Exception: ESR 0x404490=0x80000001", OTHER),
        (
            43,
            "NVRM: Xid (PCI:0000:01:00): 43, pid=1, name=x, Ch 00000010, caused by previous Xid 48",
            CONSEQUENCE,
        ),
    ],
)
def test_records_are_weighed_by_the_catalog(code: int, line: str, weight: int) -> None:
    assert classify(code, line.format(pci="0000:01:00")) == weight


def test_a_rack_cascade_is_one_incident_with_the_link_down_gpu_as_root() -> None:
    c = correlator()
    nodes = [f"gb-{n:02d}" for n in range(16)]
    rack(c, UUID_A, nodes)
    cascade(c, nodes, 1000.0)
    changed = c.tick(1008.0)
    assert len(changed) == 1
    doc = changed[0].json()
    assert doc["root"]["node"] == "gb-00"
    assert doc["root"]["index"] == 0
    assert doc["root"]["xid"] == 149
    assert doc["root"]["link"] == 14
    assert doc["nvlink_domain"] == f"{UUID_A}/{SENTINEL_CLIQUE}"
    assert doc["counts"] == {"gpus": 61, "nodes": 16, "records": 1 + 60 * 3}
    roles = [m["role"] for m in doc["members"]]
    assert roles.count("root") == 1
    assert roles.count("consequence") == 60
    assert "Xid 149, link 14 on gb-00 GPU 0" in doc["summary"]
    # The arbiter: the root's node is for the budget, every other node is denied.
    assert not c.verdict("c1", "gb-00", 0.0).deny
    for node in nodes[1:]:
        verdict = c.verdict("c1", node, 0.0)
        assert verdict.deny
        assert verdict.reason.startswith("consequence of Xid 149, link 14 on gb-00 GPU 0")


def test_two_cascades_in_two_domains_are_two_incidents() -> None:
    c = correlator()
    first, second = [f"a{n}" for n in range(8)], [f"b{n}" for n in range(8)]
    rack(c, UUID_A, first)
    rack(c, UUID_B, second)
    cascade(c, first, 1000.0)
    cascade(c, second, 1001.0)
    docs = sorted((i.json() for i in c.tick(1010.0)), key=lambda d: d["root"]["node"])
    assert [d["root"]["node"] for d in docs] == ["a0", "b0"]
    assert {d["counts"]["nodes"] for d in docs} == {8}


def test_racks_sharing_the_sentinel_clique_are_never_joined() -> None:
    c = correlator()
    racks = {u: [f"{u[-1]}{n}" for n in range(4)] for u in (UUID_A, UUID_B, UUID_C)}
    for uuid, nodes in racks.items():
        rack(c, uuid, nodes, SENTINEL_CLIQUE)
        c.observe_state("c1", nodes[0], report(status(uuid, SENTINEL_CLIQUE)))  # no job
    for n, nodes in enumerate(racks.values()):
        t = 1000.0 + n
        for node in nodes:
            c.observe_record("c1", node, record(145, DOWNSTREAM, BUSES[1], t), t)
    docs = [i.json() for i in c.tick(1005.0)]
    assert len(docs) == 3
    assert sorted(d["nvlink_domain"] for d in docs) == sorted(
        f"{u}/{SENTINEL_CLIQUE}" for u in racks
    )


def test_a_node_moved_to_another_domain_joins_only_the_new_one() -> None:
    c = correlator()
    rack(c, UUID_A, ["gb-00", "gb-01"])
    rack(c, UUID_A, ["gb-00", "gb-01"])  # the same reports again: nothing changes
    assert c.hold_until("c1", "gb-00", 1000.0) == 1010.0
    c.observe_state("c1", "gb-01", report(status(UUID_B, SENTINEL_CLIQUE)))  # re-cabled
    assert c.hold_until("c1", "gb-00", 1000.0) is None  # alone in its domain now
    c.observe_record("c1", "gb-00", record(149, LINK_DOWN, BUSES[0], 1000.0), 1000.0)
    c.observe_record("c1", "gb-01", record(145, DOWNSTREAM, BUSES[0], 1001.0), 1001.0)
    assert sorted(i.key for i in c.tick(1002.0)) == [
        f"nvlink:{UUID_A}/{SENTINEL_CLIQUE}",
        f"nvlink:{UUID_B}/{SENTINEL_CLIQUE}",
    ]


def test_every_link_down_at_once_is_one_domain_level_incident() -> None:
    c = correlator()
    nodes = [f"gb-{n:02d}" for n in range(18)]
    rack(c, UUID_A, nodes)
    for n, node in enumerate(nodes):
        for g, bus in enumerate(BUSES):
            t = 1000.0 + n * 0.05 + g * 0.01
            c.observe_record("c1", node, record(149, LINK_DOWN, bus, t), t)
    (incident,) = c.tick(1005.0)
    doc = incident.json()
    assert doc["root"] is None
    assert doc["root_unknown"]
    assert doc["counts"]["gpus"] == 72
    assert "root unknown (domain-level)" in doc["summary"]
    verdict = c.verdict("c1", "gb-07", 0.0)
    assert not verdict.deny  # the fleet budget caps these
    assert "root unknown (domain-level)" in verdict.reason


def test_an_unrelated_fault_in_the_same_window_stays_its_own_incident() -> None:
    c = correlator()
    nodes = [f"gb-{n:02d}" for n in range(4)]
    rack(c, UUID_A, nodes)
    cascade(c, nodes, 1000.0)
    c.observe_record("c1", "gb-03", record(48, DBE, BUSES[2], 1002.0), 1002.0)
    docs = {d["root"]["xid"]: d for d in (i.json() for i in c.tick(1003.0))}
    assert set(docs) == {149, 48}
    assert docs[48]["root"]["node"] == "gb-03"
    assert docs[48]["counts"]["gpus"] == 1
    # gb-03 has a fault of its own: the budget decides it, no denial.
    assert not c.verdict("c1", "gb-03", 0.0).deny


def test_without_a_shared_domain_or_job_each_node_is_its_own_incident() -> None:
    c = correlator()
    for node in ("h1", "h2"):
        c.observe_state("c1", node, report({}))
        c.observe_record("c1", node, record(48, DBE, BUSES[0], 1000.0), 1000.0)
    docs = [i.json() for i in c.tick(1001.0)]
    assert sorted(d["domain"] for d in docs) == ["node:h1", "node:h2"]
    assert c.hold_until("c1", "h1", 1001.0) is None


def test_a_job_joins_gpus_without_an_nvlink_domain() -> None:
    c = correlator()
    for node in ("h1", "h2"):
        c.observe_state("c1", node, report(status("", 0, job="77", state="not_supported")))
    c.observe_record("c1", "h1", record(48, DBE, BUSES[0], 1000.0), 1000.0)
    c.observe_record("c1", "h2", record(45, TEARDOWN, BUSES[0], 1001.0), 1001.0)
    (incident,) = c.tick(1002.0)
    assert incident.key == "job:slurm:77"
    assert incident.json()["nodes"] == {"h1": "root", "h2": "consequence"}
    assert c.verdict("c1", "h2", 0.0).deny


def test_labels_join_consequences_only_when_declared() -> None:
    for labels, expected in (((), 2), (("rack",), 1)):
        c = correlator(join_labels=labels)
        for node in ("h1", "h2"):
            c.observe_state("c1", node, report({"node": {"labels": {"rack": "r1"}}}))
            c.observe_record("c1", node, record(45, TEARDOWN, BUSES[0], 1000.0), 1000.0)
        assert len(c.tick(1001.0)) == expected


def test_a_request_in_a_shared_domain_waits_for_the_domain_to_settle() -> None:
    c = correlator()
    nodes = ["gb-00", "gb-01"]
    rack(c, UUID_A, nodes)
    # Before any record: the node's own records may still be on their way.
    assert c.hold_until("c1", "gb-00", 1000.0) == 1010.0
    c.observe_record("c1", "gb-00", record(149, LINK_DOWN, BUSES[0], 1000.0), 1000.0)
    assert c.hold_until("c1", "gb-01", 1004.0) == 1010.0
    assert c.hold_until("c1", "gb-01", 1010.5) is None


def test_incidents_close_after_the_join_window_and_leave_memory() -> None:
    c = correlator()
    nodes = ["gb-00", "gb-01"]
    rack(c, UUID_A, nodes)
    cascade(c, nodes, 1000.0)
    assert len(c.tick(1001.0)) == 1
    assert c.tick(1010.0) == []  # nothing changed
    (closed,) = c.tick(1040.0)
    assert closed.json()["state"] == "closed"
    assert list(c.open_incidents()) == []
    assert c.verdict("c1", "gb-01", 0.0).reason == ""
    # A record after the window opens a new incident.
    c.observe_record("c1", "gb-01", record(145, DOWNSTREAM, BUSES[1], 1050.0), 1050.0)
    (again,) = c.tick(1051.0)
    assert again.id != closed.id


def test_a_storm_folded_on_the_node_counts_its_records() -> None:
    c = correlator()
    rack(c, UUID_A, ["gb-00"])
    # The node sends an incident's first records (its samples) on their own, then its
    # growing total.
    samples = [record(45, TEARDOWN, BUSES[0], 1000.0, seq=n) for n in range(SAMPLES)]
    for sample in samples:
        c.observe_record("c1", "gb-00", sample, 1000.0)
    first = samples[0]
    for count in (3, 500, 2000, 100_000):
        grown = dict(first, incident={"id": first["id"], "count": count})
        c.observe_record("c1", "gb-00", grown, 1001.0)
    (incident,) = c.tick(1002.0)
    assert incident.json()["counts"]["records"] == 100_000
