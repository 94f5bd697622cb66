"""Hand-built snapshots and exposition helpers shared by the test_metrics_* modules."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.samples import Sample

from conftest import parse_metrics
from gpuagent.metrics import build_registry
from gpuagent.metrics.exposition import BareCounterFamily, TextRenderer
from gpuagent.model import (
    Finding,
    GpuIdentity,
    GpuProcess,
    GpuProfiling,
    GpuReadings,
    GpuState,
    GpuStatus,
    NodeHealth,
    NodeSnapshot,
    NvmlStatus,
    Severity,
    SourceStatus,
    fabric_health_mask,
)

VERSION = "1.2.3"
HOSTNAME = "gpu-node-07"
DRIVER = "550.54.15"
MODEL = "NVIDIA H100 80GB HBM3"
# An HGX H100 board's bus ids, in sysfs form (lower-case hex).
BUS_IDS = (
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
)
NVML_BUS_IDS = tuple("0000" + b.upper() for b in BUS_IDS)

NVML = NvmlStatus(
    ok=True,
    driver_version=DRIVER,
    nvml_version="12.550.54.15",
    cuda_driver_version="12.4",
)


def identity(index: int) -> GpuIdentity:
    return GpuIdentity(
        index=index,
        pci_bus_id=BUS_IDS[index],
        uuid=f"GPU-00000000-0000-0000-0000-00000000000{index}",
        name=MODEL,
        serial=f"165432100000{index}",
        minor_number=index,
        temperature_slowdown_c=87.0,
        temperature_shutdown_c=92.0,
        power_default_limit_w=700.0,
        pcie_max_generation=5,
        pcie_max_width=16,
        nvlink_count=18,
        sm_clock_max_mhz=1980,
        brand="NVIDIA",
        ecc_default=True,
    )


def readings(index: int) -> GpuReadings:
    """Every value set, and different per GPU so a sample can be traced to its GPU."""
    return GpuReadings(
        temperature_c=30.0 + index,
        memory_temperature_c=40.0 + index,
        power_w=100.5 + index,
        power_instant_w=103.25 + index,
        power_limit_w=700.0,
        power_requested_limit_w=700.0,
        compute_mode="exclusive_process",
        module_power_w=400.0 + index,
        module_power_limit_w=2500.0,
        energy_mj=1_000_000_000 + index,
        sm_clock_mhz=1980,
        memory_clock_mhz=2619,
        utilization_gpu_pct=90.0 + index,
        utilization_memory_pct=50.0 + index,
        utilization_encoder_pct=0.0,
        utilization_decoder_pct=1.0,
        fb_used_mib=1024.0 * index,
        fb_free_mib=81559.0 - 1024.0 * index,
        fb_reserved_mib=520.0,
        ecc_enabled=True,
        ecc_sbe_volatile=index,
        ecc_dbe_volatile=0,
        ecc_sbe_aggregate=10 + index,
        ecc_dbe_aggregate=0,
        retired_pages_sbe=0,
        retired_pages_dbe=0,
        retired_pages_pending=False,
        remapped_rows_correctable=index,
        remapped_rows_uncorrectable=0,
        row_remap_pending=False,
        row_remap_failure=False,
        recovery_action=0,
        # GPU 1 has a degraded fabric, the others a clear one.
        fabric_health_mask=fabric_health_mask(
            {"bandwidth_degraded": index == 1, "route_unhealthy": False}
        ),
        channel_repair_pending=False,
        tpc_repair_pending=False,
        unrepairable_memory=False,
        pcie_generation=5,
        pcie_width=16,
        pcie_replay_count=7 * index,
        clock_event_reasons=0x1,
        persistence_mode=True,
        mig_mode_current=False,
        mig_mode_pending=False,
        nvlink_up=(True,) * 18,
        nvlink_crc_flit_errors=0,
        nvlink_crc_data_errors=0,
        nvlink_replay_errors=index,
        nvlink_recovery_errors=0,
        processes=(
            GpuProcess(pid=4242 + index, name="python3", used_mib=1024.0, alive=True, user="ml"),
        ),
        performance_state=0,
        violation_power_ns=1_000 + index,
        violation_thermal_ns=2_000 + index,
        violation_sync_boost_ns=0,
        violation_board_limit_ns=0,
        violation_low_utilization_ns=3_000 + index,
        violation_reliability_ns=0,
        throttle_sw_thermal_ns=4_000 + index,
        throttle_hw_thermal_ns=5_000 + index,
        throttle_hw_power_brake_ns=6_000 + index,
    )


def ok_gpu(index: int, values: GpuReadings | None = None) -> GpuState:
    return GpuState(
        identity=identity(index),
        status="ok",
        readings=values if values is not None else readings(index),
        sampled_at=1_700_000_000.0,
    )


def failed_gpu(index: int, status: GpuStatus) -> GpuState:
    return GpuState(identity=identity(index), status=status, error=f"GPU {status}")


def ok_findings(gpus: int = 8) -> tuple[Finding, ...]:
    per_gpu = tuple(
        Finding(check=check, severity=Severity.OK, reason="fine", gpu=BUS_IDS[i])
        for i in range(gpus)
        for check in ("temperature", "ecc", "xid")
    )
    return (*per_gpu, Finding(check="driver", severity=Severity.OK, reason="loaded"))


SOURCES = (
    SourceStatus(name="nvml", up=True, last_success=1_700_000_000.0, last_duration_seconds=0.012),
    SourceStatus(
        name="kmsg",
        up=False,
        last_error="permission denied",
        consecutive_failures=3,
    ),
)


def snapshot(
    gpus: tuple[GpuState, ...] | None = None,
    findings: tuple[Finding, ...] | None = None,
    **changes: object,
) -> NodeSnapshot:
    """Eight healthy GPUs unless told otherwise."""
    base = NodeSnapshot(
        node_name="gpu-node-07",
        cluster="train-a",
        hostname=HOSTNAME,
        sequence=42,
        taken_at=1_700_000_001.5,
        nvml=NVML,
        gpus=gpus if gpus is not None else tuple(ok_gpu(i) for i in range(8)),
        health=NodeHealth(findings=findings if findings is not None else ok_findings()),
        sources=SOURCES,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def degraded_snapshot() -> NodeSnapshot:
    """GPU 3 lost, GPU 5 timed out, GPU 6 errored, with findings to match."""
    gpus = tuple(
        failed_gpu(i, {3: "lost", 5: "timeout", 6: "error"}[i]) if i in (3, 5, 6) else ok_gpu(i)
        for i in range(8)
    )
    findings = (
        *ok_findings(),
        Finding(check="presence", severity=Severity.CRITICAL, reason="lost", gpu=BUS_IDS[3]),
        Finding(check="nvml", severity=Severity.UNKNOWN, reason="timeout", gpu=BUS_IDS[5]),
        Finding(check="nvml", severity=Severity.UNKNOWN, reason="error", gpu=BUS_IDS[6]),
    )
    return snapshot(gpus=gpus, findings=findings)


# DCGM field ids of the profiling series: the DCGM_FI_PROF_* ratios and byte rates, and
# DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL.
PROFILING_RATIOS = (1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008)
PROFILING_BYTES = (1009, 1010)
NVLINK_BANDWIDTH = 449


def profiling_values(index: int, instance: int = 0) -> tuple[tuple[int, float], ...]:
    """Every profiling field, each value traceable to its field, GPU and GPU instance."""
    ratios = tuple(
        (field, (field - 1000) / 10 + index / 100 + instance / 1000) for field in PROFILING_RATIOS
    )
    rates = tuple((field, 1e9 * (field - 1008) + index) for field in PROFILING_BYTES)
    return (*ratios, *rates, (NVLINK_BANDWIDTH, 5000.0 + index))


def gpm(index: int) -> GpuProfiling:
    return GpuProfiling(source="gpm", values=profiling_values(index))


def profiled_snapshot(*mig_instances: tuple[int, str]) -> NodeSnapshot:
    """The eight H100s with GPM values; GPU 0 also with these MIG GPU instances."""
    gpus = []
    for index in range(8):
        entries = [gpm(index)]
        if index == 0:
            entries += [
                GpuProfiling(
                    source="gpm",
                    values=profiling_values(0, gi_id)[:-1],  # NVLink is the whole GPU's
                    gpu_instance_id=gi_id,
                    gpu_instance_profile=profile,
                )
                for gi_id, profile in mig_instances
            ]
        gpus.append(ok_gpu(index, replace(readings(index), profiling=tuple(entries))))
    return snapshot(gpus=tuple(gpus))


def registry_for(snap: NodeSnapshot | None) -> CollectorRegistry:
    return build_registry(lambda: snap, VERSION)


def exposition(snap: NodeSnapshot | None) -> str:
    """/metrics as the agent renders it."""
    return TextRenderer().render(registry_for(snap).collect()).decode()


def prometheus_client_text(registry: CollectorRegistry) -> bytes:
    """What prometheus_client renders, with dcgm-exporter's counters named as the text
    format allows (and the agent serves them): prometheus_client writes `NAME_total` in a
    counter's HELP and TYPE lines even where the samples are plain NAME."""
    text = generate_latest(registry)
    for family in registry.collect():
        if isinstance(family, BareCounterFamily):
            for line in (b"# HELP ", b"# TYPE "):
                name = family.name.encode()
                text = text.replace(line + name + b"_total ", line + name + b" ")
    return text


def samples(snap: NodeSnapshot | None) -> dict[str, list[Sample]]:
    """Samples by family name, parsed back from the text exposition."""
    return samples_from_text(exposition(snap))


def samples_from_text(text: str) -> dict[str, list[Sample]]:
    return {f.name: list(f.samples) for f in parse_metrics(text)}


def families_by_name(snap: NodeSnapshot | None) -> dict[str, str]:
    """Family name -> type as parsed from the text exposition."""
    return {f.name: f.type for f in parse_metrics(exposition(snap))}


def for_gpu(found: list[Sample], index: int) -> list[Sample]:
    return [s for s in found if s.labels.get("gpu") == str(index)]
