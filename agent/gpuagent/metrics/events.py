"""Metric families for kernel-log, NVML and bus events, from the snapshot's event counts."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import Metric

from gpuagent.metrics import names
from gpuagent.metrics.xidtext import err_msg
from gpuagent.model import EventCount, NodeSnapshot

LabelsFor = Callable[[str], tuple[str, ...]]

_BUS_KINDS = frozenset(
    {"fallen_off_bus", "gpu_removed", "gpu_added", "driver_unbound", "driver_bound"}
)


def _xid(code: int) -> tuple[str, str]:
    """`err_code` and `err_msg`: one series per GPU, relabelled when the next XID comes (the
    last one's series ends), so the labels add no series, only a new one per XID seen."""
    return str(code), err_msg(code)


def _resets(snapshot: NodeSnapshot, gpu_labels: LabelsFor) -> Metric:
    resets = names.GPU_RESETS_TOTAL.counter()
    for count in snapshot.event_counts:
        if count.kind == "gpu_reset" and count.gpu:
            resets.add_metric(list(gpu_labels(count.gpu)), count.count)
    return resets


def event_families(
    snapshot: NodeSnapshot,
    gpu_labels: LabelsFor,
    driver: str,
    nvml_bus_id: Callable[[str], str],
) -> list[Metric]:
    """``gpu_labels(bus_id)`` gives a GPU's label values (GPU_LABELS order)."""
    last_xid = names.XID_LAST.gauge()
    xids, sxids = names.XID_TOTAL.counter(), names.SXID_TOTAL.counter()
    aer, bus = names.AER_REPORTS_TOTAL.counter(), names.BUS_EVENTS_TOTAL.counter()
    host = snapshot.hostname
    newest: dict[str, EventCount] = {}
    for count in snapshot.event_counts:
        where = nvml_bus_id(count.gpu) if count.gpu else ""
        if count.kind == "xid" and count.code is not None and count.gpu:
            xids.add_metric([*gpu_labels(count.gpu), str(count.code)], count.count)
            if count.gpu not in newest or count.last_time >= newest[count.gpu].last_time:
                newest[count.gpu] = count
        elif count.kind == "sxid" and count.code is not None:
            sxids.add_metric([where, str(count.code), host], count.count)
        elif count.kind == "aer":
            aer.add_metric([where, count.aer_severity or "unknown", host], count.count)
        elif count.kind in _BUS_KINDS:
            bus.add_metric([where, count.kind, host], count.count)
    # Like dcgm-exporter: every answering GPU has the series, 0 until it reports an XID.
    # (A GPU that stopped answering keeps only a real last XID: history, not a reading.)
    for gpu in snapshot.gpus:
        if gpu.status != "ok":
            continue
        bus_id = gpu.identity.pci_bus_id
        last = newest.pop(bus_id, None)
        code = (last.code or 0) if last else 0
        last_xid.add_metric([*gpu_labels(bus_id), driver, *_xid(code)], float(code))
    for bus_id, count in newest.items():  # silent GPUs, and devices NVML does not list
        code = count.code or 0
        last_xid.add_metric([*gpu_labels(bus_id), driver, *_xid(code)], float(code))
    kmsg = snapshot.kmsg
    return [
        last_xid,
        xids,
        sxids,
        aer,
        bus,
        _resets(snapshot, gpu_labels),
        names.KMSG_READ.counter(kmsg.records_read),
        names.KMSG_LOST.counter(kmsg.records_lost),
        names.KMSG_UNPARSED.counter(kmsg.lines_unparsed),
    ]
