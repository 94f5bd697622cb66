"""What a GPU's entry of the status document (and so the node's state report, which the
fleet console's GPU page reads) carries of what is checked before a reset: lifetime ECC
counts, retired pages, remapped rows, the PCIe link against its maximum and its replays,
each NVLink's state and bit-error rates, the clocks."""

from __future__ import annotations

from dataclasses import replace

import aggregator_support as msg
from gpuagent.fleet import schema
from gpuagent.model import GpuReadings
from gpuagent.statusview import status_document
from hardware_profiles_doc import REAL_HOSTS, collect
from test_metrics_support import failed_gpu, ok_gpu, snapshot

BEFORE_A_RESET = (
    "ecc_sbe_aggregate",
    "ecc_dbe_aggregate",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "retired_pages_pending",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "row_remap_pending",
    "row_remap_failure",
    "pcie_max_generation",
    "pcie_max_width",
    "pcie_replay_count",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "memory_clock_mhz",
    "nvlink",
)


def test_a_gpu_reports_what_is_checked_before_a_reset() -> None:
    gpu = ok_gpu(3)
    assert gpu.readings is not None
    readings = replace(
        gpu.readings,
        retired_pages_dbe=2,
        retired_pages_pending=True,
        remapped_rows_uncorrectable=1,
        row_remap_failure=True,
        pcie_generation=4,
        pcie_width=8,
        sm_clock_mhz=1410,
        memory_clock_mhz=2619,
        nvlink_up=(True, False, None),
        nvlink_effective_ber=(1e-15, 3.5e-9, None),
        nvlink_symbol_ber=(),
    )
    gpu = replace(
        gpu, readings=readings, identity=replace(gpu.identity, pcie_max_generation=5,
                                                 pcie_max_width=16, sm_clock_max_mhz=1980),
    )  # fmt: skip
    (doc,) = status_document(snapshot(gpus=(gpu,)))["gpus"]
    assert {k: doc[k] for k in BEFORE_A_RESET} == {
        "ecc_sbe_aggregate": 13,
        "ecc_dbe_aggregate": 0,
        "retired_pages_sbe": 0,
        "retired_pages_dbe": 2,
        "retired_pages_pending": True,
        "remapped_rows_correctable": 3,
        "remapped_rows_uncorrectable": 1,
        "row_remap_pending": False,
        "row_remap_failure": True,
        "pcie_max_generation": 5,
        "pcie_max_width": 16,
        "pcie_replay_count": 21,
        "sm_clock_mhz": 1410,
        "sm_clock_max_mhz": 1980,
        "memory_clock_mhz": 2619,
        "nvlink": {
            "up": [True, False, None],
            "effective_ber": [1e-15, 3.5e-9, None],
            "symbol_ber": [],
            "crc_flit_errors": 0,
            "crc_data_errors": 0,
            "replay_errors": 3,
            "recovery_errors": 0,
        },
    }
    assert (doc["pcie_generation"], doc["pcie_width"]) == (4, 8)


def test_what_a_gpu_does_not_report_stays_null_never_zero() -> None:
    gpu = ok_gpu(0, GpuReadings())
    unknown = replace(
        gpu.identity, pcie_max_generation=None, pcie_max_width=None, sm_clock_max_mhz=None
    )
    (doc,) = status_document(snapshot(gpus=(replace(gpu, identity=unknown),)))["gpus"]
    assert all(doc[k] is None for k in BEFORE_A_RESET), {k: doc[k] for k in BEFORE_A_RESET}
    # A lost GPU has no readings at all: none of them is in its entry.
    (lost,) = status_document(snapshot(gpus=(failed_gpu(0, "lost"),)))["gpus"]
    assert not set(BEFORE_A_RESET) & set(lost), lost


def test_a_replayed_h100_node_reports_its_links_and_clocks() -> None:
    doc = status_document(collect(REAL_HOSTS / "h100-sxm-x8.535.161.08.nvidia-smi-q.txt"))
    assert len(doc["gpus"]) == 8
    for gpu in doc["gpus"]:
        assert (gpu["pcie_max_generation"], gpu["pcie_max_width"]) == (5, 16), gpu
        assert isinstance(gpu["sm_clock_mhz"], int), gpu
        assert isinstance(gpu["ecc_dbe_aggregate"], int), gpu


def test_an_8_gpu_nvl_node_with_every_link_stays_a_small_report() -> None:
    """18 links per GPU with both bit-error rates: the state report grows by a few kB, far
    from the broker's and the aggregator's limit."""
    gpus = []
    for i in range(8):
        gpu = ok_gpu(i)
        assert gpu.readings is not None
        gpus.append(
            replace(
                gpu,
                readings=replace(
                    gpu.readings,
                    nvlink_effective_ber=(1.234e-15,) * 18,
                    nvlink_symbol_ber=(5.678e-12,) * 18,
                ),
            )
        )
    message = msg.state("n1")
    message["status"] = status_document(snapshot(gpus=tuple(gpus)))
    size = len(schema.encode(message))
    assert size < schema.MAX_PAYLOAD_BYTES / 8, size
