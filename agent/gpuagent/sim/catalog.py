"""The GPU models a scenario can name, and how a name finds its model.

Values come from real `nvidia-smi -q` captures where one exists (tests/data/real-hosts:
H100 SXM, H200, B200, GB200, A100 SXM4 80GB, A10, A10G, RTX 4090, TITAN V; the GB300 from
a public capture named in its profile) and otherwise from NVIDIA's product
specifications; the rest (PCI subsystem ids and firmware versions of models without a
capture, the clocks a capped or slowed GPU settles at, busy draw and heat without a busy
capture, idle draw and temperatures without a capture) are plausible values, named as
such in each profile and in docs/simulation.md.
"""

from __future__ import annotations

from gpuagent.sim import codes
from gpuagent.sim.profiles import GpuProfile, MigProfile, on_buses

# The eight GPU bus numbers of an HGX H100 baseboard, in NVML (bus) order.
_HGX_H100 = on_buses(0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
# Nodes with more than eight GPUs: two GPUs behind each switch pair.
_HGX_H100_WIDE = on_buses(
    0x18, 0x1B, 0x2A, 0x2D, 0x3A, 0x3D, 0x5D, 0x60,
    0x9A, 0x9D, 0xAB, 0xAE, 0xBA, 0xBD, 0xDB, 0xDE,
)  # fmt: skip
# The b200-x8 capture's eight HGX B200 GPUs, in NVML (bus) order; no layout past eight.
_HGX_B200 = on_buses(0x8F, 0x90, 0x96, 0x97, 0xC4, 0xC5, 0xCB, 0xCC)
# The gb200-x4 capture's compute tray: two Grace-Blackwell superchips, four GPUs.
_GB200_TRAY = on_buses(0x29, 0x3F, 0x9C, 0xB2)
_DGX_A100 = on_buses(0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)
_DGX_A100_WIDE = on_buses(
    0x07, 0x08, 0x0F, 0x10, 0x47, 0x48, 0x4E, 0x4F,
    0x87, 0x88, 0x90, 0x91, 0xB7, 0xB8, 0xBD, 0xBE,
)  # fmt: skip
_DGX_1 = on_buses(0x06, 0x07, 0x0A, 0x0B, 0x85, 0x86, 0x89, 0x8A)
_DGX_2 = on_buses(
    0x34, 0x36, 0x39, 0x3B, 0x57, 0x59, 0x5C, 0x5E,
    0xB7, 0xB9, 0xBC, 0xBE, 0xE0, 0xE2, 0xE5, 0xE7,
)  # fmt: skip
# A 4U PCIe server: one GPU behind each switch port.
_PCIE_SERVER = on_buses(0x17, 0x31, 0x4B, 0x65, 0x98, 0xB1, 0xCA, 0xE3)
_PCIE_SERVER_WIDE = on_buses(
    0x17, 0x18, 0x31, 0x32, 0x4B, 0x4C, 0x65, 0x66,
    0x98, 0x99, 0xB1, 0xB2, 0xCA, 0xCB, 0xE3, 0xE4,
)  # fmt: skip
# The RTX 4090 capture's eight-GPU server.
_WORKSTATION = on_buses(0x01, 0x21, 0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1)
_WORKSTATION_WIDE = on_buses(
    0x01, 0x02, 0x21, 0x22, 0x41, 0x42, 0x61, 0x62,
    0x81, 0x82, 0xA1, 0xA2, 0xC1, 0xC2, 0xE1, 0xE2,
)  # fmt: skip
# A virtual machine with passed-through GPUs (the A10 capture's GPU is at 07:00.0).
_VM = on_buses(0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E)
_VM_WIDE = on_buses(*range(0x07, 0x17))
# An AWS instance: the GPUs are devices on bus 0 (the A10G capture's is at 00:1E.0).
_AWS = tuple((0x00, device) for device in range(0x17, 0x1F))
_AWS_WIDE = tuple((0x00, device) for device in range(0x0F, 0x1F))

_1_SLICE = codes.GPU_INSTANCE_PROFILE_1_SLICE
_1_SLICE_ME = codes.GPU_INSTANCE_PROFILE_1_SLICE_REV1
_1_SLICE_2X = codes.GPU_INSTANCE_PROFILE_1_SLICE_REV2
_2_SLICE = codes.GPU_INSTANCE_PROFILE_2_SLICE
_3_SLICE = codes.GPU_INSTANCE_PROFILE_3_SLICE
_4_SLICE = codes.GPU_INSTANCE_PROFILE_4_SLICE
_7_SLICE = codes.GPU_INSTANCE_PROFILE_7_SLICE

# NVIDIA's MIG user guide: the GPU-instance profiles of each MIG-capable model. Memory is
# what NVML reports per instance; profile ids are the same on every model.
_MIG_A100_80GB = (
    MigProfile("1g.10gb", _1_SLICE, 19, 1, 7, 9728),
    MigProfile("1g.10gb+me", _1_SLICE_ME, 20, 1, 1, 9728),
    MigProfile("1g.20gb", _1_SLICE_2X, 15, 1, 4, 19968),
    MigProfile("2g.20gb", _2_SLICE, 14, 2, 3, 19968),
    MigProfile("3g.40gb", _3_SLICE, 9, 3, 2, 40192),
    MigProfile("4g.40gb", _4_SLICE, 5, 4, 1, 40192),
    MigProfile("7g.80gb", _7_SLICE, 0, 7, 1, 81152),
)
_MIG_H100_80GB = (
    MigProfile("1g.10gb", _1_SLICE, 19, 1, 7, 9984),
    MigProfile("1g.10gb+me", _1_SLICE_ME, 20, 1, 1, 9984),
    MigProfile("1g.20gb", _1_SLICE_2X, 15, 1, 4, 20096),
    MigProfile("2g.20gb", _2_SLICE, 14, 2, 3, 20096),
    MigProfile("3g.40gb", _3_SLICE, 9, 3, 2, 40448),
    MigProfile("4g.40gb", _4_SLICE, 5, 4, 1, 40448),
    MigProfile("7g.80gb", _7_SLICE, 0, 7, 1, 81152),
)
_MIG_H200_141GB = (
    MigProfile("1g.18gb", _1_SLICE, 19, 1, 7, 18176),
    MigProfile("1g.18gb+me", _1_SLICE_ME, 20, 1, 1, 18176),
    MigProfile("1g.35gb", _1_SLICE_2X, 15, 1, 4, 35584),
    MigProfile("2g.35gb", _2_SLICE, 14, 2, 3, 35584),
    MigProfile("3g.71gb", _3_SLICE, 9, 3, 2, 71936),
    MigProfile("4g.71gb", _4_SLICE, 5, 4, 1, 71936),
    MigProfile("7g.141gb", _7_SLICE, 0, 7, 1, 143616),
)

# Blackwell: the profile names of NVIDIA's MIG tables (as the GPU Operator's mig-parted
# configuration lists them: 1g.23gb ... 7g.180gb on B200, 1g.23gb ... 7g.186gb on GB200,
# 1g.35gb ... 7g.278gb on GB300). No capture lists them (`nvidia-smi -q` does not), so the
# memory per instance here is derived, not captured: 1/8, 2/8, 4/8 and all of the memory
# left after the reserved part, rounded down to 256 MiB.
_MIG_B200_180GB = (
    MigProfile("1g.23gb", _1_SLICE, 19, 1, 7, 22784),
    MigProfile("1g.23gb+me", _1_SLICE_ME, 20, 1, 1, 22784),
    MigProfile("1g.45gb", _1_SLICE_2X, 15, 1, 4, 45568),
    MigProfile("2g.45gb", _2_SLICE, 14, 2, 3, 45568),
    MigProfile("3g.90gb", _3_SLICE, 9, 3, 2, 91136),
    MigProfile("4g.90gb", _4_SLICE, 5, 4, 1, 91136),
    MigProfile("7g.180gb", _7_SLICE, 0, 7, 1, 182528),
)
_MIG_GB200_186GB = (
    MigProfile("1g.23gb", _1_SLICE, 19, 1, 7, 23552),
    MigProfile("1g.23gb+me", _1_SLICE_ME, 20, 1, 1, 23552),
    MigProfile("1g.47gb", _1_SLICE_2X, 15, 1, 4, 47104),
    MigProfile("2g.47gb", _2_SLICE, 14, 2, 3, 47104),
    MigProfile("3g.93gb", _3_SLICE, 9, 3, 2, 94208),
    MigProfile("4g.93gb", _4_SLICE, 5, 4, 1, 94208),
    MigProfile("7g.186gb", _7_SLICE, 0, 7, 1, 188672),
)
_MIG_GB300_278GB = (
    MigProfile("1g.35gb", _1_SLICE, 19, 1, 7, 35328),
    MigProfile("1g.35gb+me", _1_SLICE_ME, 20, 1, 1, 35328),
    MigProfile("1g.70gb", _1_SLICE_2X, 15, 1, 4, 70656),
    MigProfile("2g.70gb", _2_SLICE, 14, 2, 3, 70656),
    MigProfile("3g.139gb", _3_SLICE, 9, 3, 2, 141568),
    MigProfile("4g.139gb", _4_SLICE, 5, 4, 1, 141568),
    MigProfile("7g.278gb", _7_SLICE, 0, 7, 1, 283136),
)

_HOPPER_NVSWITCH = 0x22A3
_AMPERE_NVSWITCH = 0x1AF1

H100_SXM = GpuProfile(
    # Captures: h100-sxm-x8.535.161.08 and .535.183.01 (idle, persistence on).
    key="h100-sxm",
    name="NVIDIA H100 80GB HBM3",
    architecture="Hopper",
    pci_device_id=0x233010DE,
    pci_subsystem_id=0x16C110DE,
    vbios_version="96.00.99.00.01",
    inforom_version="G520.0200.00.05",
    memory_total_mib=81559,
    memory_reserved_mib=551,
    power_default_limit_w=700,
    power_min_limit_w=200,
    power_max_limit_w=700,
    power_idle_w=69,
    power_full_w=499,
    temperature_idle_c=28,
    temperature_at_limit_c=72,
    memory_temperature_offset_c=9,
    # The captures' T.Limit scale: shutdown -8, slowdown -2, max operating 0, and the
    # margin plus the current temperature is 85 on every GPU.
    temperature_shutdown_c=93,
    temperature_slowdown_c=87,
    temperature_gpu_max_c=85,
    temperature_memory_max_c=95,
    tlimit_fields=True,
    sm_clock_idle_mhz=345,
    sm_clock_max_mhz=1980,
    sm_clock_power_capped_mhz=1665,
    sm_clock_slowdown_mhz=1095,
    sm_clock_brake_mhz=86,  # the 535.161.08 capture: HW Power Brake, SM at 86 MHz
    memory_clock_idle_mhz=2619,
    memory_clock_max_mhz=2619,
    video_clock_idle_mhz=765,
    video_clock_max_mhz=1545,
    applications_clock_mhz=1980,
    pcie_max_generation=5,
    pcie_max_width=16,
    pcie_idle_generation=None,
    nvlinks=18,
    buses=_HGX_H100,
    wide_buses=_HGX_H100_WIDE,
    nvswitch_device_id=_HOPPER_NVSWITCH,
    mig_profiles=_MIG_H100_80GB,
    mig_sms_per_slice=16,
    idle_pstate=0,
    busy_pstate=0,
    ecc=True,
    ecc_default=True,
    retired_pages=False,  # Hopper remaps rows only: Retired Pages N/A in the captures
    row_remapping=True,
    gsp_firmware=True,
    fabric=True,
    violation_counters=True,
)

H100_PCIE = GpuProfile(
    key="h100-pcie",
    name="NVIDIA H100 PCIe",
    architecture="Hopper",
    pci_device_id=0x233110DE,
    pci_subsystem_id=0x162610DE,
    vbios_version="96.00.30.00.01",
    inforom_version="G520.0210.00.01",
    memory_total_mib=81559,
    memory_reserved_mib=551,
    power_default_limit_w=350,
    power_min_limit_w=200,
    power_max_limit_w=350,
    power_idle_w=48,
    power_full_w=330,
    temperature_idle_c=32,
    temperature_at_limit_c=72,
    memory_temperature_offset_c=9,
    temperature_shutdown_c=93,
    temperature_slowdown_c=87,
    temperature_gpu_max_c=85,
    temperature_memory_max_c=95,
    tlimit_fields=True,
    sm_clock_idle_mhz=345,
    sm_clock_max_mhz=1755,
    sm_clock_power_capped_mhz=1500,
    sm_clock_slowdown_mhz=960,
    sm_clock_brake_mhz=345,
    memory_clock_idle_mhz=1593,
    memory_clock_max_mhz=1593,
    video_clock_idle_mhz=765,
    video_clock_max_mhz=1620,
    applications_clock_mhz=1755,
    pcie_max_generation=5,
    pcie_max_width=16,
    pcie_idle_generation=None,
    nvlinks=0,  # NVLink only through bridges, which a PCIe server usually has not
    buses=_PCIE_SERVER,
    wide_buses=_PCIE_SERVER_WIDE,
    mig_profiles=_MIG_H100_80GB,
    mig_sms_per_slice=14,
    idle_pstate=0,
    busy_pstate=0,
    ecc=True,
    ecc_default=True,
    retired_pages=False,
    row_remapping=True,
    gsp_firmware=True,
    fabric=False,
    violation_counters=True,
)

H200 = GpuProfile(
    # Captures: h200-x1.580.159.04 (.txt/.xml, a pass-through VM, idle) and the agent's
    # live run on that GPU (tests/data/live/h200-580.159.04: smi-idle.csv, smi-load.csv,
    # nvml-call-costs.txt); h200-x1-{idle,busy}.590.48.01 (another VM, idle and under
    # gpu-burn). Identity, memory and firmware are the live GPU's (the 590 host reports
    # subsystem 0x18BE10DE, VBIOS 96.00.A5.00.03, InfoROM G520.0280.02.02, 614 MiB reserved).
    key="h200",
    name="NVIDIA H200",
    architecture="Hopper",
    pci_device_id=0x233510DE,
    pci_subsystem_id=0x18BF10DE,
    vbios_version="96.00.A5.00.1A",
    inforom_version="G520.0282.02.02",
    memory_total_mib=143771,
    memory_reserved_mib=616,
    power_default_limit_w=700,
    power_min_limit_w=200,
    power_max_limit_w=700,
    # Idle: 82.5-82.7 W on the live GPU, 77.7 W on the 590 host (the drift covers both).
    power_idle_w=80,
    # Busy: a bf16 matmul sat at the 700 W cap, SW Power Cap active (smi-load.csv), so the
    # load asks for more than 700 W; gpu-burn, lighter, drew 627 W at 1980 MHz (590 busy).
    power_full_w=800,
    # Live: 35-36 °C idle, 56-58 °C at the cap; HBM 39 °C idle (3-4 °C above the GPU).
    temperature_idle_c=35,
    temperature_at_limit_c=58,
    memory_temperature_offset_c=3,
    # NVML's thresholds on the live GPU (nvml-call-costs.txt): SHUTDOWN 95, SLOWDOWN 89,
    # GPU_MAX 87, MEM_MAX 95; the captures' T.Limit scale agrees (-8 / -2 / 0, and margin +
    # temperature = 87).
    temperature_shutdown_c=95,
    temperature_slowdown_c=89,
    temperature_gpu_max_c=87,
    temperature_memory_max_c=95,
    tlimit_fields=True,
    sm_clock_idle_mhz=345,
    sm_clock_max_mhz=1980,
    sm_clock_power_capped_mhz=1515,  # live matmul at the cap: 1470-1530 MHz
    sm_clock_slowdown_mhz=1095,  # no capture: the H100's
    sm_clock_brake_mhz=86,  # no capture: the H100's
    memory_clock_idle_mhz=3201,
    memory_clock_max_mhz=3201,
    video_clock_idle_mhz=765,
    video_clock_max_mhz=1545,
    applications_clock_mhz=1980,
    pcie_max_generation=5,
    pcie_max_width=16,
    pcie_idle_generation=None,
    # An HGX H200 baseboard's; a one-GPU node (a pass-through VM, like the captures', where
    # NvLinkState answers NOT_SUPPORTED) has none: see scenario.default_nvlinks.
    nvlinks=18,
    buses=_HGX_H100,
    wide_buses=_HGX_H100_WIDE,
    nvswitch_device_id=_HOPPER_NVSWITCH,
    mig_profiles=_MIG_H200_141GB,
    mig_sms_per_slice=16,
    idle_pstate=0,
    busy_pstate=0,
    ecc=True,
    ecc_default=True,
    retired_pages=False,
    row_remapping=True,
    remap_banks=3072,  # Bank Remap Availability Histogram Max, every H200 capture
    gsp_firmware=True,
    fabric=True,
    violation_counters=True,
)

B200 = GpuProfile(
    # Capture: b200-x8.580.105.08 (XML; 8x HGX B200, idle, P0; persistence off on every
    # GPU, which is how that fleet runs them: a node key, `persistence = false`, not the
    # model's). Busy values are not captured: they follow the H200's live run (see below).
    key="b200",
    name="NVIDIA B200",
    architecture="Blackwell",
    pci_device_id=0x290110DE,
    pci_subsystem_id=0x199910DE,
    vbios_version="97.00.FA.00.09",
    inforom_version="G525.0220.00.03",
    memory_total_mib=183359,
    memory_reserved_mib=728,
    power_default_limit_w=1000,
    power_min_limit_w=200,
    power_max_limit_w=1000,
    power_idle_w=200,  # 193.9-206.0 W at P0, SM 120 MHz
    # Not captured: like the H200 under a dense matmul, the load asks for more than the
    # 1000 W limit and the driver caps it.
    power_full_w=1150,
    # The capture's GPUs idle in two groups, 37-39 °C (buses 8F, 96, C4, CB) and 51-53 °C
    # (90, 97, C5, CC): 44.9 °C on average, which the model takes. HBM reads 0-2 °C below.
    temperature_idle_c=43,
    temperature_at_limit_c=75,  # not captured
    memory_temperature_offset_c=-1,
    # T.Limit -5 / -3 / 0 with margin + temperature = 88 on every GPU.
    temperature_shutdown_c=93,
    temperature_slowdown_c=91,
    temperature_gpu_max_c=88,
    # The capture gives the memory's own max operating point only (T.Limit 0): the absolute
    # value is not captured; Hopper's 95 °C.
    temperature_memory_max_c=95,
    tlimit_fields=True,
    sm_clock_idle_mhz=120,
    sm_clock_max_mhz=1965,
    sm_clock_power_capped_mhz=1500,  # not captured: the H200's share of its maximum
    sm_clock_slowdown_mhz=1087,  # not captured: the H100's share of its maximum
    sm_clock_brake_mhz=120,  # the lowest supported clock
    memory_clock_idle_mhz=3996,
    memory_clock_max_mhz=3996,
    video_clock_idle_mhz=600,
    video_clock_max_mhz=1965,
    applications_clock_mhz=1965,
    pcie_max_generation=5,
    pcie_max_width=16,
    pcie_idle_generation=None,  # Gen5 x16 at idle
    nvlinks=18,  # NVLink 5 on the HGX B200 baseboard (1.8 TB/s per GPU)
    buses=_HGX_B200,
    # Not known: the HGX H100's NVSwitches were PCI functions of the host; no capture or
    # specification here gives the HGX B200's.
    nvswitch_device_id=None,
    # MIG mode reads Disabled (not N/A): the GPU has MIG.
    mig_profiles=_MIG_B200_180GB,
    mig_sms_per_slice=18,
    idle_pstate=0,
    busy_pstate=0,
    ecc=True,
    ecc_default=True,
    retired_pages=False,  # Retired Pages N/A
    row_remapping=True,
    remap_banks=3840,
    gsp_firmware=True,
    fabric=True,  # fabric Completed / Success, clique 0, zero cluster UUID
    # The capture prints a platform block (host 1, switch connected, an empty chassis
    # serial): the driver answers nvmlDeviceGetPlatformInfo on the HGX B200 too.
    platform_info=True,
    violation_counters=True,
)

GB200 = GpuProfile(
    # Capture: gb200-x4-arm64.580.173.02 (XML; a p6e-gb200 compute tray: four GPUs of two
    # Grace-Blackwell superchips, arm64, idle, P0, C2C mode enabled, fabric clique 2). The
    # module power lines (Grace and GPU together: 467 W of a 2500 W module limit, 500-2500
    # W) are not modelled: the simulator answers the GPU's own power only.
    key="gb200",
    name="NVIDIA GB200",
    architecture="Blackwell",
    pci_device_id=0x294110DE,
    pci_subsystem_id=0x204610DE,
    vbios_version="97.00.B9.00.69",
    inforom_version="G548.0201.00.06",
    memory_total_mib=189471,
    memory_reserved_mib=742,
    power_default_limit_w=1200,
    power_min_limit_w=200,
    power_max_limit_w=1200,
    power_idle_w=166,  # 156.5-172.0 W
    power_full_w=1380,  # not captured: asks for more than the limit, as the B200
    temperature_idle_c=26,  # 26-28 °C, liquid-cooled
    temperature_at_limit_c=65,  # not captured
    memory_temperature_offset_c=0,  # HBM -1..+1 °C from the GPU
    # T.Limit -5 / -2 / 0 with margin + temperature = 87 on every GPU.
    temperature_shutdown_c=92,
    temperature_slowdown_c=89,
    temperature_gpu_max_c=87,
    temperature_memory_max_c=95,  # not captured (T.Limit 0 only), as the B200
    tlimit_fields=True,
    sm_clock_idle_mhz=120,
    sm_clock_max_mhz=2062,
    sm_clock_power_capped_mhz=1575,  # not captured, as the B200
    sm_clock_slowdown_mhz=1140,  # not captured, as the B200
    sm_clock_brake_mhz=120,
    memory_clock_idle_mhz=3996,
    memory_clock_max_mhz=3996,
    video_clock_idle_mhz=600,
    video_clock_max_mhz=1890,
    applications_clock_mhz=2062,
    # The link's maximum is Gen5 (the Grace root port); the GPU itself could train to Gen6
    # (Device Max 6), which NVML's device-side call would say and the simulator does not.
    pcie_max_generation=5,
    pcie_max_width=16,
    pcie_idle_generation=None,
    nvlinks=18,  # NVLink 5 to the NVL72 switch trays
    buses=_GB200_TRAY,
    # The NVLink switches are in the rack's switch trays, not on the compute tray's PCI bus.
    nvswitch_device_id=None,
    mig_profiles=_MIG_GB200_186GB,
    mig_sms_per_slice=18,
    idle_pstate=0,
    busy_pstate=0,
    ecc=True,
    ecc_default=True,
    retired_pages=False,
    row_remapping=True,
    remap_banks=3968,
    gsp_firmware=True,
    fabric=True,
    fabric_cluster_uuid="00000001-0000-0000-0000-000000000001",
    fabric_clique_id=2,
    platform_info=True,
    c2c_links=1,
    # Module minus GPU average power in the capture: 301.2, 291.6, 303.3 and 280.4 W (a
    # module 452-467 W), under a 2500 W module limit (500-2500 W).
    module_power_extra_w=294.0,
    module_power_limit_w=2500.0,
    violation_counters=True,
)

GB300 = GpuProfile(
    # Not a capture in tests/data: NVIDIA/k8s-test-infra's real-hardware capture
    # tests/e2e/go/assertions/nvidiasmi/testdata/hardware/qx-gb300.xml at d2c1e25 (4x GB300
    # in one NVL72 compute tray, driver 580.173.02, idle, P0, C2C mode enabled), read but
    # not vendored. Identity, memory, limits, idle values, thresholds, clocks, PCIe and the
    # bank histogram are that capture's; busy values and the MIG table are not captured.
    # The module power lines there: 486-501 W of a 2900 W module limit (500-2900 W).
    key="gb300",
    name="NVIDIA GB300",
    architecture="Blackwell",
    pci_device_id=0x31C210DE,
    pci_subsystem_id=0x21F110DE,
    vbios_version="97.10.4A.00.1A",
    inforom_version="G548.0301.00.03",
    memory_total_mib=284208,
    memory_reserved_mib=947,
    power_default_limit_w=1400,
    power_min_limit_w=200,
    power_max_limit_w=1400,
    power_idle_w=178,  # 175.9-180.4 W
    power_full_w=1610,  # not captured, as the B200
    temperature_idle_c=37,  # 38-39 °C
    temperature_at_limit_c=65,  # not captured, as the GB200
    memory_temperature_offset_c=0,  # HBM 0..-1 °C from the GPU
    # T.Limit -5 / -2 / 0 with margin + temperature = 87 on every GPU.
    temperature_shutdown_c=92,
    temperature_slowdown_c=89,
    temperature_gpu_max_c=87,
    temperature_memory_max_c=95,  # not captured (T.Limit 0 only), as the B200
    tlimit_fields=True,
    sm_clock_idle_mhz=120,
    sm_clock_max_mhz=2070,
    sm_clock_power_capped_mhz=1582,  # not captured, as the B200
    sm_clock_slowdown_mhz=1140,  # not captured, as the B200
    sm_clock_brake_mhz=120,
    memory_clock_idle_mhz=3996,
    memory_clock_max_mhz=3996,
    video_clock_idle_mhz=600,
    video_clock_max_mhz=1912,
    applications_clock_mhz=2070,
    pcie_max_generation=6,  # Gen6 x16, current Gen6 at idle
    pcie_max_width=16,
    pcie_idle_generation=None,
    nvlinks=18,
    # The capture's GPUs sit at 06:00.0 in PCI domains 0008, 0009, 0018 and 0019; catalog
    # slots are in domain 0 (a replay keeps the captured domains), so the tray takes the
    # GB200 tray's buses.
    buses=_GB200_TRAY,
    nvswitch_device_id=None,  # switch trays, as the GB200
    mig_profiles=_MIG_GB300_278GB,
    mig_sms_per_slice=18,
    idle_pstate=0,
    busy_pstate=0,
    ecc=True,
    ecc_default=True,
    retired_pages=False,
    row_remapping=True,
    remap_banks=5952,
    gsp_firmware=True,
    fabric=True,
    # The capture's clique is 32766, a sentinel other racks report as well.
    fabric_cluster_uuid="00000001-0000-0000-0000-000000000001",
    fabric_clique_id=32766,
    platform_info=True,
    c2c_links=1,
    # The capture's module lines (above) less its GPUs' 175.9-180.4 W.
    module_power_extra_w=313.0,
    module_power_limit_w=2900.0,
    violation_counters=True,
)

A100_SXM4 = GpuProfile(
    # Capture: a100-sxm4-x4-mig.535.54.03 (XML; MIG on, persistence off).
    key="a100-sxm4",
    name="NVIDIA A100-SXM4-80GB",
    aliases=("A100-SXM4-80GB",),
    architecture="Ampere",
    pci_device_id=0x20B210DE,
    pci_subsystem_id=0x147F10DE,
    vbios_version="92.00.36.00.02",
    inforom_version="G506.0212.00.01",
    memory_total_mib=81920,
    memory_reserved_mib=869,
    power_default_limit_w=500,
    power_min_limit_w=100,
    power_max_limit_w=500,
    power_idle_w=62,
    power_full_w=400,
    temperature_idle_c=27,
    temperature_at_limit_c=70,
    memory_temperature_offset_c=17,
    temperature_shutdown_c=92,
    temperature_slowdown_c=89,
    temperature_gpu_max_c=85,
    temperature_memory_max_c=95,
    tlimit_fields=False,  # the capture (535) prints absolute thresholds, T.Limit N/A
    sm_clock_idle_mhz=210,
    sm_clock_max_mhz=1410,
    sm_clock_power_capped_mhz=1200,
    sm_clock_slowdown_mhz=780,
    sm_clock_brake_mhz=210,
    memory_clock_idle_mhz=1593,
    memory_clock_max_mhz=1593,
    video_clock_idle_mhz=795,
    video_clock_max_mhz=1290,
    applications_clock_mhz=1275,
    pcie_max_generation=4,
    pcie_max_width=16,
    pcie_idle_generation=None,
    nvlinks=12,
    buses=_DGX_A100,
    wide_buses=_DGX_A100_WIDE,
    nvswitch_device_id=_AMPERE_NVSWITCH,
    mig_profiles=_MIG_A100_80GB,
    mig_sms_per_slice=14,  # the capture's 1g.20gb instances have 14 SMs
    idle_pstate=0,
    busy_pstate=0,
    ecc=True,
    ecc_default=True,
    retired_pages=False,
    row_remapping=True,
    row_remapping_under_mig=False,
    gsp_firmware=True,
    fabric=False,  # nvmlDeviceGetGpuFabricInfo is Hopper and later
    violation_counters=True,
)

L40S = GpuProfile(
    key="l40s",
    remap_banks=192,
    name="NVIDIA L40S",
    architecture="Ada Lovelace",
    pci_device_id=0x26B910DE,
    pci_subsystem_id=0x185110DE,
    vbios_version="95.02.66.00.02",
    inforom_version="G133.0242.00.03",
    memory_total_mib=46068,
    memory_reserved_mib=563,
    power_default_limit_w=350,
    power_min_limit_w=100,
    power_max_limit_w=350,
    power_idle_w=33,
    power_full_w=375,
    temperature_idle_c=30,
    temperature_at_limit_c=74,
    memory_temperature_offset_c=None,  # GDDR6: no memory sensor
    # Ada reports T.Limit -7 / -2 / 0, as the RTX 4090 capture shows.
    temperature_shutdown_c=94,
    temperature_slowdown_c=89,
    temperature_gpu_max_c=87,
    temperature_memory_max_c=None,
    tlimit_fields=True,
    sm_clock_idle_mhz=210,
    sm_clock_max_mhz=2520,
    sm_clock_power_capped_mhz=2200,
    sm_clock_slowdown_mhz=1380,
    sm_clock_brake_mhz=210,
    memory_clock_idle_mhz=405,
    memory_clock_max_mhz=9001,
    video_clock_idle_mhz=1185,
    video_clock_max_mhz=1965,
    applications_clock_mhz=2520,
    pcie_max_generation=4,
    pcie_max_width=16,
    pcie_idle_generation=1,
    nvlinks=0,
    buses=_PCIE_SERVER,
    wide_buses=_PCIE_SERVER_WIDE,
    idle_pstate=8,
    busy_pstate=0,
    ecc=True,
    ecc_default=True,
    retired_pages=False,
    row_remapping=True,
    gsp_firmware=True,
    fabric=False,
    violation_counters=True,
)

A10 = GpuProfile(
    # Capture: a10.535.129.03 (a VM's passed-through GPU, idle, a row remap pending).
    key="a10",
    remap_banks=192,
    name="NVIDIA A10",
    architecture="Ampere",
    pci_device_id=0x223610DE,
    pci_subsystem_id=0x148210DE,
    vbios_version="94.02.5C.00.04",
    inforom_version="G133.0215.00.06",
    memory_total_mib=23028,
    memory_reserved_mib=512,
    power_default_limit_w=150,
    power_min_limit_w=100,
    power_max_limit_w=150,
    power_idle_w=42,
    power_full_w=165,
    temperature_idle_c=31,
    temperature_at_limit_c=75,
    memory_temperature_offset_c=None,
    temperature_shutdown_c=101,
    temperature_slowdown_c=98,
    temperature_gpu_max_c=91,
    temperature_memory_max_c=None,
    tlimit_fields=False,
    sm_clock_idle_mhz=225,
    sm_clock_max_mhz=1695,
    sm_clock_power_capped_mhz=1455,
    sm_clock_slowdown_mhz=930,
    sm_clock_brake_mhz=225,
    memory_clock_idle_mhz=405,
    memory_clock_max_mhz=6251,
    video_clock_idle_mhz=555,
    video_clock_max_mhz=1575,
    applications_clock_mhz=1695,
    pcie_max_generation=4,
    pcie_max_width=16,
    pcie_idle_generation=None,  # the capture's idle A10 (P8) keeps Gen4
    nvlinks=0,
    buses=_VM,
    wide_buses=_VM_WIDE,
    idle_pstate=8,
    busy_pstate=0,
    ecc=True,
    ecc_default=True,
    retired_pages=False,
    row_remapping=True,
    gsp_firmware=True,
    fabric=False,
    violation_counters=True,
    fan_idle_pct=0,  # passive: the board reports 0 %
    fan_busy_pct=0,
)

A10G = GpuProfile(
    # Capture: a10g (XML, driver 515.105.01, an AWS instance). The capture's PCI ids are
    # zeroed by the hypervisor; these are the A10G's own.
    key="a10g",
    remap_banks=192,
    name="NVIDIA A10G",
    architecture="Ampere",
    pci_device_id=0x223710DE,
    pci_subsystem_id=0x152F10DE,
    vbios_version="94.02.75.00.01",
    inforom_version="G133.0210.00.04",
    memory_total_mib=23028,
    memory_reserved_mib=435,
    power_default_limit_w=300,
    power_min_limit_w=100,
    power_max_limit_w=300,
    power_idle_w=25,
    power_full_w=290,
    temperature_idle_c=20,
    temperature_at_limit_c=70,
    memory_temperature_offset_c=None,
    temperature_shutdown_c=98,
    temperature_slowdown_c=95,
    temperature_gpu_max_c=88,
    temperature_memory_max_c=None,
    tlimit_fields=False,
    sm_clock_idle_mhz=210,
    sm_clock_max_mhz=1710,
    sm_clock_power_capped_mhz=1500,
    sm_clock_slowdown_mhz=945,
    sm_clock_brake_mhz=210,
    memory_clock_idle_mhz=405,
    memory_clock_max_mhz=6251,
    video_clock_idle_mhz=555,
    video_clock_max_mhz=1500,
    applications_clock_mhz=1710,
    pcie_max_generation=4,
    pcie_max_width=16,
    pcie_idle_generation=1,
    nvlinks=0,
    buses=_AWS,
    wide_buses=_AWS_WIDE,
    idle_pstate=8,
    busy_pstate=0,
    ecc=True,
    ecc_default=True,
    retired_pages=False,
    row_remapping=True,
    gsp_firmware=True,
    fabric=False,
    violation_counters=True,
    fan_idle_pct=0,
    fan_busy_pct=0,
)

RTX_4090 = GpuProfile(
    # Captures: rtx4090-x8.535.154.05 (idle) and rtx4090-x8-busy (four GPUs busy, each
    # at P2, power-capped at ~446 W, SM 2520-2640 MHz, 72-76 °C, fans 86-98 %).
    key="rtx-4090",
    remap_banks=192,
    name="NVIDIA GeForce RTX 4090",
    brand=codes.BRAND_GEFORCE,
    architecture="Ada Lovelace",
    pci_device_id=0x268410DE,
    pci_subsystem_id=0x16F310DE,
    vbios_version="95.02.3C.00.02",
    inforom_version="G002.0000.00.03",
    memory_total_mib=24564,
    memory_reserved_mib=346,
    power_default_limit_w=450,
    power_min_limit_w=150,
    power_max_limit_w=450,
    power_idle_w=19,
    power_full_w=520,
    temperature_idle_c=29,
    temperature_at_limit_c=74,
    memory_temperature_offset_c=None,
    # T.Limit -7 / -2 / 0 with margin + current temperature = 83 in every capture.
    temperature_shutdown_c=90,
    temperature_slowdown_c=85,
    temperature_gpu_max_c=83,
    temperature_memory_max_c=None,
    tlimit_fields=True,
    sm_clock_idle_mhz=210,
    sm_clock_max_mhz=3105,
    sm_clock_power_capped_mhz=2640,
    sm_clock_slowdown_mhz=1710,
    sm_clock_brake_mhz=210,
    memory_clock_idle_mhz=405,
    memory_clock_max_mhz=10501,
    video_clock_idle_mhz=1185,
    video_clock_max_mhz=2415,
    applications_clock_mhz=None,
    pcie_max_generation=4,
    pcie_max_width=16,
    pcie_idle_generation=1,
    nvlinks=0,
    buses=_WORKSTATION,
    wide_buses=_WORKSTATION_WIDE,
    idle_pstate=8,
    busy_pstate=2,  # GeForce drivers run CUDA work at P2
    # ECC mode is there (the captures show it Disabled) but off: its counters are N/A.
    ecc=True,
    ecc_default=False,
    retired_pages=False,
    row_remapping=True,  # the captures show remapped rows (0) and a bank histogram
    gsp_firmware=False,
    fabric=False,
    violation_counters=False,
    serial_number=False,
    fan_idle_pct=33,
    fan_busy_pct=90,
)

TITAN_V = GpuProfile(
    # Capture: titan-v.560.35.03 (idle desktop: Xorg and gnome-shell on it).
    key="titan-v",
    name="NVIDIA TITAN V",
    brand=codes.BRAND_TITAN,
    aliases=("TITAN V",),
    architecture="Volta",
    pci_device_id=0x1D8110DE,
    pci_subsystem_id=0x121810DE,
    vbios_version="88.00.36.00.01",
    inforom_version="G001.0000.01.04",
    memory_total_mib=12288,
    memory_reserved_mib=239,
    power_default_limit_w=250,
    power_min_limit_w=100,
    power_max_limit_w=300,
    power_idle_w=29,
    power_full_w=270,
    temperature_idle_c=41,
    temperature_at_limit_c=83,
    memory_temperature_offset_c=-3,
    temperature_shutdown_c=100,
    temperature_slowdown_c=97,
    temperature_gpu_max_c=91,
    temperature_memory_max_c=95,
    tlimit_fields=False,
    sm_clock_idle_mhz=135,
    sm_clock_max_mhz=1912,
    sm_clock_power_capped_mhz=1500,
    sm_clock_slowdown_mhz=1050,
    sm_clock_brake_mhz=135,
    memory_clock_idle_mhz=850,
    memory_clock_max_mhz=850,
    video_clock_idle_mhz=555,
    video_clock_max_mhz=1717,
    applications_clock_mhz=1200,
    pcie_max_generation=3,
    pcie_max_width=16,
    pcie_idle_generation=1,
    nvlinks=0,
    buses=_WORKSTATION,
    wide_buses=_WORKSTATION_WIDE,
    idle_pstate=8,
    busy_pstate=2,
    ecc=False,  # ECC mode N/A in the capture, and every ECC count with it
    ecc_default=False,
    retired_pages=False,
    row_remapping=False,
    gsp_firmware=False,
    fabric=False,
    violation_counters=True,
    fan_idle_pct=30,
    fan_busy_pct=80,
)

V100_SXM2 = GpuProfile(
    # The model that retires pages: Volta with ECC, before row remapping.
    key="v100-sxm2",
    name="Tesla V100-SXM2-32GB",
    architecture="Volta",
    pci_device_id=0x1DB510DE,
    pci_subsystem_id=0x124910DE,
    vbios_version="88.00.80.00.01",
    inforom_version="G503.0203.00.05",
    memory_total_mib=32768,
    memory_reserved_mib=254,
    power_default_limit_w=300,
    power_min_limit_w=150,
    power_max_limit_w=300,
    power_idle_w=42,
    power_full_w=290,
    temperature_idle_c=34,
    temperature_at_limit_c=70,
    memory_temperature_offset_c=-2,
    temperature_shutdown_c=90,
    temperature_slowdown_c=87,
    temperature_gpu_max_c=83,
    temperature_memory_max_c=85,
    tlimit_fields=False,
    sm_clock_idle_mhz=135,
    sm_clock_max_mhz=1530,
    sm_clock_power_capped_mhz=1380,
    sm_clock_slowdown_mhz=840,
    sm_clock_brake_mhz=135,
    memory_clock_idle_mhz=877,
    memory_clock_max_mhz=877,
    video_clock_idle_mhz=555,
    video_clock_max_mhz=1372,
    applications_clock_mhz=1290,
    pcie_max_generation=3,
    pcie_max_width=16,
    pcie_idle_generation=None,
    nvlinks=6,
    buses=_DGX_1,
    wide_buses=_DGX_2,
    idle_pstate=0,
    busy_pstate=0,
    ecc=True,
    ecc_default=True,
    retired_pages=True,
    row_remapping=False,
    gsp_firmware=False,
    fabric=False,
    violation_counters=True,
)

PROFILES: tuple[GpuProfile, ...] = (
    H100_SXM,
    H100_PCIE,
    H200,
    B200,
    GB200,
    GB300,
    A100_SXM4,
    L40S,
    A10,
    A10G,
    RTX_4090,
    TITAN_V,
    V100_SXM2,
)
DEFAULT = H100_SXM
KEYS = tuple(p.key for p in PROFILES)


def find_profile(model: str) -> tuple[GpuProfile, str] | None:
    """The profile ``model`` names (its key, product name or an alias, in any case) and
    the name NVML reports for it: the product name, or the alias given."""
    wanted = model.strip().casefold()
    for profile in PROFILES:
        if wanted == profile.key.casefold():
            return profile, profile.name
        for name in (profile.name, *profile.aliases):
            if wanted == name.casefold():
                return profile, name
    return None
