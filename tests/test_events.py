"""The event log: de-duplication across sources and re-reads, retention, counts."""

from __future__ import annotations

from typing import Any

import pytest

from gpuagent.config import EventsSection
from gpuagent.events import Added, EventLog, is_reset, reset_event
from gpuagent.incidents import MAX_OPEN, SAMPLES
from gpuagent.model import GpuEvent

BUS = "0000:3b:00.0"


def event(
    event_id: str,
    *,
    source: str = "kmsg",
    kind: str = "xid",
    code: int | None = 79,
    gpu: str | None = BUS,
    at: float = 100.0,
    **extra: Any,
) -> GpuEvent:
    return GpuEvent(
        event_id=event_id,
        source=source,
        kind=kind,
        gpu=gpu,  # type: ignore[arg-type]
        time=1e9 + at,
        monotonic=at,
        code=code,
        **extra,
    )


def test_same_id_is_recorded_once() -> None:
    log = EventLog(EventsSection())
    assert log.add(event("kmsg:b:1"))
    assert not log.add(event("kmsg:b:1"))
    assert len(log.recent()) == 1
    assert log.duplicates == 1


@pytest.mark.parametrize(
    ("second", "kept"),
    [
        pytest.param(
            event("nvml:x", source="nvml", at=105.0), False, id="nvml-after-kmsg-within-window"
        ),
        pytest.param(
            event("nvml:x", source="nvml", at=95.0), False, id="nvml-slightly-earlier-clock"
        ),
        pytest.param(event("nvml:x", source="nvml", at=111.0), True, id="outside-window"),
        pytest.param(event("nvml:x", source="nvml", code=48), True, id="other-xid"),
        pytest.param(event("nvml:x", source="nvml", gpu="0000:5d:00.0"), True, id="other-gpu"),
        pytest.param(event("kmsg:b:2", at=101.0), True, id="same-source-repeats-are-real"),
    ],
)
def test_one_fault_seen_by_both_sources_is_one_event(second: GpuEvent, kept: bool) -> None:
    log = EventLog(EventsSection(dedup_window_seconds=10))
    log.add(event("kmsg:b:1"))
    assert bool(log.add(second)) is kept
    assert len(log.recent()) == (2 if kept else 1)


KERNEL_LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=train, GPU has fallen off the bus."


@pytest.mark.parametrize("kernel_source", ["kmsg", "drill"])
@pytest.mark.parametrize("nvml_first", [True, False], ids=["nvml-first", "kernel-first"])
def test_the_one_event_keeps_the_kernel_lines_content_whichever_came_first(
    nvml_first: bool, kernel_source: str
) -> None:
    log = EventLog(EventsSection(dedup_window_seconds=10))
    nvml = event("nvml:x", source="nvml", at=100.0, line="Xid 79 (NVML event)")
    kernel = event(
        "kmsg:b:1",
        source=kernel_source,
        at=101.0,
        line=KERNEL_LINE,
        pid=4242,
        process="train",
        workloads="job 42",
    )
    first, second = (nvml, kernel) if nvml_first else (kernel, nvml)
    log.add(event("kmsg:b:0", kind="aer", code=None, at=99.0))  # not the XID's record
    assert log.add(first)
    assert not log.add(second)
    (kept,) = [e for e in log.recent() if e.kind == "xid"]
    # The first one's id (it may be on its way to the fleet), the kernel line's content.
    assert kept.event_id == first.event_id
    assert (kept.source, kept.line, kept.pid, kept.process, kept.workloads) == (
        kernel_source,
        KERNEL_LINE,
        4242,
        "train",
        "job 42",
    )
    assert log.duplicates == 1


def test_retention_by_age_and_count_keeps_counts() -> None:
    log = EventLog(EventsSection(retention_seconds=60, max_events=3))
    for i in range(5):
        log.add(event(f"kmsg:b:{i}", at=100.0 + i))
    assert [e.event_id for e in log.recent()] == ["kmsg:b:2", "kmsg:b:3", "kmsg:b:4"]
    log.prune(200.0)
    assert log.recent() == ()
    (count,) = log.counts()
    assert (count.gpu, count.kind, count.code, count.count) == (BUS, "xid", 79, 5)


def test_counts_split_by_kind_code_and_aer_severity() -> None:
    log = EventLog(EventsSection())
    log.add(event("a", code=13))
    log.add(event("b", code=13, at=200))
    log.add(event("c", kind="aer", code=None, aer_severity="corrected"))
    log.add(event("d", kind="aer", code=None, aer_severity="fatal"))
    counts = {(c.kind, c.code, c.aer_severity): c.count for c in log.counts()}
    assert counts == {
        ("xid", 13, None): 2,
        ("aer", None, "corrected"): 1,
        ("aer", None, "fatal"): 1,
    }


def test_recent_is_the_same_tuple_until_something_changes() -> None:
    log = EventLog(EventsSection())
    log.add(event("a"))
    first = log.recent()
    assert log.recent() is first
    log.add(event("b", code=13))
    assert log.recent() is not first


def test_latest_newest_first_with_filter() -> None:
    log = EventLog(EventsSection())
    for i in range(4):
        log.add(event(f"e{i}", code=i, gpu=BUS if i % 2 else None))
    assert [e.code for e in log.latest(10)] == [3, 2, 1, 0]
    assert [e.code for e in log.latest(1, lambda e: e.gpu == BUS)] == [3]


def test_a_reset_clears_the_gpus_earlier_faults_even_those_that_arrive_late() -> None:
    log = EventLog(EventsSection())
    assert log.add(event("kmsg:b:1", code=48, at=90.0))
    assert log.add(event("kmsg:b:2", kind="aer", code=None, at=91.0))
    assert log.forget(BUS, 110.0, frozenset({"xid", "gsp"})) == 1
    # Stamped during the reset, read after it returned: cleared all the same...
    assert log.add(event("nvml:late", source="nvml", code=48, at=109.0))
    # ...but a fault after the reset, another kind, another GPU are kept.
    assert log.add(event("kmsg:b:3", code=48, at=125.0))
    assert log.add(event("kmsg:b:4", kind="aer", code=None, at=109.5))
    assert log.add(event("kmsg:b:5", code=48, gpu="0000:5d:00.0", at=109.0))
    kept = [e.event_id for e in log.recent()]
    assert kept == ["kmsg:b:2", "kmsg:b:3", "kmsg:b:4", "kmsg:b:5"]
    # Every one of them happened: the counts since start include the cleared ones.
    xid48 = next(c for c in log.counts() if c.gpu == BUS and c.kind == "xid")
    assert xid48.count == 3


# --- storms: records folded into incidents -------------------------------------------------


def teardown(
    n: int, *, gpu: str = BUS, pid: int = 7, at: float = 100.0, root: int = 149
) -> GpuEvent:
    return event(
        f"kmsg:b:{n}",
        code=45,
        gpu=gpu,
        at=at,
        pid=pid,
        line=f"NVRM: Xid (PCI:0000:3b:00): 45, pid={pid}, Ch {n:08x} caused by previous Xid {root}",
    )


def test_a_storm_keeps_its_first_records_and_counts_the_rest() -> None:
    log = EventLog(EventsSection())
    added = [log.add(teardown(n, at=100.0 + n * 0.001)) for n in range(10_000)]
    assert added[0] is Added.NEW
    assert added[1:SAMPLES] == [Added.SAMPLE] * (SAMPLES - 1)
    assert set(added[SAMPLES:]) == {Added.FOLDED}
    kept = log.recent()
    assert [e.event_id for e in kept] == [f"kmsg:b:{n}" for n in range(SAMPLES)]
    # The checks weigh the kept records by what they stand for: every record counts.
    assert sum(1 + log.weights().get(e.event_id, 0) for e in kept) == 10_000
    (incident,) = log.incidents.open_incidents()
    assert (incident.count, incident.root_xid, incident.last.event_id) == (
        10_000,
        149,
        "kmsg:b:9999",
    )
    assert log.counts()[0].count == 10_000  # counts since start: every record


def test_incidents_are_per_gpu_root_and_process_and_end_after_a_quiet_gap() -> None:
    log = EventLog(EventsSection(incident_gap_seconds=60.0))
    firsts = [
        teardown(1),
        teardown(2, gpu="0000:5d:00.0"),
        teardown(3, pid=8),
        teardown(4, root=79),
        teardown(5, at=161.0),  # more than 60 s after the first: a new incident
    ]
    assert [log.add(e) for e in firsts] == [Added.NEW, Added.NEW, Added.NEW, Added.NEW, Added.NEW]
    assert log.add(teardown(6, at=170.0)) is Added.SAMPLE


def test_grown_incidents_are_reported_once_per_growth() -> None:
    log = EventLog(EventsSection())
    for n in range(50):
        log.add(teardown(n))
    (grown,) = log.incidents.grown()
    assert grown.count == 50
    assert log.incidents.grown() == []  # nothing new since
    log.add(teardown(50))
    assert [i.count for i in log.incidents.grown()] == [51]


def test_a_reset_ends_the_gpus_incidents_and_drops_their_weights() -> None:
    log = EventLog(EventsSection())
    for n in range(20):
        log.add(teardown(n))
    assert log.forget(BUS, 200.0, frozenset({"xid"})) == SAMPLES
    assert log.weights() == {}
    assert log.incidents.open_incidents() == []


def test_open_incidents_are_bounded_whatever_the_storm() -> None:
    log = EventLog(EventsSection(max_events=100))
    for n in range(MAX_OPEN + 500):  # every record a process of its own
        log.add(teardown(n, pid=n))
    assert len(log.incidents.open_incidents()) == MAX_OPEN
    assert len(log.recent()) == 100


def test_an_operational_event_its_xid_event_and_its_kernel_line_are_one_event() -> None:
    log = EventLog(EventsSection(dedup_window_seconds=10))
    operational = event(
        "nvml-op:x:1", source="nvml_operational", at=100.0, line="GPU operational event"
    )
    classic = event("nvml:x", source="nvml", at=100.2, line="Xid 79 (NVML event)")
    kernel = event("kmsg:b:1", source="kmsg", at=100.5, line=KERNEL_LINE, pid=4242)
    assert log.add(operational)
    assert not log.add(classic)
    assert not log.add(kernel)
    (kept,) = [e for e in log.recent() if e.kind == "xid"]
    assert (kept.event_id, kept.source, kept.line, kept.pid) == (
        "nvml-op:x:1",
        "kmsg",
        KERNEL_LINE,
        4242,
    )
    assert log.duplicates == 2


# Xid 154 lines: the first from NVIDIA/open-gpu-kernel-modules#1151, the second from
# leptonai/gpud's kmsg_test.go (../shared/data/kmsg_corpus.tsv); the third is the same
# line shape with the action done (back to 0x0).
XID_154_TO_FLR = (
    "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)"
)
XID_154_TO_RESET = (
    "NVRM: Xid (PCI:0019:01:00): 154, GPU recovery action changed from 0x4 (Drain and Reset)"
    " to 0x1 (GPU Reset Required)"
)
XID_154_DONE = (
    "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x4 (Drain and Reset)"
    " to 0x0 (None)"
)


@pytest.mark.parametrize(
    ("line", "reset"),
    [(XID_154_TO_FLR, False), (XID_154_TO_RESET, False), (XID_154_DONE, True)],
)
def test_an_xid_154_is_a_reset_only_when_the_action_goes_back_to_none(
    line: str, reset: bool
) -> None:
    assert is_reset(event("x", code=154, line=line)) is reset
    log = EventLog(EventsSection())
    log.add(event("kmsg:48", code=48, at=90.0))
    log.add(event("kmsg:154", code=154, at=95.0, line=line))
    kept = [e.event_id for e in log.recent()]
    assert kept == (["kmsg:154"] if reset else ["kmsg:48", "kmsg:154"])


def test_a_reset_event_clears_that_gpus_xids_and_gsp_before_it_and_is_kept() -> None:
    log = EventLog(EventsSection())
    log.add(event("kmsg:48", code=48, at=90.0))
    log.add(event("kmsg:gsp", kind="gsp", code=None, at=91.0))
    log.add(event("kmsg:aer", kind="aer", code=None, at=92.0))
    log.add(event("kmsg:other", code=48, gpu="0000:5d:00.0", at=93.0))
    reset = reset_event(BUS, "remediation", 100.0, "reset by the agent")
    assert log.add(reset) is Added.NEW
    assert log.add(reset) is Added.DUPLICATE
    log.add(event("kmsg:after", code=48, at=101.0))
    kept = [e.event_id for e in log.recent()]
    assert kept == ["kmsg:aer", "kmsg:other", reset.event_id, "kmsg:after"]
    assert (reset.kind, reset.gpu, reset.monotonic) == ("gpu_reset", BUS, 100.0)
