"""Prometheus families for the node's RDMA ports, under node_exporter's infiniband names.

Same names, labels (`device`, `port`) and units as node_exporter's collector (rates in
bytes per second, data counters in bytes), so its dashboards work on gpuagent's series.
Values sysfs did not give are left out, never exported as zero.
"""

from __future__ import annotations

from prometheus_client.core import Metric

from gpuagent.metrics import names
from gpuagent.model import IbDevice

# "400 Gb/sec" is 400e9 bits, 50e9 bytes, per second.
_BYTES_PER_GBIT = 125_000_000


def infiniband_families(devices: tuple[IbDevice, ...] | None) -> list[Metric]:
    if not devices:
        return []
    info = names.IB_INFO.gauge()
    state, physical, rate = (
        s.gauge() for s in (names.IB_STATE, names.IB_PHYSICAL_STATE, names.IB_RATE)
    )
    counters = {file: spec.counter() for file, spec in names.IB_PORT_COUNTERS}
    hw_counters = names.IB_HW_COUNTERS.counter()
    for device in devices:
        info.add_metric(
            [device.name, device.board_id, device.firmware_version, device.hca_type], 1.0
        )
        for port in device.ports:
            labels = [device.name, str(port.port)]
            if port.state_id is not None:
                state.add_metric(labels, port.state_id)
            if port.phys_state_id is not None:
                physical.add_metric(labels, port.phys_state_id)
            if port.rate_gbps is not None:
                rate.add_metric(labels, port.rate_gbps * _BYTES_PER_GBIT)
            for file, value in port.counters:
                if file in counters:
                    counters[file].add_metric(labels, value)
            for counter, value in port.hw_counters:
                hw_counters.add_metric([*labels, counter], value)
    return [info, state, physical, rate, *counters.values(), hw_counters]


_PREFIX = b"node_infiniband_"


def without_node_exporter_families(body: bytes) -> bytes:
    """``body`` (text exposition) less the `node_infiniband_*` families, for node_exporter's
    textfile directory: its own infiniband collector exports them from the same sysfs,
    and a family both export makes its scrape report duplicate series."""
    if _PREFIX not in body:
        return body
    kept = [
        line
        for line in body.splitlines(keepends=True)
        if not line.startswith(_PREFIX)
        and not line.startswith(b"# HELP " + _PREFIX)
        and not line.startswith(b"# TYPE " + _PREFIX)
    ]
    return b"".join(kept)
