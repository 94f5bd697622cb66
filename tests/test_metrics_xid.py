"""DCGM_FI_DEV_XID_ERRORS as dcgm-exporter serves it: the last XID as the value, labelled
with `err_code` and `err_msg` (its own XID text table), one series per GPU."""

from __future__ import annotations

import pytest

from gpuagent.metrics.names import DCGM_LABELS
from gpuagent.metrics.xidtext import err_msg
from gpuagent.model import EventCount
from test_metrics_support import BUS_IDS, failed_gpu, ok_gpu, samples, snapshot

XID = "DCGM_FI_DEV_XID_ERRORS"
T0 = 1_700_000_000.0


# dcgm-exporter's texts as its xid_errors.go spells them (4.4.2-4.7.1 and later).
@pytest.mark.parametrize(
    ("code", "text"),
    [
        (0, "No Error"),
        (13, "Graphics Engine Exception"),
        (31, "GPU memory page fault"),
        (43, "GPU stopped processing"),
        (45, ("Preemptive cleanup, due to previous errors -- Most likely to see when running"
              " multiple cuda")),
        (48, "Double Bit ECC Error"),
        (63, "ECC page retirement or row remapping recording event"),
        (74, "NVLINK Error"),
        (79, "GPU has fallen off the bus"),
        (94, "Contained ECC error"),
        (95, "Uncontained ECC error"),
        (109, "Context Switch Timeout Error"),
        (119, "GSP RPC Timeout"),
        (142, "Robust Channel NVENVC3 Error"),  # dcgm-exporter's spelling
        (149, "NVLINK: NETIR Error"),
        (154, "GPU Recovery Action Changed"),
        (172, "Uncorrectable SRAM Error"),
        (173, "Unknown Error"),
        (4096, "Unknown Error"),
        (-1, "Unknown Error"),
    ],
)  # fmt: skip
def test_err_msg_is_dcgm_exporters_text(code: int, text: str) -> None:
    assert err_msg(code) == text


def _xid(bus: str, code: int, at: float, count: int = 1) -> EventCount:
    return EventCount(bus, "xid", code, None, count, at)


def _last(**changes: object) -> dict[str, tuple[float, str, str]]:
    """gpu -> (value, err_code, err_msg) of each DCGM_FI_DEV_XID_ERRORS sample."""
    found = samples(snapshot(**changes))[XID]
    assert len(found) == len({s.labels["pci_bus_id"] for s in found}), "one series a GPU"
    for sample in found:
        assert set(sample.labels) == {*DCGM_LABELS, "err_code", "err_msg"}
    return {s.labels["gpu"]: (s.value, s.labels["err_code"], s.labels["err_msg"]) for s in found}


def test_a_gpu_without_xid_reads_0_no_error() -> None:
    last = _last()
    assert set(last) == {str(i) for i in range(8)}
    assert set(last.values()) == {(0.0, "0", "No Error")}


def test_the_last_xid_is_the_value_and_its_labels() -> None:
    last = _last(event_counts=(_xid(BUS_IDS[2], 79, T0),))
    assert last["2"] == (79.0, "79", "GPU has fallen off the bus")
    assert last["1"] == (0.0, "0", "No Error")


def test_the_next_xid_relabels_the_one_series() -> None:
    # 79 first, then 45 and 154 as consequences: the newest is served, the others not.
    counts = (
        _xid(BUS_IDS[2], 79, T0),
        _xid(BUS_IDS[2], 154, T0 + 2.0),
        _xid(BUS_IDS[2], 45, T0 + 1.0, count=7),
    )
    last = _last(event_counts=counts)
    assert last["2"] == (154.0, "154", "GPU Recovery Action Changed")
    # An XID past dcgm-exporter's table keeps its code, with dcgm-exporter's fallback text.
    last = _last(event_counts=(_xid(BUS_IDS[0], 79, T0), _xid(BUS_IDS[0], 190, T0 + 1)))
    assert last["0"] == (190.0, "190", "Unknown Error")


def test_a_gpu_that_stopped_answering_keeps_only_a_real_last_xid() -> None:
    gpus = (ok_gpu(0), failed_gpu(1, "lost"), failed_gpu(2, "lost"))
    last = _last(gpus=gpus, findings=(), event_counts=(_xid(BUS_IDS[1], 79, T0),))
    assert last == {"0": (0.0, "0", "No Error"), "1": (79.0, "79", "GPU has fallen off the bus")}
