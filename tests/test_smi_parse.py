"""`nvidia-smi -q` captures: values read from real hosts, bad input refused with its line,
and the text and XML formats read alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuagent.smi import (
    Capture,
    CapturedGpu,
    CapturedMigDevice,
    CapturedProcess,
    CaptureError,
    ClockEventReasons,
    TemperatureThresholds,
    load_capture,
    parse_capture,
)

DATA = Path(__file__).parent / "data" / "real-hosts"

H100_161 = "h100-sxm-x8.535.161.08.nvidia-smi-q.txt"
H100_183 = "h100-sxm-x8.535.183.01.nvidia-smi-q.txt"
A10 = "a10.535.129.03.nvidia-smi-q.txt"
RTX4090 = "rtx4090-x8.535.154.05.nvidia-smi-q.txt"
RTX4090_BUSY = "rtx4090-x8-busy.535.154.05.nvidia-smi-q.txt"
TITAN_V = "titan-v.560.35.03.nvidia-smi-q.txt"
A100_MIG = "a100-sxm4-x4-mig.535.54.03.nvidia-smi-q.xml"
A10G = "a10g.nvidia-smi-q.xml"
H200_TEXT = "h200-x1.580.159.04.nvidia-smi-q.txt"
H200_XML = "h200-x1.580.159.04.nvidia-smi-q.xml"
H200_590_IDLE = "h200-x1-idle.590.48.01.nvidia-smi-q.txt"
L40S_595 = "l40s-aws.595.91.07.nvidia-smi-q.xml"
B200 = "b200-x8.580.105.08.nvidia-smi-q.xml"
GB200 = "gb200-x4-arm64.580.173.02.nvidia-smi-q.xml"
H200_590_BUSY = "h200-x1-busy.590.48.01.nvidia-smi-q.txt"
H100_590_IDLE = "h100-x1-idle.590.48.01.nvidia-smi-q.txt"
H100_590_BUSY = "h100-x1-busy.590.48.01.nvidia-smi-q.txt"
H100_580_TEXT = "h100-x1.580.159.04.nvidia-smi-q.txt"
H100_580_XML = "h100-x1.580.159.04.nvidia-smi-q.xml"
RTX2080S_610 = "RTX2080S-idle.610.57.04.nvidia-smi-q.txt"
T4_595 = "T4-aws.595.91.07.nvidia-smi-q.xml"


def _load(name: str) -> Capture:
    return load_capture(DATA / name)


def _read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


# --- the real captures ------------------------------------------------------------------------

# file: format, driver, CUDA, timestamp, "Attached GPUs", GPUs listed
HEADERS = {
    H100_161: ("text", "535.161.08", "12.2", "Wed Jul 31 11:22:39 2024", 8, 8),
    H100_183: ("text", "535.183.01", "12.2", "Fri Jun 21 02:03:08 2024", 8, 8),
    A10: ("text", "535.129.03", "12.2", "Wed Sep 25 10:40:24 2024", 1, 1),
    RTX4090: ("text", "535.154.05", "12.2", "Thu Nov 14 05:34:15 2024", 8, 8),
    RTX4090_BUSY: ("text", "535.154.05", "12.2", "Mon Jul  8 08:11:21 2024", 8, 8),
    TITAN_V: ("text", "560.35.03", "12.6", "Fri Oct 18 10:13:00 2024", 1, 1),
    # The header says 4 GPUs; the capture was trimmed to the first.
    A100_MIG: ("xml", "535.54.03", "12.2", "Fri Aug  4 11:44:30 2023", 4, 1),
    A10G: ("xml", "515.105.01", "11.7", "Mon Apr 24 16:11:51 2023", 1, 1),
    H200_TEXT: ("text", "580.159.04", "13.0", "Fri Nov 27 12:55:07 2026", 1, 1),
    H200_XML: ("xml", "580.159.04", "13.0", "Fri Nov 27 12:55:07 2026", 1, 1),
    H100_580_TEXT: ("text", "580.159.04", "13.0", "Fri Nov 27 14:00:23 2026", 1, 1),
    H100_580_XML: ("xml", "580.159.04", "13.0", "Fri Nov 27 14:00:23 2026", 1, 1),
    B200: ("xml", "580.105.08", "13.0", "Fri Aug 21 08:39:32 2026", 8, 8),
    GB200: ("xml", "580.173.02", "13.0", "Fri Aug 21 11:01:42 2026", 4, 4),
    L40S_595: ("xml", "595.91.07", "13.2", "Fri Aug 21 09:34:04 2026", 1, 1),
    H200_590_IDLE: ("text", "590.48.01", "13.1", "Fri Jul  3 22:10:45 2026", 1, 1),
    H200_590_BUSY: ("text", "590.48.01", "13.1", "Fri Jul  3 22:11:09 2026", 1, 1),
    H100_590_IDLE: ("text", "590.48.01", "13.1", "Tue Jul 14 08:12:38 2026", 1, 1),
    H100_590_BUSY: ("text", "590.48.01", "13.1", "Tue Jul 14 08:12:53 2026", 1, 1),
    # R610 follows "CUDA Version" with a deprecation note and adds "CUDA UMD Version".
    RTX2080S_610: ("text", "610.57.04", "13.3", "Wed Aug 12 21:53:45 2026", 1, 1),
    T4_595: ("xml", "595.91.07", "13.2", "Fri Aug 21 09:23:10 2026", 1, 1),
}


def test_every_capture_in_the_data_directory_is_covered() -> None:
    on_disk = {path.name for path in DATA.iterdir() if path.name != "README.md"}
    assert on_disk == set(HEADERS)


@pytest.mark.parametrize(("name", "header"), HEADERS.items(), ids=list(HEADERS))
def test_header(name: str, header: tuple[str, str, str, str, int, int]) -> None:
    capture = _load(name)
    listed = len(capture.gpus)
    got = (
        capture.format,
        capture.driver_version,
        capture.cuda_version,
        capture.timestamp,
        capture.attached_gpus,
        listed,
    )
    assert got == header


H100_161_GPU0: dict[str, object] = {
    "bus_id": "00000000:19:00.0",
    "product_name": "NVIDIA H100 80GB HBM3",
    "line": 9,
    "product_brand": "NVIDIA",
    "architecture": "Hopper",
    "uuid": "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa",
    "serial": "1650124031592",
    "minor_number": 0,
    "module_id": 2,
    "vbios_version": "96.00.74.00.0D",
    "inforom_image_version": "G520.0200.00.05",
    "gsp_firmware_version": "535.161.08",
    "pci_device_id": 0x233010DE,
    "pci_subsystem_id": 0x16C110DE,
    "persistence_mode": True,
    "virtualization_mode": "None",
    "mig_current": False,
    "mig_pending": False,
    "mig_devices": (),
    "ecc_current": True,
    "ecc_pending": True,
    "ecc_corrected_volatile": 0,
    "ecc_uncorrected_volatile": 0,
    "ecc_corrected_aggregate": 0,
    "ecc_uncorrected_aggregate": 0,
    "sram_corrected_volatile": 0,
    "sram_uncorrected_volatile": 0,
    "sram_uncorrected_aggregate": 0,
    "sram_threshold_exceeded": False,
    "retired_pages_sbe": None,
    "retired_pages_dbe": None,
    "retired_pages_pending": None,
    "remapped_rows_correctable": 0,
    "remapped_rows_uncorrectable": 0,
    "remapped_rows_pending": False,
    "remapped_rows_failure": False,
    "remap_histogram": (2560, 0, 0, 0, 0),
    "reset_required": False,
    "drain_and_reset_recommended": False,
    "pcie_generation_max": 5,
    "pcie_generation_current": 5,
    "pcie_generation_device_max": 5,
    "pcie_generation_host_max": 5,
    "pcie_width_max": 16,
    "pcie_width_current": 16,
    "pcie_replays": 67,
    "pcie_replay_rollovers": 0,
    "pcie_tx_kbps": 3875,
    "pcie_rx_kbps": 574,
    "fan_speed_pct": None,
    "performance_state": 0,
    "clock_event_reasons": ClockEventReasons(
        idle=False,
        applications_clocks=False,
        sw_power_cap=False,
        hw_slowdown=True,
        hw_thermal_slowdown=False,
        hw_power_brake_slowdown=True,
        sync_boost=False,
        sw_thermal_slowdown=False,
        display_clocks=False,
    ),
    "fb_total_mib": 81559,
    "fb_reserved_mib": 551,
    "fb_used_mib": 0,
    "fb_free_mib": 81007,
    "utilization_gpu_pct": 0,
    "utilization_memory_pct": 0,
    "temperature_c": 29,
    "memory_temperature_c": 39,
    "thresholds": TemperatureThresholds(
        tlimit=True, shutdown=-8, slowdown=-2, gpu_max=0, memory_max=0, margin=56, target=None
    ),
    "power_draw_w": 67.74,
    "power_instant_w": None,  # no such line before 550
    "power_limit_w": 700,
    "power_requested_limit_w": 700,
    "power_default_limit_w": 700,
    "power_min_limit_w": 200,
    "power_max_limit_w": 700,
    "clock_graphics_mhz": 86,
    "clock_sm_mhz": 86,
    "clock_memory_mhz": 2619,
    "clock_video_mhz": 765,
    "applications_clock_graphics_mhz": 1980,
    "applications_clock_memory_mhz": 2619,
    "default_applications_clock_graphics_mhz": 1980,
    "default_applications_clock_memory_mhz": 2619,
    "max_clock_graphics_mhz": 1980,
    "max_clock_sm_mhz": 1980,
    "max_clock_memory_mhz": 2619,
    "max_clock_video_mhz": 1545,
    "fabric_state": "Completed",
    "fabric_status": "Success",
    "processes": (),
}

H100_183_GPU2: dict[str, object] = {
    "bus_id": "00000000:75:00.0",
    "line": 418,
    "virtualization_mode": "Pass-Through",
    "pcie_generation_host_max": None,
    "pcie_replays": 58,
    "power_draw_w": 118.01,
    "temperature_c": 39,
    "clock_event_reasons": ClockEventReasons(
        idle=False,
        applications_clocks=False,
        sw_power_cap=True,
        hw_slowdown=False,  # as captured, though one of its causes is Active
        hw_thermal_slowdown=False,
        hw_power_brake_slowdown=True,
        sync_boost=False,
        sw_thermal_slowdown=True,
        display_clocks=False,
    ),
    "processes": (CapturedProcess(pid=1002127, name="/usr/bin/python", type="C", used_mib=9212),),
}

A10_GPU0: dict[str, object] = {
    "bus_id": "00000000:07:00.0",
    "product_name": "NVIDIA A10",
    "architecture": "Ampere",
    "uuid": "GPU-73d12ef7-f589-f867-4259-c7090ab44736",
    "virtualization_mode": "Pass-Through",
    "mig_current": None,
    "ecc_current": True,
    "ecc_uncorrected_aggregate": 0,
    "sram_uncorrected_aggregate": 0,
    "sram_threshold_exceeded": None,  # no such line before Hopper
    "retired_pages_sbe": None,
    "remapped_rows_correctable": 0,
    "remapped_rows_uncorrectable": 4,
    "remapped_rows_pending": True,
    "remapped_rows_failure": False,
    "remap_histogram": (192, 0, 0, 0, 0),
    "reset_required": False,  # the pending remap has not (yet) asked for a reset
    "drain_and_reset_recommended": None,
    "pcie_generation_host_max": None,
    "fan_speed_pct": 0,
    "performance_state": 8,
    "temperature_c": 33,
    "memory_temperature_c": None,
    "thresholds": TemperatureThresholds(tlimit=False, shutdown=101, slowdown=98, gpu_max=91),
    "power_draw_w": 43.89,
    "power_limit_w": 150,
    "power_requested_limit_w": 150,
    "compute_mode": "Default",
    "fb_total_mib": 23028,
    "fb_reserved_mib": 512,
    "fb_used_mib": 4,  # the driver's own: no process runs
    "fb_free_mib": 22511,
    "power_min_limit_w": 100,
    "max_clock_sm_mhz": 1695,
    "fabric_state": None,
    "fabric_status": None,
    "processes": (),
}

RTX4090_GPU0: dict[str, object] = {
    "bus_id": "00000000:01:00.0",
    "product_name": "NVIDIA GeForce RTX 4090",
    "product_brand": "GeForce",
    "architecture": "Ada Lovelace",
    "serial": None,
    "gsp_firmware_version": None,
    "minor_number": 2,
    "ecc_current": False,
    "ecc_pending": False,
    "ecc_corrected_volatile": None,
    "ecc_uncorrected_aggregate": None,
    "sram_uncorrected_volatile": None,
    "remapped_rows_uncorrectable": 0,
    "remap_histogram": (192, 0, 0, 0, 0),
    "pcie_generation_current": 1,
    "pcie_generation_max": 4,
    "pcie_generation_host_max": 5,
    "fan_speed_pct": 72,
    "performance_state": 8,
    "utilization_gpu_pct": 0,
    "fb_used_mib": 6730,
    "temperature_c": 31,
    "memory_temperature_c": None,
    "thresholds": TemperatureThresholds(
        tlimit=True, shutdown=-7, slowdown=-2, gpu_max=0, memory_max=None, margin=52, target=84
    ),
    "power_draw_w": 17.11,
    "power_limit_w": 450,
    "applications_clock_graphics_mhz": None,
    "default_applications_clock_memory_mhz": None,
    "max_clock_sm_mhz": 3105,
    "processes": (CapturedProcess(pid=2010222, name="/usr/bin/python", type="C", used_mib=6724),),
}

RTX4090_BUSY_GPU1: dict[str, object] = {
    "bus_id": "00000000:23:00.0",
    "line": 204,
    "performance_state": 2,
    "utilization_gpu_pct": 97,
    "temperature_c": 72,
    "power_draw_w": 445.38,
    "pcie_generation_current": 4,
    "processes": (CapturedProcess(pid=1285135, name="/usr/bin/python", type="C", used_mib=21602),),
}

TITAN_V_GPU0: dict[str, object] = {
    "bus_id": "00000000:01:00.0",
    "product_name": "NVIDIA TITAN V",
    "product_brand": "Titan",
    "architecture": "Volta",
    "persistence_mode": False,
    "gsp_firmware_version": None,
    "ecc_current": None,
    "ecc_pending": None,
    # The Single Bit / Double Bit layout, all N/A: ECC is off on this board.
    "ecc_corrected_volatile": None,
    "ecc_uncorrected_volatile": None,
    "ecc_corrected_aggregate": None,
    "ecc_uncorrected_aggregate": None,
    "sram_corrected_volatile": None,
    "retired_pages_sbe": None,
    "retired_pages_dbe": None,
    "retired_pages_pending": None,
    # "Remapped Rows : N/A": the whole section.
    "remapped_rows_correctable": None,
    "remapped_rows_uncorrectable": None,
    "remapped_rows_pending": None,
    "remapped_rows_failure": None,
    "remap_histogram": None,
    "reset_required": False,
    "drain_and_reset_recommended": None,
    "pcie_generation_current": 1,
    "pcie_generation_max": 3,
    "fan_speed_pct": 30,
    "performance_state": 8,
    "temperature_c": 44,
    "memory_temperature_c": 41,
    "thresholds": TemperatureThresholds(
        tlimit=False, shutdown=100, slowdown=97, gpu_max=91, memory_max=95, target=84
    ),
    "power_draw_w": 29.02,
    "power_limit_w": 250,
    "power_requested_limit_w": 250,
    "power_max_limit_w": 300,
    "fb_used_mib": 290,  # more than its three processes' 286 MiB
    "fabric_state": None,
    "processes": (
        CapturedProcess(pid=100607, name="/usr/lib/xorg/Xorg", type="G", used_mib=142),
        CapturedProcess(pid=100838, name="/usr/bin/gnome-shell", type="G", used_mib=33),
        CapturedProcess(pid=101815, name="/opt/test", type="G", used_mib=111),
    ),
}

A100_MIG_GPU0: dict[str, object] = {
    "bus_id": "00000000:01:00.0",
    "product_name": "NVIDIA A100-SXM4-80GB",
    "line": 8,
    "uuid": "GPU-513536b6-7d19-9063-b049-1e69664bb298",
    "serial": "1650522003820",
    "minor_number": 1,
    "module_id": 4,
    "inforom_image_version": "G506.0212.00.01",
    "pci_device_id": 0x20B210DE,
    "pci_subsystem_id": 0x147F10DE,
    "persistence_mode": False,
    "mig_current": True,
    "mig_pending": True,
    "mig_devices": tuple(
        CapturedMigDevice(
            index=index,
            gpu_instance_id=index + 3,
            compute_instance_id=0,
            multiprocessor_count=14,
            memory_total_mib=19968,
            memory_used_mib=12,
        )
        for index in range(4)
    ),
    "ecc_current": True,
    "ecc_corrected_aggregate": 0,
    "sram_uncorrected_aggregate": 0,
    "retired_pages_sbe": None,
    "retired_pages_dbe": None,
    "retired_pages_pending": None,
    "remapped_rows_correctable": None,  # <remapped_rows>N/A</remapped_rows> under MIG
    "remapped_rows_pending": None,
    "remap_histogram": None,
    "reset_required": False,
    "drain_and_reset_recommended": False,
    "pcie_generation_host_max": 4,
    "pcie_tx_kbps": 4000,
    "fan_speed_pct": None,
    "performance_state": 0,
    "utilization_gpu_pct": None,  # not reported for the whole GPU under MIG
    "utilization_memory_pct": None,
    "fb_reserved_mib": 869,
    "temperature_c": 27,
    "memory_temperature_c": 44,
    "thresholds": TemperatureThresholds(
        tlimit=False, shutdown=92, slowdown=89, gpu_max=85, memory_max=95
    ),
    "power_draw_w": 67.03,
    "power_limit_w": 500,
    "power_requested_limit_w": 500,
    "fb_used_mib": 50,  # beside its four MIG devices' 12 MiB each
    "fb_free_mib": 80999,
    "clock_sm_mhz": 1275,
    "max_clock_sm_mhz": 1410,
    "fabric_state": None,
    "processes": (),
}

A10G_GPU0: dict[str, object] = {
    "bus_id": "00000000:00:1E.0",
    "product_name": "NVIDIA A10G",
    "serial": "0000000000000",  # anonymised, as is the device id
    "pci_device_id": 0xDE,
    "virtualization_mode": "Pass-Through",
    "mig_current": None,
    "mig_devices": (),
    "reset_required": None,  # no <gpu_reset_status> in DTD v11
    "remapped_rows_uncorrectable": 0,
    "remap_histogram": (192, 0, 0, 0, 0),
    "pcie_generation_max": 4,
    "pcie_generation_current": 1,
    "pcie_generation_device_max": None,
    "pcie_width_max": 16,
    "pcie_width_current": 8,
    "performance_state": 8,
    "clock_event_reasons": ClockEventReasons(  # <clocks_throttle_reasons>
        idle=True,
        applications_clocks=False,
        sw_power_cap=False,
        hw_slowdown=False,
        hw_thermal_slowdown=False,
        hw_power_brake_slowdown=False,
        sync_boost=False,
        sw_thermal_slowdown=False,
        display_clocks=False,
    ),
    "temperature_c": 17,
    "thresholds": TemperatureThresholds(tlimit=False, shutdown=98, slowdown=95, gpu_max=88),
    "power_draw_w": 25.58,
    "power_limit_w": 300,  # <enforced_power_limit>
    "power_requested_limit_w": 300,  # <power_limit> beside it
    "compute_mode": "Default",
    "power_default_limit_w": 300,
    "fabric_state": None,
    "processes": (CapturedProcess(pid=725, name="/usr/lib/xorg/Xorg", type="G", used_mib=22),),
}

# R610 nests the current, requested and default limits in "GPU Ceiling Power Limit"; a
# GeForce (and GA100 and older) prints its draw as instantaneous only, the average N/A.
RTX2080S_610_GPU0: dict[str, object] = {
    "product_name": "NVIDIA GeForce RTX 2080 SUPER",
    "product_brand": "GeForce",
    "power_draw_w": None,
    "power_instant_w": 38.89,
    "power_limit_w": 250,
    "power_requested_limit_w": 250,
    "power_default_limit_w": 250,
    "power_min_limit_w": 105,
    "power_max_limit_w": 350,
    "module_power_w": None,
    "module_power_limit_w": None,
    "fb_total_mib": 8192,
    "fb_reserved_mib": 400,
    "fb_used_mib": 211,  # more than its two processes' 176 MiB
    "fb_free_mib": 7582,
    "compute_mode": "Default",
    "ecc_current": None,
    "remapped_rows_correctable": None,
    "pcie_generation_current": 1,
    "pcie_generation_max": 3,
    "pcie_generation_host_max": 4,
    "clock_graphics_mhz": 300,
    "max_clock_memory_mhz": 7751,
    # Platform Info all N/A but the module id (nvidia-smi reads that through another call);
    # no fabric.
    "chassis_serial": None,
    "slot_number": None,
    "tray_index": None,
    "host_id": None,
    "peer_type": None,
    "platform_module_id": 1,
    "fabric_clique_id": None,
    "fabric_cluster_uuid": None,
}

T4_595_GPU0: dict[str, object] = {
    "product_name": "Tesla T4",
    "power_draw_w": None,  # <average_power_draw>N/A</average_power_draw>
    "power_instant_w": 33.51,
    "power_limit_w": 70,
    "power_requested_limit_w": 70,
    "power_default_limit_w": 70,
    "power_min_limit_w": 60,
    "fb_total_mib": 15360,
    "fb_reserved_mib": 448,
    "fb_used_mib": 0,
    "fb_free_mib": 14913,
    "compute_mode": "Default",
}

# The 550+ layout: the average and instantaneous draw, and (570+) the recovery state.
H200_GPU0 = {
    "power_draw_w": 82.65,
    "power_instant_w": 82.81,
    "recovery_action": "None",
    "channel_repair_pending": False,
    "tpc_repair_pending": False,
    "unrepairable_memory": False,
}

ZERO_UUID = "00000000-0000-0000-0000-000000000000"
# A pass-through H100: a fabric that has placed the GPU in no cluster (clique 0, zero UUID)
# and a platform block N/A but for the module id.
H100_590_IDLE_GPU0: dict[str, object] = {
    "fabric_state": "Completed",
    "fabric_clique_id": 0,
    "fabric_cluster_uuid": ZERO_UUID,
    "chassis_serial": None,
    "slot_number": None,
    "tray_index": None,
    "host_id": None,
    "peer_type": None,
    "platform_module_id": 7,
}

# A GB200 compute tray: NVLink domain (cluster UUID, clique 2) and where the GPU sits.
GB200_GPU0: dict[str, object] = {
    "fabric_clique_id": 2,
    "fabric_cluster_uuid": "00000001-0000-0000-0000-000000000001",
    "chassis_serial": "1820000000001",
    "slot_number": 14,
    "tray_index": 4,
    "host_id": 1,
    "peer_type": "Switch Connected",
    "platform_module_id": 2,
}

# An HGX B200: the serial printed empty (the driver answered; not N/A), no slot or tray.
B200_GPU0: dict[str, object] = {
    "fabric_clique_id": 0,
    "fabric_cluster_uuid": ZERO_UUID,
    "chassis_serial": "",
    "slot_number": None,
    "tray_index": None,
    "host_id": 1,
    "peer_type": "Switch Connected",
    "platform_module_id": 6,
}

GPU_VALUES = [
    (H100_161, 0, H100_161_GPU0),
    (H100_183, 2, H100_183_GPU2),
    (A10, 0, A10_GPU0),
    (RTX4090, 0, RTX4090_GPU0),
    (RTX4090_BUSY, 1, RTX4090_BUSY_GPU1),
    (TITAN_V, 0, TITAN_V_GPU0),
    (A100_MIG, 0, A100_MIG_GPU0),
    (A10G, 0, A10G_GPU0),
    (H200_TEXT, 0, H200_GPU0),
    (H200_XML, 0, {**H200_GPU0, "power_draw_w": 82.69}),
    (RTX2080S_610, 0, RTX2080S_610_GPU0),
    (T4_595, 0, {**T4_595_GPU0, "fabric_clique_id": None, "chassis_serial": None}),
    (H100_590_IDLE, 0, H100_590_IDLE_GPU0),
    (GB200, 0, GB200_GPU0),
    (GB200, 1, {**GB200_GPU0, "platform_module_id": 1}),
    (B200, 0, B200_GPU0),
]


@pytest.mark.parametrize(
    ("name", "index", "field", "expected"),
    [
        pytest.param(name, index, field, expected, id=f"{name.split('.n')[0]}-gpu{index}-{field}")
        for name, index, values in GPU_VALUES
        for field, expected in values.items()
    ],
)
def test_gpu_value(name: str, index: int, field: str, expected: object) -> None:
    assert getattr(_load(name).gpus[index], field) == expected


def test_h100_161_every_gpu_is_in_hw_power_brake_slowdown() -> None:
    gpus = _load(H100_161).gpus
    reasons = [gpu.clock_event_reasons for gpu in gpus]
    assert all(r is not None and r.hw_slowdown for r in reasons)
    assert all(r is not None and r.hw_power_brake_slowdown for r in reasons)
    assert not any(r is not None and r.hw_thermal_slowdown for r in reasons)
    assert [gpu.pcie_replays for gpu in gpus] == [67, 63, 52, 43, 49, 53, 82, 67]
    assert [gpu.bus_id for gpu in gpus] == [
        "00000000:19:00.0",
        "00000000:3B:00.0",
        "00000000:4C:00.0",
        "00000000:5D:00.0",
        "00000000:9B:00.0",
        "00000000:BB:00.0",
        "00000000:CB:00.0",
        "00000000:DB:00.0",
    ]
    assert {gpu.fabric_state for gpu in gpus} == {"Completed"}


def test_h100_183_power_brake_on_one_gpu_only() -> None:
    braking = [
        gpu.bus_id
        for gpu in _load(H100_183).gpus
        if gpu.clock_event_reasons is not None and gpu.clock_event_reasons.hw_power_brake_slowdown
    ]
    assert braking == ["00000000:75:00.0"]


def test_rtx4090_busy_two_gpus_work_six_idle() -> None:
    gpus = _load(RTX4090_BUSY).gpus
    busy = {gpu.bus_id: [p.pid for p in gpu.processes] for gpu in gpus if gpu.processes}
    assert busy == {"00000000:23:00.0": [1285135], "00000000:81:00.0": [1292330]}
    assert [gpu.performance_state for gpu in gpus] == [8, 2, 8, 8, 2, 8, 8, 8]


def test_rtx4090_every_gpu_holds_one_process_while_idle() -> None:
    gpus = _load(RTX4090).gpus
    assert [len(gpu.processes) for gpu in gpus] == [1] * 8
    assert {gpu.utilization_gpu_pct for gpu in gpus} == {0}
    # A process name with colons and spaces stays whole.
    assert gpus[4].processes[0].name.startswith("[celeryd: expand_image_with_self_model_lepton@")
    assert gpus[4].processes[0].used_mib == 9958


# --- bad input: refused, naming the line -------------------------------------------------------


def _lines(name: str, count: int) -> str:
    return "\n".join(_read(name).split("\n")[:count]) + "\n"


def _replace(name: str, old: str, new: str) -> str:
    text = _read(name)
    assert old in text
    return text.replace(old, new, 1)


def _drop_line(name: str, number: int) -> str:
    lines = _read(name).split("\n")
    del lines[number - 1]
    return "\n".join(lines)


H100_TEXT_BANNER = "==============NVSMI LOG=============="

BAD_INPUTS = [
    pytest.param("", 1, "the file is empty", id="empty"),
    pytest.param("\n  \n\n", 1, "the file is empty", id="blank-lines"),
    pytest.param("hello world\nthis is not it\n", 1, "not an nvidia-smi -q capture", id="text"),
    pytest.param("\n\nhello\n", 3, "not an nvidia-smi -q capture", id="text-after-blanks"),
    pytest.param('{"gpus": [{"uuid": "GPU-1"}]}\n', 1, "not an nvidia-smi -q capture", id="json"),
    pytest.param(
        "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
        "[ 1234.567999] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n",
        1,
        "not an nvidia-smi -q capture",
        id="kmsg",
    ),
    pytest.param(
        f"{H100_TEXT_BANNER}\n\nDriver Version : 535.161.08\n",
        3,
        "no GPU block",
        id="header-only",
    ),
    pytest.param(_lines(H100_161, 100), 100, "cut short", id="text-cut-in-first-gpu"),
    pytest.param(_lines(H100_161, 300), 300, "cut short", id="text-cut-in-second-gpu"),
    pytest.param(_lines(H100_161, 9), 9, "cut short", id="text-cut-after-gpu-line"),
    pytest.param(_lines(H100_183, 621), 621, "cut short", id="text-cut-at-processes-header"),
    pytest.param(_lines(H100_183, 622), 622, "has no Process ID", id="text-cut-in-processes"),
    pytest.param(_lines(H100_183, 624), 624, "has no Name", id="text-cut-in-a-process"),
    pytest.param(_drop_line(H100_161, 10), 9, "has no Product Name", id="text-no-product-name"),
    pytest.param(_drop_line(A10, 4), 7, "no Driver Version", id="text-no-driver-version"),
    pytest.param(
        _replace(A10, "Bus Id                            : 00000000:07:00.0", "Bus Id : N/A"),
        59,
        "has no PCI / Bus Id",
        id="text-bus-id-na",
    ),
    pytest.param(
        _replace(A10, "Bus Id                            : 00000000:07:00.0", "Bus Id : 0:08:00.0"),
        59,
        "is not the block's",
        id="text-bus-id-differs",
    ),
    pytest.param(_lines(A100_MIG, 150), 150, "cut short", id="xml-cut-at-a-line"),
    pytest.param(_read(A100_MIG)[:4000], 93, "cut short", id="xml-cut-mid-line"),
    pytest.param(
        _replace(
            A100_MIG,
            '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">',
            '<!DOCTYPE nvidia_smi_log [\n<!ENTITY lol "lol">\n]>',
        ),
        3,
        "entity declarations are refused",
        id="xml-entity",
    ),
    pytest.param(
        '<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [\n'
        '  <!ENTITY xxe SYSTEM "file:///etc/passwd">\n]>\n'
        "<nvidia_smi_log><driver_version>&xxe;</driver_version></nvidia_smi_log>\n",
        3,
        "entity declarations are refused",
        id="xml-external-entity",
    ),
    pytest.param(
        '<?xml version="1.0"?>\n<nvidia_smi_log>\n  <gpu></pci>\n</nvidia_smi_log>\n',
        3,
        "not well-formed XML: mismatched tag",
        id="xml-mismatched-tag",
    ),
    pytest.param(
        '<?xml version="1.0"?>\n<html>\n<body/></html>\n',
        2,
        "not an nvidia-smi -q capture",
        id="xml-other-document",
    ),
    pytest.param(
        '<?xml version="1.0"?>\n<nvidia_smi_log>\n'
        "  <driver_version>535.54.03</driver_version>\n</nvidia_smi_log>\n",
        4,
        "no <gpu> element",
        id="xml-no-gpu",
    ),
    pytest.param(
        _replace(A100_MIG, "<product_name>NVIDIA A100-SXM4-80GB</product_name>", ""),
        8,
        "has no <product_name>",
        id="xml-no-product-name",
    ),
    pytest.param(
        _replace(A100_MIG, "<pci_bus_id>00000000:01:00.0</pci_bus_id>", ""),
        8,
        "has no <pci>/<pci_bus_id>",
        id="xml-no-bus-id",
    ),
    pytest.param(
        _replace(A100_MIG, "<driver_version>535.54.03</driver_version>", ""),
        3,
        "no <driver_version>",
        id="xml-no-driver-version",
    ),
]


# A value the parser does not understand is absent, with a note naming its line; the rest of
# the capture is read. (Structure errors above still refuse the file.)
UNREADABLE_VALUES = [
    pytest.param(
        _replace(H100_161, ": 67.74 W", ": banana"),
        171,
        'GPU Power Readings / Power Draw: expected a number in W, got "banana"',
        "power_draw_w",
        id="text-power-banana",
    ),
    pytest.param(
        _replace(H100_161, ": 67.74 W", ": 67.74 kW"),
        171,
        "a number in W",
        "power_draw_w",
        id="text-wrong-unit",
    ),
    pytest.param(
        _replace(H100_161, "Replays Since Reset               : 67", "Replays Since Reset : lots"),
        75,
        "PCI / Replays Since Reset",
        "pcie_replays",
        id="text-replays-not-a-number",
    ),
    pytest.param(
        _replace(
            H100_161, "Persistence Mode                      : Enabled", "Persistence Mode : ?"
        ),
        15,
        "Persistence Mode",
        "persistence_mode",
        id="text-flag-unknown",
    ),
    pytest.param(
        _replace(H100_161, ": P0", ": fast"),
        82,
        "a performance state",
        "performance_state",
        id="text-pstate",
    ),
    pytest.param(
        _replace(A100_MIG, "<power_draw>67.03 W</power_draw>", "<power_draw>banana</power_draw>"),
        310,
        'gpu_power_readings / power_draw: expected a number in W, got "banana"',
        "power_draw_w",
        id="xml-power-banana",
    ),
    pytest.param(
        _replace(
            GB200,
            "<clusterUuid>00000001-0000-0000-0000-000000000001</clusterUuid>",
            "<clusterUuid>cluster-one</clusterUuid>",
        ),
        302,
        'fabric / clusterUuid: expected a UUID, got "cluster-one"',
        "fabric_cluster_uuid",
        id="xml-cluster-uuid",
    ),
]


@pytest.mark.parametrize(("text", "line", "message", "attribute"), UNREADABLE_VALUES)
def test_a_value_not_understood_is_absent_and_noted(
    text: str, line: int, message: str, attribute: str
) -> None:
    capture = parse_capture(text)
    assert getattr(capture.gpus[0], attribute) is None
    (note,) = [n for n in capture.notes if n.startswith(f"line {line}: ")]
    assert message in note


def test_a_word_not_understood_in_every_gpu_is_one_note() -> None:
    capture = parse_capture(_read(H100_161).replace(": P0", ": fast"))
    assert [gpu.performance_state for gpu in capture.gpus] == [None] * 8
    note = (
        "line 82: GPU 00000000:19:00.0 / Performance State: expected a performance state "
        '(P0 to P15), got "fast" (and 7 more fields)'
    )
    assert capture.notes == (note,)


# What nvidia-smi prints where it has no value is "not available", quietly: never a note.
# Drivers 570+ print "Requested functionality has been deprecated" for applications clocks
# (the 590 and 610 text captures, the 595 XML ones); "Insufficient Permissions" is in the
# B200 and GB200 captures; the bracketed forms are older drivers'.
@pytest.mark.parametrize(
    "token",
    [
        "N/A",
        "[N/A]",
        "Not Supported",
        "[Not Supported]",
        "Unknown Error",
        "[Unknown Error]",
        "Insufficient Permissions",
        "[Insufficient Permissions]",
        "Not Available",
        "Requested functionality has been deprecated",
        "[Requested functionality has been deprecated]",
    ],
)
def test_a_known_no_value_token_is_absent_without_a_note(token: str) -> None:
    text = _replace(H100_161, "Graphics                          : 1980 MHz", f"Graphics : {token}")
    capture = parse_capture(text)
    assert capture.gpus[0].applications_clock_graphics_mhz is None
    assert capture.notes == ()


@pytest.mark.parametrize(
    "name", sorted(p.name for p in DATA.iterdir() if p.suffix in (".txt", ".xml"))
)
def test_real_captures_read_without_a_note(name: str) -> None:
    assert _load(name).notes == ()


@pytest.mark.parametrize("name", [RTX2080S_610, H200_590_IDLE, H100_590_BUSY, L40S_595, T4_595])
def test_deprecated_applications_clocks_are_absent(name: str) -> None:
    gpu = _load(name).gpus[0]
    assert (gpu.applications_clock_graphics_mhz, gpu.applications_clock_memory_mhz) == (
        None,
        None,
    )


@pytest.mark.parametrize(
    ("name", "health"),
    [
        pytest.param(
            GB200,
            (
                ("bandwidth_degraded", False),
                ("route_recovery", False),
                ("route_unhealthy", False),
                ("access_timeout_recovery", False),
            ),
            id="gb200-bandwidth-full",
        ),
        pytest.param(B200, (("access_timeout_recovery", False),), id="b200-mostly-na"),
        pytest.param(H200_590_IDLE, (), id="h200-all-na"),
        pytest.param(H100_161, (), id="h100-535-no-health-block"),
    ],
)
def test_the_fabric_health_block_reads_what_it_reports(
    name: str, health: tuple[tuple[str, bool], ...]
) -> None:
    assert _load(name).gpus[0].fabric_health == health


def test_a_capture_read_whole_has_no_notes() -> None:
    for name in (H100_161, A100_MIG, H200_TEXT, B200):
        assert _load(name).notes == (), name


@pytest.mark.parametrize(
    ("header", "version"),
    [
        pytest.param("Driver Version : 590.48.01", "590.48.01", id="plain"),
        pytest.param(
            "Driver Version : 610.57.04 [Deprecated; will be removed in CUDA 14.0. Use KMD "
            "Version instead]\nKMD Version : 610.57.04",
            "610.57.04",
            id="610-kmd-version",
        ),
        pytest.param(
            "Driver Version : 610.57.04 [Deprecated; will be removed in CUDA 14.0.]",
            "610.57.04",
            id="610-deprecated-note-only",
        ),
        pytest.param("Driver Version : 535.54", "535.54", id="two-parts"),
    ],
)
def test_the_driver_version_is_the_first_version_number(header: str, version: str) -> None:
    text = _read(H200_590_IDLE).replace(
        "Driver Version                                         : 590.48.01", header
    )
    assert parse_capture(text).driver_version == version


def test_a_driver_version_without_a_number_is_refused() -> None:
    text = _read(H200_590_IDLE).replace(": 590.48.01", ": unknown build")
    with pytest.raises(CaptureError, match="holds no version number"):
        parse_capture(text)


@pytest.mark.parametrize(("text", "line", "message"), BAD_INPUTS)
def test_bad_input_is_refused_with_its_line(text: str, line: int, message: str) -> None:
    with pytest.raises(CaptureError) as caught:
        parse_capture(text)
    assert caught.value.line == line
    assert message in caught.value.message
    assert str(caught.value).startswith(f"line {line}: ")


def test_refusal_message_says_what_was_expected() -> None:
    with pytest.raises(CaptureError) as caught:
        parse_capture('{"not": "a capture"}')
    assert str(caught.value) == (
        'line 1: not an nvidia-smi -q capture (expected "==============NVSMI LOG=============="'
        " or an <nvidia_smi_log> XML document)"
    )


def test_a_missing_file_is_a_capture_error(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="cannot read") as caught:
        load_capture(tmp_path / "absent.txt")
    assert caught.value.line is None


def test_a_directory_is_a_capture_error(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="cannot read"):
        load_capture(tmp_path)


def test_a_binary_file_is_a_capture_error(tmp_path: Path) -> None:
    path = tmp_path / "capture.bin"
    path.write_bytes(b"==============NVSMI LOG==============\n\n\x89PNG\xff\xfe\n")
    with pytest.raises(CaptureError, match="not UTF-8") as caught:
        load_capture(path)
    assert caught.value.line == 3


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "capture.xml"
    path.write_bytes(b"\xef\xbb\xbf" + (DATA / A10G).read_bytes())
    assert load_capture(path) == _load(A10G)


def test_a_doctype_without_entities_is_accepted() -> None:
    # nvidia-smi's own DOCTYPE names an external DTD, which is never fetched.
    assert '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">' in _read(A100_MIG)
    assert _load(A100_MIG).gpus[0].product_name == "NVIDIA A100-SXM4-80GB"


def test_windows_line_endings_are_accepted() -> None:
    text = _read(A10).replace("\n", "\r\n")
    assert parse_capture(text) == _load(A10)


def test_unknown_keys_and_tags_are_ignored() -> None:
    text = _replace(
        A10, "    Fan Speed", "    Warp Drive                            : 11 %\n    Fan Speed"
    )
    assert parse_capture(text) == _load(A10)
    xml = _replace(A10G, "<fan_speed>", "<warp_drive>11 %</warp_drive>\n        <fan_speed>")
    assert parse_capture(xml).gpus[0] == dataclasses.replace(_load(A10G).gpus[0], line=8)


# --- text and XML read alike ---------------------------------------------------------------------

# One GPU, written out by hand in both formats with the same values (535's layouts: SRAM
# uncorrectable split into parity and SEC-DED, T.Limit thresholds, a process).
TEXT_CAPTURE = """
==============NVSMI LOG==============

Timestamp                                 : Tue Mar  4 10:00:00 2025
Driver Version                            : 535.183.01
CUDA Version                              : 12.2

Attached GPUs                             : 1
GPU 00000000:1B:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    Product Brand                         : NVIDIA
    Product Architecture                  : Hopper
    Persistence Mode                      : Enabled
    MIG Mode
        Current                           : Disabled
        Pending                           : Enabled
    Serial Number                         : 1650000000001
    GPU UUID                              : GPU-00000000-1111-2222-3333-444444444444
    Minor Number                          : 3
    VBIOS Version                         : 96.00.74.00.0D
    Module ID                             : 4
    Platform Info
        Chassis Serial Number             : 1820000000007
        Slot Number                       : 9
        Tray Index                        : 3
        Host ID                           : 1
        Peer Type                         : Direct Connected
        Module Id                         : 4
        GPU Fabric GUID                   : 0x0000000000000004
    Inforom Version
        Image Version                     : G520.0200.00.05
    GSP Firmware Version                  : 535.183.01
    GPU Virtualization Mode
        Virtualization Mode               : None
    GPU Reset Status
        Reset Required                    : Yes
        Drain and Reset Recommended       : No
    PCI
        Device Id                         : 0x233010DE
        Bus Id                            : 00000000:1B:00.0
        Sub System Id                     : 0x16C110DE
        GPU Link Info
            PCIe Generation
                Max                       : 5
                Current                   : 4
                Device Current            : 4
                Device Max                : 5
                Host Max                  : 5
            Link Width
                Max                       : 16x
                Current                   : 8x
        Replays Since Reset               : 12
        Replay Number Rollovers           : 1
        Tx Throughput                     : 100 KB/s
        Rx Throughput                     : 200 KB/s
    Fan Speed                             : 40 %
    Performance State                     : P2
    Clocks Event Reasons
        Idle                              : Not Active
        Applications Clocks Setting       : Not Active
        SW Power Cap                      : Active
        HW Slowdown                       : Active
            HW Thermal Slowdown           : Active
            HW Power Brake Slowdown       : Not Active
        Sync Boost                        : Not Active
        SW Thermal Slowdown               : Not Active
        Display Clock Setting             : Not Active
    FB Memory Usage
        Total                             : 81559 MiB
        Reserved                          : 551 MiB
        Used                              : 1024 MiB
        Free                              : 79984 MiB
    Compute Mode                          : Exclusive_Process
    Utilization
        Gpu                               : 55 %
        Memory                            : 12 %
        Encoder                           : 0 %
        Decoder                           : 1 %
    ECC Mode
        Current                           : Enabled
        Pending                           : Disabled
    ECC Errors
        Volatile
            SRAM Correctable              : 1
            SRAM Uncorrectable Parity     : 2
            SRAM Uncorrectable SEC-DED    : 3
            DRAM Correctable              : 4
            DRAM Uncorrectable            : 5
        Aggregate
            SRAM Correctable              : 6
            SRAM Uncorrectable Parity     : 7
            SRAM Uncorrectable SEC-DED    : 8
            DRAM Correctable              : 9
            DRAM Uncorrectable            : 10
            SRAM Threshold Exceeded       : Yes
    Retired Pages
        Single Bit ECC                    : 2
        Double Bit ECC                    : 1
        Pending Page Blacklist            : Yes
    Remapped Rows
        Correctable Error                 : 3
        Uncorrectable Error               : 1
        Pending                           : Yes
        Remapping Failure Occurred        : No
        Bank Remap Availability Histogram
            Max                           : 2550 bank(s)
            High                          : 8 bank(s)
            Partial                       : 2 bank(s)
            Low                           : 0 bank(s)
            None                          : 0 bank(s)
    Temperature
        GPU Current Temp                  : 71 C
        GPU T.Limit Temp                  : 14 C
        GPU Shutdown T.Limit Temp         : -8 C
        GPU Slowdown T.Limit Temp         : -2 C
        GPU Max Operating T.Limit Temp    : 0 C
        GPU Target Temperature            : N/A
        Memory Current Temp               : 80 C
        Memory Max Operating T.Limit Temp : 0 C
    GPU Power Readings
        Power Draw                        : 512.25 W
        Current Power Limit               : 650.00 W
        Requested Power Limit             : 650.00 W
        Default Power Limit               : 700.00 W
        Min Power Limit                   : 200.00 W
        Max Power Limit                   : 700.00 W
    Clocks
        Graphics                          : 1755 MHz
        SM                                : 1755 MHz
        Memory                            : 2619 MHz
        Video                             : 1365 MHz
    Applications Clocks
        Graphics                          : 1980 MHz
        Memory                            : 2619 MHz
    Default Applications Clocks
        Graphics                          : 1980 MHz
        Memory                            : 2619 MHz
    Max Clocks
        Graphics                          : 1980 MHz
        SM                                : 1980 MHz
        Memory                            : 2619 MHz
        Video                             : 1545 MHz
    Fabric
        State                             : In Progress
        Status                            : N/A
        CliqueId                          : 7
        ClusterUUID                       : A1B2C3D4-0000-4000-8000-00000000ABCD
    Processes
        GPU instance ID                   : N/A
        Compute instance ID               : N/A
        Process ID                        : 4242
            Type                          : C
            Name                          : /usr/bin/python3
            Used GPU Memory               : 1000 MiB
"""

# The longest tags are closed on the next line: the parser strips the whitespace around a
# value, as nvidia-smi's own "<mig_devices>\n None\n </mig_devices>" needs.
XML_CAPTURE = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
    <timestamp>Tue Mar  4 10:00:00 2025</timestamp>
    <driver_version>535.183.01</driver_version>
    <cuda_version>12.2</cuda_version>
    <attached_gpus>1</attached_gpus>
    <gpu id="00000000:1B:00.0">
        <product_name>NVIDIA H100 80GB HBM3</product_name>
        <product_brand>NVIDIA</product_brand>
        <product_architecture>Hopper</product_architecture>
        <persistence_mode>Enabled</persistence_mode>
        <mig_mode>
            <current_mig>Disabled</current_mig>
            <pending_mig>Enabled</pending_mig>
        </mig_mode>
        <mig_devices>
            None
        </mig_devices>
        <serial>1650000000001</serial>
        <uuid>GPU-00000000-1111-2222-3333-444444444444</uuid>
        <minor_number>3</minor_number>
        <vbios_version>96.00.74.00.0D</vbios_version>
        <gpu_module_id>4</gpu_module_id>
        <platformInfo>
            <chassis_serial_number>1820000000007</chassis_serial_number>
            <slot_number>9</slot_number>
            <tray_index>3</tray_index>
            <host_id>1</host_id>
            <peer_type>Direct Connected</peer_type>
            <module_id>4</module_id>
            <gpu_fabric_guid>0x0000000000000004</gpu_fabric_guid>
        </platformInfo>
        <inforom_version>
            <img_version>G520.0200.00.05</img_version>
        </inforom_version>
        <gsp_firmware_version>535.183.01</gsp_firmware_version>
        <gpu_virtualization_mode>
            <virtualization_mode>None</virtualization_mode>
        </gpu_virtualization_mode>
        <gpu_reset_status>
            <reset_required>Yes</reset_required>
            <drain_and_reset_recommended>No</drain_and_reset_recommended>
        </gpu_reset_status>
        <pci>
            <pci_device_id>233010DE</pci_device_id>
            <pci_bus_id>00000000:1B:00.0</pci_bus_id>
            <pci_sub_system_id>16C110DE</pci_sub_system_id>
            <pci_gpu_link_info>
                <pcie_gen>
                    <max_link_gen>5</max_link_gen>
                    <current_link_gen>4</current_link_gen>
                    <device_current_link_gen>4</device_current_link_gen>
                    <max_device_link_gen>5</max_device_link_gen>
                    <max_host_link_gen>5</max_host_link_gen>
                </pcie_gen>
                <link_widths>
                    <max_link_width>16x</max_link_width>
                    <current_link_width>8x</current_link_width>
                </link_widths>
            </pci_gpu_link_info>
            <replay_counter>12</replay_counter>
            <replay_rollover_counter>1</replay_rollover_counter>
            <tx_util>100 KB/s</tx_util>
            <rx_util>200 KB/s</rx_util>
        </pci>
        <fan_speed>40 %</fan_speed>
        <performance_state>P2</performance_state>
        <clocks_event_reasons>
            <clocks_event_reason_gpu_idle>Not Active</clocks_event_reason_gpu_idle>
            <clocks_event_reason_applications_clocks_setting>Not Active
            </clocks_event_reason_applications_clocks_setting>
            <clocks_event_reason_sw_power_cap>Active</clocks_event_reason_sw_power_cap>
            <clocks_event_reason_hw_slowdown>Active</clocks_event_reason_hw_slowdown>
            <clocks_event_reason_hw_thermal_slowdown>Active
            </clocks_event_reason_hw_thermal_slowdown>
            <clocks_event_reason_hw_power_brake_slowdown>Not Active
            </clocks_event_reason_hw_power_brake_slowdown>
            <clocks_event_reason_sync_boost>Not Active</clocks_event_reason_sync_boost>
            <clocks_event_reason_sw_thermal_slowdown>Not Active
            </clocks_event_reason_sw_thermal_slowdown>
            <clocks_event_reason_display_clocks_setting>Not Active
            </clocks_event_reason_display_clocks_setting>
        </clocks_event_reasons>
        <fb_memory_usage>
            <total>81559 MiB</total>
            <reserved>551 MiB</reserved>
            <used>1024 MiB</used>
            <free>79984 MiB</free>
        </fb_memory_usage>
        <compute_mode>Exclusive_Process</compute_mode>
        <utilization>
            <gpu_util>55 %</gpu_util>
            <memory_util>12 %</memory_util>
            <encoder_util>0 %</encoder_util>
            <decoder_util>1 %</decoder_util>
        </utilization>
        <ecc_mode>
            <current_ecc>Enabled</current_ecc>
            <pending_ecc>Disabled</pending_ecc>
        </ecc_mode>
        <ecc_errors>
            <volatile>
                <sram_correctable>1</sram_correctable>
                <sram_uncorrectable_parity>2</sram_uncorrectable_parity>
                <sram_uncorrectable_secded>3</sram_uncorrectable_secded>
                <dram_correctable>4</dram_correctable>
                <dram_uncorrectable>5</dram_uncorrectable>
            </volatile>
            <aggregate>
                <sram_correctable>6</sram_correctable>
                <sram_uncorrectable_parity>7</sram_uncorrectable_parity>
                <sram_uncorrectable_secded>8</sram_uncorrectable_secded>
                <dram_correctable>9</dram_correctable>
                <dram_uncorrectable>10</dram_uncorrectable>
                <sram_threshold_exceeded>Yes</sram_threshold_exceeded>
            </aggregate>
        </ecc_errors>
        <retired_pages>
            <multiple_single_bit_retirement>
                <retired_count>2</retired_count>
            </multiple_single_bit_retirement>
            <double_bit_retirement>
                <retired_count>1</retired_count>
            </double_bit_retirement>
            <pending_blacklist>Yes</pending_blacklist>
            <pending_retirement>Yes</pending_retirement>
        </retired_pages>
        <remapped_rows>
            <remapped_row_corr>3</remapped_row_corr>
            <remapped_row_unc>1</remapped_row_unc>
            <remapped_row_pending>Yes</remapped_row_pending>
            <remapped_row_failure>No</remapped_row_failure>
            <row_remapper_histogram>
                <row_remapper_histogram_max>2550 bank(s)</row_remapper_histogram_max>
                <row_remapper_histogram_high>8 bank(s)</row_remapper_histogram_high>
                <row_remapper_histogram_partial>2 bank(s)</row_remapper_histogram_partial>
                <row_remapper_histogram_low>0 bank(s)</row_remapper_histogram_low>
                <row_remapper_histogram_none>0 bank(s)</row_remapper_histogram_none>
            </row_remapper_histogram>
        </remapped_rows>
        <temperature>
            <gpu_temp>71 C</gpu_temp>
            <gpu_temp_tlimit>14 C</gpu_temp_tlimit>
            <gpu_temp_max_tlimit_threshold>-8 C</gpu_temp_max_tlimit_threshold>
            <gpu_temp_slow_tlimit_threshold>-2 C</gpu_temp_slow_tlimit_threshold>
            <gpu_temp_max_gpu_tlimit_threshold>0 C</gpu_temp_max_gpu_tlimit_threshold>
            <gpu_target_temperature>N/A</gpu_target_temperature>
            <memory_temp>80 C</memory_temp>
            <gpu_temp_max_mem_tlimit_threshold>0 C</gpu_temp_max_mem_tlimit_threshold>
        </temperature>
        <gpu_power_readings>
            <power_draw>512.25 W</power_draw>
            <current_power_limit>650.00 W</current_power_limit>
            <requested_power_limit>650.00 W</requested_power_limit>
            <default_power_limit>700.00 W</default_power_limit>
            <min_power_limit>200.00 W</min_power_limit>
            <max_power_limit>700.00 W</max_power_limit>
        </gpu_power_readings>
        <clocks>
            <graphics_clock>1755 MHz</graphics_clock>
            <sm_clock>1755 MHz</sm_clock>
            <mem_clock>2619 MHz</mem_clock>
            <video_clock>1365 MHz</video_clock>
        </clocks>
        <applications_clocks>
            <graphics_clock>1980 MHz</graphics_clock>
            <mem_clock>2619 MHz</mem_clock>
        </applications_clocks>
        <default_applications_clocks>
            <graphics_clock>1980 MHz</graphics_clock>
            <mem_clock>2619 MHz</mem_clock>
        </default_applications_clocks>
        <max_clocks>
            <graphics_clock>1980 MHz</graphics_clock>
            <sm_clock>1980 MHz</sm_clock>
            <mem_clock>2619 MHz</mem_clock>
            <video_clock>1545 MHz</video_clock>
        </max_clocks>
        <fabric>
            <state>In Progress</state>
            <status>N/A</status>
            <cliqueId>7</cliqueId>
            <clusterUuid>a1b2c3d4-0000-4000-8000-00000000abcd</clusterUuid>
        </fabric>
        <processes>
            <process_info>
                <gpu_instance_id>N/A</gpu_instance_id>
                <compute_instance_id>N/A</compute_instance_id>
                <pid>4242</pid>
                <type>C</type>
                <process_name>/usr/bin/python3</process_name>
                <used_memory>1000 MiB</used_memory>
            </process_info>
        </processes>
    </gpu>
</nvidia_smi_log>
"""

# What neither hand-written capture has a value for (they are laid out as before 550,
# with one power draw and no instantaneous one, and no recovery state).
UNSET_IN_BOTH = {
    "mig_devices",
    "fabric_status",
    "fabric_health",
    "power_instant_w",
    "module_power_w",
    "module_power_limit_w",
    "recovery_action",
    "channel_repair_pending",
    "tpc_repair_pending",
    "unrepairable_memory",
}


def test_text_and_xml_of_the_same_gpu_read_alike() -> None:
    text, xml = parse_capture(TEXT_CAPTURE), parse_capture(XML_CAPTURE)
    assert (text.format, xml.format) == ("text", "xml")
    assert dataclasses.replace(text, format="xml", gpus=()) == dataclasses.replace(xml, gpus=())
    (text_gpu,), (xml_gpu,) = text.gpus, xml.gpus
    assert (text_gpu.line, xml_gpu.line) == (9, 8)
    assert dataclasses.replace(text_gpu, line=0) == dataclasses.replace(xml_gpu, line=0)
    unset = {
        field.name
        for field in dataclasses.fields(CapturedGpu)
        if getattr(text_gpu, field.name) in (None, ())
    }
    assert unset == UNSET_IN_BOTH


def test_the_hand_written_gpu_reads_as_written() -> None:
    gpu = parse_capture(TEXT_CAPTURE).gpus[0]
    assert (gpu.sram_uncorrected_volatile, gpu.sram_uncorrected_aggregate) == (5, 15)
    assert (gpu.ecc_corrected_volatile, gpu.ecc_uncorrected_aggregate) == (4, 10)
    assert gpu.sram_threshold_exceeded is True
    assert (gpu.retired_pages_sbe, gpu.retired_pages_dbe, gpu.retired_pages_pending) == (2, 1, True)
    assert gpu.remap_histogram == (2550, 8, 2, 0, 0)
    assert gpu.thresholds == TemperatureThresholds(
        tlimit=True, shutdown=-8, slowdown=-2, gpu_max=0, memory_max=0, margin=14
    )
    assert gpu.processes == (CapturedProcess(pid=4242, name="/usr/bin/python3", used_mib=1000),)
    assert gpu.clock_event_reasons is not None
    assert gpu.clock_event_reasons.hw_thermal_slowdown is True
    # The text's upper-case UUID in its canonical form, as the XML has it.
    assert (gpu.fabric_clique_id, gpu.fabric_cluster_uuid) == (
        7,
        "a1b2c3d4-0000-4000-8000-00000000abcd",
    )
    placement = (gpu.chassis_serial, gpu.slot_number, gpu.tray_index, gpu.host_id)
    assert placement == ("1820000000007", 9, 3, 1)
    assert (gpu.peer_type, gpu.platform_module_id) == ("Direct Connected", 4)


# The A100's four MIG devices as the text format lists them: each "MIG Device" block in
# the GPU block, or all of them under a "MIG Devices" header.
MIG_DEVICE = """\
    MIG Device
        Index                             : {index}
        GPU Instance ID                   : {gi}
        Compute Instance ID               : 0
        Device Attributes
            Shared
                Multiprocessor count      : 14
                Copy Engine count         : 1
        ECC Errors
            Volatile
                SRAM Uncorrectable        : 0
        FB Memory Usage
            Total                         : 19968 MiB
            Reserved                      : 0 MiB
            Used                          : 12 MiB
            Free                          : 19955 MiB
"""


def _mig_text(*, under_header: bool) -> str:
    devices = "".join(MIG_DEVICE.format(index=index, gi=index + 3) for index in range(4))
    if under_header:
        devices = "    MIG Devices\n" + "".join(f"    {line}\n" for line in devices.splitlines())
    return (
        f"{H100_TEXT_BANNER}\n\nDriver Version : 535.54.03\n\n"
        "GPU 00000000:01:00.0\n"
        "    Product Name                          : NVIDIA A100-SXM4-80GB\n"
        "    MIG Mode\n"
        "        Current                           : Enabled\n"
        "        Pending                           : Enabled\n"
        f"{devices}"
        "    PCI\n"
        "        Bus Id                            : 00000000:01:00.0\n"
        "    Processes                             : None\n"
    )


@pytest.mark.parametrize("under_header", [False, True], ids=["in-gpu-block", "under-header"])
def test_text_mig_devices_read_like_the_xml(under_header: bool) -> None:
    gpu = parse_capture(_mig_text(under_header=under_header)).gpus[0]
    assert gpu.mig_current is True
    assert gpu.mig_devices == _load(A100_MIG).gpus[0].mig_devices


def test_older_layouts() -> None:
    """Clocks Throttle Reasons, Power Readings with Enforced Power Limit, ECC as Single Bit
    and Double Bit totals, absolute thresholds: what drivers before 535 print."""
    text = (
        f"{H100_TEXT_BANNER}\n\nDriver Version : 470.182.03\nAttached GPUs : 1\n"
        "GPU 00000000:3B:00.0\n"
        "    Product Name                          : Tesla V100-SXM2-32GB\n"
        "    PCI\n"
        "        Bus Id                            : 00000000:3B:00.0\n"
        "    Clocks Throttle Reasons\n"
        "        Idle                              : Active\n"
        "        HW Slowdown                       : Not Active\n"
        "            HW Thermal Slowdown           : Active\n"
        "    ECC Errors\n"
        "        Volatile\n"
        "            Single Bit\n"
        "                Device Memory             : 3\n"
        "                Total                     : 7\n"
        "            Double Bit\n"
        "                Device Memory             : 0\n"
        "                Total                     : 1\n"
        "    Retired Pages\n"
        "        Single Bit ECC                    : 2\n"
        "        Double Bit ECC                    : 0\n"
        "        Pending Page Blacklist            : No\n"
        "    Temperature\n"
        "        GPU Current Temp                  : 40 C\n"
        "        GPU Shutdown Temp                 : 90 C\n"
        "        GPU Slowdown Temp                 : 87 C\n"
        "        GPU Max Operating Temp            : 83 C\n"
        "        Memory Max Operating Temp         : 85 C\n"
        "    Power Readings\n"
        "        Power Draw                        : 42.50 W\n"
        "        Power Limit                       : 250.00 W\n"
        "        Enforced Power Limit              : 300.00 W\n"
        "    Processes                             : None\n"
    )
    gpu = parse_capture(text).gpus[0]
    assert gpu.clock_event_reasons == ClockEventReasons(
        idle=True, hw_slowdown=False, hw_thermal_slowdown=True
    )
    assert (gpu.ecc_corrected_volatile, gpu.ecc_uncorrected_volatile) == (7, 1)
    assert gpu.sram_corrected_volatile is None
    assert (gpu.ecc_corrected_aggregate, gpu.ecc_uncorrected_aggregate) == (None, None)
    assert (gpu.retired_pages_sbe, gpu.retired_pages_dbe, gpu.retired_pages_pending) == (
        2,
        0,
        False,
    )
    assert gpu.thresholds == TemperatureThresholds(
        tlimit=False, shutdown=90, slowdown=87, gpu_max=83, memory_max=85
    )
    assert (gpu.power_draw_w, gpu.power_limit_w, gpu.power_requested_limit_w) == (42.5, 300, 250)
    assert gpu.processes == ()


# Where each layout prints the limits: (capture, what to change, current, requested, default).
LIMIT_LAYOUTS = [
    pytest.param(H100_161, None, 700, 700, 700, id="535-text"),
    pytest.param(A100_MIG, None, 500, 500, 500, id="535-xml"),
    pytest.param(A10G, None, 300, 300, 300, id="515-xml-enforced"),
    pytest.param(RTX2080S_610, None, 250, 250, 250, id="610-nested"),
    # A GH200 module shares its power: the current limit sits below the requested one.
    pytest.param(
        H200_590_IDLE,
        (
            "Requested Power Limit                          : 700.00 W",
            "Requested Power Limit : 900.00 W",
        ),
        700,
        900,
        700,
        id="590-current-below-requested",
    ),
    pytest.param(
        RTX2080S_610,
        (
            "Requested Power Limit                      : 250.00 W",
            "Requested Power Limit : 280.00 W",
        ),
        250,
        280,
        250,
        id="610-nested-requested-apart",
    ),
    pytest.param(
        A10G,
        ("<power_limit>300.00 W</power_limit>", "<power_limit>250.00 W</power_limit>"),
        300,
        250,
        300,
        id="515-xml-requested-below-enforced",
    ),
    pytest.param(
        T4_595,
        (
            "<current_power_limit>70.00 W</current_power_limit>",
            "<current_power_limit>N/A</current_power_limit>",
        ),
        None,
        70,
        70,
        id="595-xml-current-na",
    ),
]


@pytest.mark.parametrize(("name", "change", "current", "requested", "default"), LIMIT_LAYOUTS)
def test_power_limits_in_every_layout(
    name: str,
    change: tuple[str, str] | None,
    current: float | None,
    requested: float | None,
    default: float | None,
) -> None:
    text = _read(name) if change is None else _replace(name, *change)
    gpu = parse_capture(text).gpus[0]
    assert (gpu.power_limit_w, gpu.power_requested_limit_w, gpu.power_default_limit_w) == (
        current,
        requested,
        default,
    )


@pytest.mark.parametrize(
    ("name", "printed", "draw", "instant"),
    [
        pytest.param(H100_161, "Power Draw", 67.74, None, id="535-average-only"),
        pytest.param(H200_TEXT, "Average Power Draw", 82.65, 82.81, id="580-both"),
        pytest.param(RTX2080S_610, "Instantaneous Power Draw", None, 38.89, id="610-instant-only"),
        pytest.param(T4_595, "instant_power_draw", None, 33.51, id="595-xml-instant-only"),
    ],
)
def test_the_average_draw_is_never_the_instantaneous_one(
    name: str, printed: str, draw: float | None, instant: float | None
) -> None:
    assert printed in _read(name)
    gpu = _load(name).gpus[0]
    assert (gpu.power_draw_w, gpu.power_instant_w) == (draw, instant)


@pytest.mark.parametrize(
    ("name", "old", "new", "mode"),
    [
        pytest.param(
            A10, "Compute Mode                          : Default", None, "Default", id="text"
        ),
        pytest.param(
            H100_161,
            "Compute Mode                          : Default",
            "Compute Mode : Prohibited",
            "Prohibited",
            id="text-prohibited",
        ),
        pytest.param(T4_595, "<compute_mode>Default</compute_mode>", None, "Default", id="xml"),
        pytest.param(
            A100_MIG,
            "<compute_mode>Default</compute_mode>",
            "<compute_mode>Exclusive_Process</compute_mode>",
            "Exclusive_Process",
            id="xml-exclusive-process",
        ),
        pytest.param(
            A10,
            "Compute Mode                          : Default",
            "Compute Mode : N/A",
            None,
            id="na",
        ),
    ],
)
def test_the_compute_mode_as_printed(
    name: str, old: str, new: str | None, mode: str | None
) -> None:
    text = _read(name) if new is None else _replace(name, old, new)
    assert old in _read(name)
    assert parse_capture(text).gpus[0].compute_mode == mode


def test_a_process_name_nvidia_smi_cannot_see_is_empty() -> None:
    name = "Name                          : /usr/bin/python"
    text = _replace(H100_183, name, name.replace("/usr/bin/python", "N/A"))
    assert parse_capture(text).gpus[2].processes[0] == CapturedProcess(
        pid=1002127, name="", type="C", used_mib=9212
    )
    xml = _replace(A10G, "/usr/lib/xorg/Xorg</process_name>", "N/A</process_name>")
    assert parse_capture(xml).gpus[0].processes[0].name == ""


def test_bracketed_and_other_unavailable_values_are_none() -> None:
    text = _replace(A10, ": 43.89 W", ": [Unknown Error]")
    text = text.replace("Fan Speed                             : 0 %", "Fan Speed : [N/A]")
    text = text.replace(
        "Max Power Limit                   : 150.00 W", "Max Power Limit : Not Supported"
    )
    gpu = parse_capture(text).gpus[0]
    assert (gpu.power_draw_w, gpu.fan_speed_pct, gpu.power_max_limit_w) == (None, None, None)
