"""Read the text `nvidia-smi -q` prints into a Capture.

The text is an indented tree, four spaces a level: `Key : Value` entries and section
headers (a key alone, "    Clocks Event Reasons"; or a key whose value stands for the whole
section, "    Remapped Rows : N/A"). An entry may also have both a value and children
("HW Slowdown : Active" holds "HW Thermal Slowdown"). One generic pass builds that tree,
each node remembering its line; a second maps it into the model. Unknown keys are
ignored: every driver release adds some. Both wordings drivers have used are read where
they differ ("Clocks Event Reasons" since 535, "Clocks Throttle Reasons" before; SRAM/DRAM
ECC counts since Ampere, "Single Bit"/"Double Bit" totals before; absolute temperature
thresholds, or the T.Limit scale on Hopper and Ada with 535+).

What a capture must have, or it is refused with a CaptureError naming the line:

* its first non-blank line is the ``==============NVSMI LOG==============`` banner;
* a "Driver Version" in the header, before the GPU blocks;
* at least one GPU block, each starting with a line "GPU 00000000:19:00.0";
* in every GPU block: a "Product Name"; a "PCI / Bus Id" that matches the block's line;
  and a "Processes" entry ("Processes : None" when no process runs). nvidia-smi prints
  Processes at the end of every block, so a block without it was cut short;
* wherever a number, a flag or a P-state is expected, one (or N/A).

Fewer GPU blocks than "Attached GPUs" says is accepted (captures trimmed to one GPU). Any
other field a block lacks, or shows as N/A, becomes None.
"""

from __future__ import annotations

import re

from gpuagent.smi.model import (
    Capture,
    CapturedGpu,
    CapturedMigDevice,
    CapturedProcess,
    CaptureError,
    ClockEventReasons,
    TemperatureThresholds,
)
from gpuagent.smi.tree import (
    EccCounts,
    Node,
    at,
    cuda_version,
    driver_version,
    entries,
    fabric_health,
    flag,
    hexadecimal,
    histogram,
    integer,
    number,
    pick,
    power_limits,
    printed,
    pstate,
    required,
    string,
    summed,
    uuid_text,
)

NOT_A_CAPTURE = (
    'not an nvidia-smi -q capture (expected "==============NVSMI LOG==============" '
    "or an <nvidia_smi_log> XML document)"
)
_GPU_BLOCK = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
_PROCESS_IDS = ("gpu instance id", "compute instance id")


def parse_text(text: str) -> Capture:
    lines = text.split("\n")
    root = _tree(lines, _after_banner(lines))
    blocks = [node for node in root.children if _GPU_BLOCK.fullmatch(node.key)]
    if not blocks:
        last = max(1, len(lines) - (lines[-1] == ""))
        raise CaptureError('no GPU block (a line like "GPU 00000000:19:00.0") in the capture', last)
    driver = driver_version(
        root,
        ("KMD Version", "Driver Version"),
        CaptureError("no Driver Version before the first GPU block", blocks[0].line),
        "the Driver Version holds no version number",
    )
    gpus = tuple(_gpu(block) for block in blocks)
    return Capture(
        format="text",
        driver_version=driver,
        cuda_version=cuda_version(root, ("CUDA UMD Version", "CUDA Version")),
        timestamp=string(root.get("Timestamp")),
        attached_gpus=integer(root.get("Attached GPUs")),
        gpus=gpus,
        notes=tuple(root.notes),
    )


def _after_banner(lines: list[str]) -> int:
    """The index of the line after the banner; the banner must come first."""
    for index, line in enumerate(lines):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("=") and stripped.strip("=").strip() == "NVSMI LOG":
            return index + 1
        raise CaptureError(NOT_A_CAPTURE, index + 1)
    raise CaptureError(f"the file is empty: {NOT_A_CAPTURE}", 1)


def _tree(lines: list[str], start: int) -> Node:
    """Every non-blank line from ``start`` on, as a node under the last line indented less."""
    root = Node("", None, 0, None)
    stack: list[tuple[int, Node]] = [(-1, root)]
    for index in range(start, len(lines)):
        line = lines[index].rstrip()
        body = line.lstrip(" ")
        if not body:
            continue
        indent = len(line) - len(body)
        # Keys are padded to a column, so the separator always has a space before it;
        # values keep their own colons ("Bus Id : 00000000:19:00.0").
        separator = body.find(" : ")
        value: str | None
        if separator >= 0:
            key, value = body[:separator].rstrip(), body[separator + 3 :].strip()
        elif body.endswith(" :"):
            key, value = body[:-2].rstrip(), ""
        else:
            key, value = body, None
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        node = Node(key, value, index + 1, parent)
        parent.add(node)
        stack.append((indent, node))
    return root


def _gpu(block: Node) -> CapturedGpu:
    name = block.key
    processes = block.get("Processes")
    if processes is None or (processes.value is None and not processes.children):
        raise CaptureError(
            f"the {name} block (line {block.line}) ends without its Processes entry: "
            "the capture is cut short",
            block.last_line(),
        )
    product = required(block.get("Product Name"), block, f"{name} has no Product Name")
    bus = block.get("PCI", "Bus Id")
    bus_id = required(bus, block, f"{name} has no PCI / Bus Id")
    if bus is not None and bus_id.lower() != name.removeprefix("GPU ").lower():
        raise CaptureError(f"PCI / Bus Id {bus_id} is not the block's ({name})", bus.line)
    pci = block.get("PCI")
    generation = at(pci, "GPU Link Info", "PCIe Generation")
    width = at(pci, "GPU Link Info", "Link Width")
    memory = block.get("FB Memory Usage")
    utilization = block.get("Utilization")
    temperature = block.get("Temperature")
    power = block.first("GPU Power Readings", "Power Readings")
    # "Current Power Limit" since 535, nested under "GPU Ceiling Power Limit" by R610.
    limits = power_limits(
        power,
        (
            "GPU Ceiling Power Limit",
            "Current Power Limit",
            "Requested Power Limit",
            "Default Power Limit",
            "Enforced Power Limit",
            "Power Limit",
        ),
    )
    module = block.first("Module Power Readings")
    clocks = block.get("Clocks")
    applications = block.get("Applications Clocks")
    defaults = block.get("Default Applications Clocks")
    maxima = block.get("Max Clocks")
    retired = block.get("Retired Pages")
    platform = block.get("Platform Info")
    remapped = block.get("Remapped Rows")
    volatile = _ecc(block.get("ECC Errors", "Volatile"))
    aggregate = _ecc(block.get("ECC Errors", "Aggregate"))
    return CapturedGpu(
        bus_id=bus_id,
        product_name=product,
        line=block.line,
        product_brand=string(block.get("Product Brand")),
        architecture=string(block.get("Product Architecture")),
        uuid=string(block.get("GPU UUID")),
        serial=string(block.get("Serial Number")),
        minor_number=integer(block.get("Minor Number")),
        module_id=integer(block.get("Module ID")),
        vbios_version=string(block.get("VBIOS Version")),
        inforom_image_version=string(block.get("Inforom Version", "Image Version")),
        gsp_firmware_version=string(block.get("GSP Firmware Version")),
        pci_device_id=hexadecimal(at(pci, "Device Id")),
        pci_subsystem_id=hexadecimal(at(pci, "Sub System Id")),
        persistence_mode=flag(block.get("Persistence Mode")),
        virtualization_mode=string(block.get("GPU Virtualization Mode", "Virtualization Mode")),
        compute_mode=string(block.get("Compute Mode")),
        mig_current=flag(block.get("MIG Mode", "Current")),
        mig_pending=flag(block.get("MIG Mode", "Pending")),
        mig_devices=_mig_devices(block),
        ecc_current=flag(block.get("ECC Mode", "Current")),
        ecc_pending=flag(block.get("ECC Mode", "Pending")),
        ecc_corrected_volatile=volatile.corrected,
        ecc_uncorrected_volatile=volatile.uncorrected,
        ecc_corrected_aggregate=aggregate.corrected,
        ecc_uncorrected_aggregate=aggregate.uncorrected,
        sram_corrected_volatile=volatile.sram_corrected,
        sram_uncorrected_volatile=volatile.sram_uncorrected,
        sram_corrected_aggregate=aggregate.sram_corrected,
        sram_uncorrected_aggregate=aggregate.sram_uncorrected,
        sram_threshold_exceeded=aggregate.sram_threshold_exceeded,
        retired_pages_sbe=integer(at(retired, "Single Bit ECC")),
        retired_pages_dbe=integer(at(retired, "Double Bit ECC")),
        retired_pages_pending=flag(
            pick(retired, "Pending Page Blacklist", "Pending Page Retirement", "Pending")
        ),
        remapped_rows_correctable=integer(at(remapped, "Correctable Error")),
        remapped_rows_uncorrectable=integer(at(remapped, "Uncorrectable Error")),
        remapped_rows_pending=flag(at(remapped, "Pending")),
        remapped_rows_failure=flag(at(remapped, "Remapping Failure Occurred")),
        remap_histogram=histogram(
            at(remapped, "Bank Remap Availability Histogram"),
            ("Max", "High", "Partial", "Low", "None"),
        ),
        reset_required=flag(block.get("GPU Reset Status", "Reset Required")),
        recovery_action=string(block.get("GPU Recovery Action")),
        channel_repair_pending=flag(block.get("ECC Errors", "Channel Repair Pending")),
        tpc_repair_pending=flag(block.get("ECC Errors", "TPC Repair Pending")),
        unrepairable_memory=flag(block.get("ECC Errors", "Unrepairable Memory")),
        drain_and_reset_recommended=flag(
            block.get("GPU Reset Status", "Drain and Reset Recommended")
        ),
        pcie_generation_max=integer(at(generation, "Max")),
        pcie_generation_current=integer(at(generation, "Current")),
        pcie_generation_device_max=integer(at(generation, "Device Max")),
        pcie_generation_host_max=integer(at(generation, "Host Max")),
        pcie_width_max=integer(at(width, "Max"), "x"),
        pcie_width_current=integer(at(width, "Current"), "x"),
        pcie_replays=integer(at(pci, "Replays Since Reset")),
        pcie_replay_rollovers=integer(at(pci, "Replay Number Rollovers")),
        pcie_tx_kbps=integer(at(pci, "Tx Throughput"), "KB/s"),
        pcie_rx_kbps=integer(at(pci, "Rx Throughput"), "KB/s"),
        fan_speed_pct=number(block.get("Fan Speed"), "%"),
        performance_state=pstate(block.get("Performance State")),
        clock_event_reasons=_clock_event_reasons(block),
        fb_total_mib=number(at(memory, "Total"), "MiB"),
        fb_reserved_mib=number(at(memory, "Reserved"), "MiB"),
        fb_used_mib=number(at(memory, "Used"), "MiB"),
        fb_free_mib=number(at(memory, "Free"), "MiB"),
        utilization_gpu_pct=number(at(utilization, "Gpu"), "%"),
        utilization_memory_pct=number(at(utilization, "Memory"), "%"),
        utilization_encoder_pct=number(at(utilization, "Encoder"), "%"),
        utilization_decoder_pct=number(at(utilization, "Decoder"), "%"),
        temperature_c=number(at(temperature, "GPU Current Temp"), "C"),
        memory_temperature_c=number(at(temperature, "Memory Current Temp"), "C"),
        thresholds=_thresholds(temperature),
        # 550+ splits the draw into the 1 s average and an instantaneous reading.
        power_draw_w=number(pick(power, "Power Draw", "Average Power Draw"), "W"),
        power_instant_w=number(at(power, "Instantaneous Power Draw"), "W"),
        power_limit_w=number(limits.current, "W"),
        power_requested_limit_w=number(limits.requested, "W"),
        power_default_limit_w=number(limits.default, "W"),
        power_min_limit_w=number(at(power, "Min Power Limit"), "W"),
        power_max_limit_w=number(at(power, "Max Power Limit"), "W"),
        module_power_w=number(at(module, "Average Power Draw"), "W"),
        module_power_limit_w=number(at(module, "Current Power Limit"), "W"),
        clock_graphics_mhz=integer(at(clocks, "Graphics"), "MHz"),
        clock_sm_mhz=integer(at(clocks, "SM"), "MHz"),
        clock_memory_mhz=integer(at(clocks, "Memory"), "MHz"),
        clock_video_mhz=integer(at(clocks, "Video"), "MHz"),
        applications_clock_graphics_mhz=integer(at(applications, "Graphics"), "MHz"),
        applications_clock_memory_mhz=integer(at(applications, "Memory"), "MHz"),
        default_applications_clock_graphics_mhz=integer(at(defaults, "Graphics"), "MHz"),
        default_applications_clock_memory_mhz=integer(at(defaults, "Memory"), "MHz"),
        max_clock_graphics_mhz=integer(at(maxima, "Graphics"), "MHz"),
        max_clock_sm_mhz=integer(at(maxima, "SM"), "MHz"),
        max_clock_memory_mhz=integer(at(maxima, "Memory"), "MHz"),
        max_clock_video_mhz=integer(at(maxima, "Video"), "MHz"),
        fabric_state=string(block.get("Fabric", "State")),
        fabric_status=string(block.get("Fabric", "Status")),
        fabric_health=fabric_health(
            block.get("Fabric", "Health"),
            (
                "Bandwidth",
                "Route Recovery in progress",
                "Route Unhealthy",
                "Access Timeout Recovery",
                "Incorrect Configuration",
            ),
        ),
        fabric_clique_id=integer(block.get("Fabric", "CliqueId")),
        fabric_cluster_uuid=uuid_text(block.get("Fabric", "ClusterUUID")),
        chassis_serial=printed(at(platform, "Chassis Serial Number")),
        slot_number=integer(at(platform, "Slot Number")),
        tray_index=integer(at(platform, "Tray Index")),
        host_id=integer(at(platform, "Host ID")),
        peer_type=string(at(platform, "Peer Type")),
        platform_module_id=integer(at(platform, "Module Id")),
        processes=_processes(processes),
    )


def _ecc(section: Node | None) -> EccCounts:
    if section is None:
        return EccCounts()
    if section.first("DRAM Correctable", "DRAM Uncorrectable", "SRAM Correctable") is None:
        # Before the SRAM/DRAM split: per-unit counts under "Single Bit" and "Double Bit",
        # each with a "Total".
        return EccCounts(
            corrected=integer(section.get("Single Bit", "Total")),
            uncorrected=integer(section.get("Double Bit", "Total")),
        )
    return EccCounts(
        corrected=integer(section.get("DRAM Correctable")),
        uncorrected=integer(section.get("DRAM Uncorrectable")),
        sram_corrected=integer(section.get("SRAM Correctable")),
        sram_uncorrected=summed(
            integer(section.get("SRAM Uncorrectable")),
            integer(section.get("SRAM Uncorrectable Parity")),
            integer(section.get("SRAM Uncorrectable SEC-DED")),
        ),
        sram_threshold_exceeded=flag(section.get("SRAM Threshold Exceeded")),
    )


def _thresholds(section: Node | None) -> TemperatureThresholds:
    if section is None:
        return TemperatureThresholds()

    def celsius(key: str) -> float | None:
        return number(section.get(key), "C")

    # The T.Limit scale when any T.Limit threshold has a value. The margin's key does not
    # decide: GPUs on the absolute scale print it too, as N/A (the A10 on 535).
    tlimit = any(
        celsius(f"GPU {name} T.Limit Temp") is not None
        for name in ("Shutdown", "Slowdown", "Max Operating")
    )
    scale = " T.Limit Temp" if tlimit else " Temp"
    return TemperatureThresholds(
        tlimit=tlimit,
        shutdown=celsius("GPU Shutdown" + scale),
        slowdown=celsius("GPU Slowdown" + scale),
        gpu_max=celsius("GPU Max Operating" + scale),
        memory_max=celsius("Memory Max Operating" + scale),
        margin=celsius("GPU T.Limit Temp"),
        target=celsius("GPU Target Temperature"),
    )


def _clock_event_reasons(block: Node) -> ClockEventReasons | None:
    section = block.first("Clocks Event Reasons", "Clocks Throttle Reasons")
    if section is None or not section.children:
        return None
    slowdown = section.get("HW Slowdown")

    def reason(key: str) -> bool | None:
        # The two HW slowdown causes are printed under "HW Slowdown"; read them at the
        # section's level too, should a driver flatten the block.
        return flag(section.get(key) or at(slowdown, key))

    return ClockEventReasons(
        idle=reason("Idle"),
        applications_clocks=reason("Applications Clocks Setting"),
        sw_power_cap=reason("SW Power Cap"),
        hw_slowdown=reason("HW Slowdown"),
        hw_thermal_slowdown=reason("HW Thermal Slowdown"),
        hw_power_brake_slowdown=reason("HW Power Brake Slowdown"),
        sync_boost=reason("Sync Boost"),
        sw_thermal_slowdown=reason("SW Thermal Slowdown"),
        display_clocks=reason("Display Clock Setting"),
    )


def _processes(section: Node) -> tuple[CapturedProcess, ...]:
    """The Processes entries: a "Process ID" with its Type, Name and Used GPU Memory
    under it, preceded by the GPU and compute instance ids (N/A without MIG)."""
    found: list[tuple[Node, dict[str, Node]]] = []
    instance_ids: dict[str, Node] = {}
    for child in section.children:
        key = child.key.lower()
        if key in _PROCESS_IDS:
            instance_ids[key] = child
        elif key == "process id":
            fields = dict(instance_ids)
            fields.update((entry.key.lower(), entry) for entry in child.children)
            found.append((child, fields))
            instance_ids = {}
        elif found:  # a driver printing Type, Name... beside the Process ID
            found[-1][1].setdefault(key, child)
    if instance_ids:
        dangling = min(node.line for node in instance_ids.values())
        raise CaptureError(
            f"{section.label()}: the entry at line {dangling} has no Process ID: "
            "the capture is cut short",
            section.last_line(),
        )
    return tuple(_process(node, fields) for node, fields in found)


def _process(node: Node, fields: dict[str, Node]) -> CapturedProcess:
    pid = integer(node)
    if pid is None:
        raise CaptureError(f"{node.label()}: a process without a Process ID", node.line)
    if "name" not in fields:
        raise CaptureError(
            f"{node.label()} {pid} has no Name: the capture is cut short", node.last_line()
        )
    return CapturedProcess(
        pid=pid,
        # N/A where nvidia-smi cannot see the process (another PID namespace).
        name=string(fields["name"]) or "",
        type=string(fields.get("type")) or "C",
        used_mib=number(fields.get("used gpu memory"), "MiB"),
        gpu_instance_id=integer(fields.get("gpu instance id")),
        compute_instance_id=integer(fields.get("compute instance id")),
    )


def _mig_devices(block: Node) -> tuple[CapturedMigDevice, ...]:
    """The "MIG Device" blocks, directly in the GPU block or under a "MIG Devices" one."""
    nodes = entries(block, "MIG Device") + entries(block.get("MIG Devices"), "MIG Device")
    return tuple(_mig_device(node) for node in nodes)


def _mig_device(node: Node) -> CapturedMigDevice:
    index = integer(node.get("Index"))
    gpu_instance = integer(node.get("GPU Instance ID"))
    compute_instance = integer(node.get("Compute Instance ID"))
    if index is None or gpu_instance is None or compute_instance is None:
        raise CaptureError(
            f"{node.label()} lacks its Index, GPU Instance ID or Compute Instance ID", node.line
        )
    return CapturedMigDevice(
        index=index,
        gpu_instance_id=gpu_instance,
        compute_instance_id=compute_instance,
        multiprocessor_count=integer(
            node.get("Device Attributes", "Shared", "Multiprocessor count")
        ),
        memory_total_mib=number(node.get("FB Memory Usage", "Total"), "MiB"),
        memory_used_mib=number(node.get("FB Memory Usage", "Used"), "MiB"),
    )
