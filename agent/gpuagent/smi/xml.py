"""Read the XML `nvidia-smi -q -x` prints into a Capture.

The standard library's ElementTree parses it, fed line by line so that every element
remembers the line it starts on (for the messages), into the same tree the text parser
builds. Where DTD versions name a field differently (v11 of the 515 drivers, v12 of 535),
the mapping reads both: ``clocks_throttle_reasons`` and ``clocks_event_reasons``,
``power_readings`` and ``gpu_power_readings``, the ``*_tlimit_*`` thresholds,
``pending_blacklist`` and ``pending_retirement``.

Entity declarations are refused before parsing: nvidia-smi never writes one, and an
entity is how a document expands without bound or pulls in a local file. The DOCTYPE line
nvidia-smi writes (``<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">``) is
accepted; its DTD is never fetched.

What a capture must have, or it is refused with a CaptureError naming the line:

* well-formed XML (a capture cut off mid-element is not) whose root is ``<nvidia_smi_log>``;
* a ``<driver_version>``;
* at least one ``<gpu>``, each with a ``<product_name>`` and a ``<pci>/<pci_bus_id>``;
* wherever a number, a flag or a P-state is expected, one (or N/A).

Fewer ``<gpu>`` elements than ``<attached_gpus>`` says is accepted (captures trimmed to one
GPU). Any other element a ``<gpu>`` lacks, or shows as N/A, becomes None.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from xml.parsers import expat

from gpuagent.smi.model import (
    Capture,
    CapturedGpu,
    CapturedMigDevice,
    CapturedProcess,
    CaptureError,
    ClockEventReasons,
    TemperatureThresholds,
)
from gpuagent.smi.text import NOT_A_CAPTURE
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

_ENTITY = re.compile(r"<!ENTITY", re.IGNORECASE)
_ROOT = "nvidia_smi_log"
# Expat's errors for a document that stops before its elements close.
_CUT_SHORT = frozenset(
    expat.errors.codes[message]
    for message in (
        expat.errors.XML_ERROR_NO_ELEMENTS,
        expat.errors.XML_ERROR_UNCLOSED_TOKEN,
        expat.errors.XML_ERROR_PARTIAL_CHAR,
    )
)


def parse_xml(text: str) -> Capture:
    entity = _ENTITY.search(text)
    if entity is not None:
        raise CaptureError(
            "XML entity declarations are refused: nvidia-smi never writes one",
            text.count("\n", 0, entity.start()) + 1,
        )
    root = _tree(text)
    gpus = [node for node in root.children if node.key == "gpu"]
    if not gpus:
        raise CaptureError("no <gpu> element in the capture", _line_count(text))
    driver = driver_version(
        root,
        ("kmd_version", "driver_version"),
        CaptureError("the capture has no <driver_version>", root.line),
        "the <driver_version> holds no version number",
    )
    captured = tuple(_gpu(node) for node in gpus)
    return Capture(
        format="xml",
        driver_version=driver,
        cuda_version=cuda_version(root, ("cuda_umd_version", "cuda_version")),
        timestamp=string(root.get("timestamp")),
        attached_gpus=integer(root.get("attached_gpus")),
        gpus=captured,
        notes=tuple(root.notes),
    )


def _line_count(text: str) -> int:
    return max(1, text.count("\n") + (not text.endswith("\n")))


def _tree(text: str) -> Node:
    """The document as nodes: an element's value is its text when it has no children."""
    parser: ET.XMLPullParser[ET.Element] = ET.XMLPullParser(events=("start", "end"))
    # Expat may hold a token back until the next feed (reparse deferral, expat 2.6+; the
    # Pythons that ship it have flush()): flushing after each line keeps every element on
    # the line it starts on.
    flush = getattr(parser, "flush", None)
    builder = _Builder()
    lines = text.split("\n")
    try:
        for line_number, line in enumerate(lines, 1):
            parser.feed(line if line_number == len(lines) else line + "\n")
            if flush is not None:
                flush()
            for item in parser.read_events():
                element = item[-1]
                if isinstance(element, ET.Element):
                    builder.event(item[0], element, line_number)
        parser.close()
    except ET.ParseError as exc:
        raise _syntax_error(exc, text) from None
    if builder.root is None:  # pragma: no cover - close() has raised "no element found"
        raise CaptureError(NOT_A_CAPTURE, 1)
    return builder.root


class _Builder:
    """Start and end events into nodes, refusing any root but <nvidia_smi_log> at once."""

    def __init__(self) -> None:
        self.root: Node | None = None
        self._open: list[Node] = []

    def event(self, event: str, element: ET.Element, line: int) -> None:
        if event == "start":
            parent = self._open[-1] if self._open else None
            node = Node(element.tag, None, line, parent)
            if parent is not None:
                parent.add(node)
            elif element.tag != _ROOT:
                raise CaptureError(NOT_A_CAPTURE, line)
            else:
                self.root = node
            self._open.append(node)
            return
        node = self._open.pop()
        if not node.children:
            node.value = (element.text or "").strip()
        element.clear()  # the nodes hold what is needed; the elements need not stay


def _syntax_error(exc: ET.ParseError, text: str) -> CaptureError:
    line, _column = exc.position
    reason = str(exc).split(": line ", 1)[0]
    if exc.code in _CUT_SHORT:
        # Expat reports these past the last line when the text ends with a newline.
        line = min(line, _line_count(text))
        return CaptureError(
            f"the XML ends inside an element: the capture is cut short ({reason})", line
        )
    return CaptureError(f"not well-formed XML: {reason}", line)


def _gpu(gpu: Node) -> CapturedGpu:
    where = f"the <gpu> at line {gpu.line}"
    product = required(gpu.get("product_name"), gpu, f"{where} has no <product_name>")
    bus_id = required(gpu.get("pci", "pci_bus_id"), gpu, f"{where} has no <pci>/<pci_bus_id>")
    pci = gpu.get("pci")
    generation = at(pci, "pci_gpu_link_info", "pcie_gen")
    width = at(pci, "pci_gpu_link_info", "link_widths")
    memory = gpu.get("fb_memory_usage")
    utilization = gpu.get("utilization")
    temperature = gpu.get("temperature")
    power = gpu.first("gpu_power_readings", "power_readings")
    # <current_power_limit> since DTD v12, nested in <gpu_ceiling_power_limit> by R610.
    limits = power_limits(
        power,
        (
            "gpu_ceiling_power_limit",
            "current_power_limit",
            "requested_power_limit",
            "default_power_limit",
            "enforced_power_limit",
            "power_limit",
        ),
    )
    module = gpu.first("module_power_readings")
    clocks = gpu.get("clocks")
    applications = gpu.get("applications_clocks")
    defaults = gpu.get("default_applications_clocks")
    maxima = gpu.get("max_clocks")
    retired = gpu.get("retired_pages")
    platform = gpu.get("platformInfo")
    remapped = gpu.get("remapped_rows")
    volatile = _ecc(gpu.get("ecc_errors", "volatile"))
    aggregate = _ecc(gpu.get("ecc_errors", "aggregate"))
    return CapturedGpu(
        bus_id=bus_id,
        product_name=product,
        line=gpu.line,
        product_brand=string(gpu.get("product_brand")),
        architecture=string(gpu.get("product_architecture")),
        uuid=string(gpu.get("uuid")),
        serial=string(gpu.get("serial")),
        minor_number=integer(gpu.get("minor_number")),
        module_id=integer(gpu.get("gpu_module_id")),
        vbios_version=string(gpu.get("vbios_version")),
        inforom_image_version=string(gpu.get("inforom_version", "img_version")),
        gsp_firmware_version=string(gpu.get("gsp_firmware_version")),
        pci_device_id=hexadecimal(at(pci, "pci_device_id")),
        pci_subsystem_id=hexadecimal(at(pci, "pci_sub_system_id")),
        persistence_mode=flag(gpu.get("persistence_mode")),
        virtualization_mode=string(gpu.get("gpu_virtualization_mode", "virtualization_mode")),
        compute_mode=string(gpu.get("compute_mode")),
        mig_current=flag(gpu.get("mig_mode", "current_mig")),
        mig_pending=flag(gpu.get("mig_mode", "pending_mig")),
        mig_devices=tuple(
            _mig_device(node) for node in entries(gpu.get("mig_devices"), "mig_device")
        ),
        ecc_current=flag(gpu.get("ecc_mode", "current_ecc")),
        ecc_pending=flag(gpu.get("ecc_mode", "pending_ecc")),
        ecc_corrected_volatile=volatile.corrected,
        ecc_uncorrected_volatile=volatile.uncorrected,
        ecc_corrected_aggregate=aggregate.corrected,
        ecc_uncorrected_aggregate=aggregate.uncorrected,
        sram_corrected_volatile=volatile.sram_corrected,
        sram_uncorrected_volatile=volatile.sram_uncorrected,
        sram_corrected_aggregate=aggregate.sram_corrected,
        sram_uncorrected_aggregate=aggregate.sram_uncorrected,
        sram_threshold_exceeded=aggregate.sram_threshold_exceeded,
        retired_pages_sbe=integer(at(retired, "multiple_single_bit_retirement", "retired_count")),
        retired_pages_dbe=integer(at(retired, "double_bit_retirement", "retired_count")),
        retired_pages_pending=flag(pick(retired, "pending_blacklist", "pending_retirement")),
        remapped_rows_correctable=integer(at(remapped, "remapped_row_corr")),
        remapped_rows_uncorrectable=integer(at(remapped, "remapped_row_unc")),
        remapped_rows_pending=flag(at(remapped, "remapped_row_pending")),
        remapped_rows_failure=flag(at(remapped, "remapped_row_failure")),
        remap_histogram=histogram(
            at(remapped, "row_remapper_histogram"),
            (
                "row_remapper_histogram_max",
                "row_remapper_histogram_high",
                "row_remapper_histogram_partial",
                "row_remapper_histogram_low",
                "row_remapper_histogram_none",
            ),
        ),
        reset_required=flag(gpu.get("gpu_reset_status", "reset_required")),
        recovery_action=string(gpu.get("gpu_recovery_action")),
        channel_repair_pending=flag(gpu.get("ecc_errors", "channel_repair_pending")),
        tpc_repair_pending=flag(gpu.get("ecc_errors", "tpc_repair_pending")),
        unrepairable_memory=flag(gpu.get("ecc_errors", "unrepairable_memory")),
        drain_and_reset_recommended=flag(
            gpu.get("gpu_reset_status", "drain_and_reset_recommended")
        ),
        pcie_generation_max=integer(at(generation, "max_link_gen")),
        pcie_generation_current=integer(at(generation, "current_link_gen")),
        pcie_generation_device_max=integer(at(generation, "max_device_link_gen")),
        pcie_generation_host_max=integer(at(generation, "max_host_link_gen")),
        pcie_width_max=integer(at(width, "max_link_width"), "x"),
        pcie_width_current=integer(at(width, "current_link_width"), "x"),
        pcie_replays=integer(at(pci, "replay_counter")),
        pcie_replay_rollovers=integer(at(pci, "replay_rollover_counter")),
        pcie_tx_kbps=integer(at(pci, "tx_util"), "KB/s"),
        pcie_rx_kbps=integer(at(pci, "rx_util"), "KB/s"),
        fan_speed_pct=number(gpu.get("fan_speed"), "%"),
        performance_state=pstate(gpu.get("performance_state")),
        clock_event_reasons=_clock_event_reasons(gpu),
        fb_total_mib=number(at(memory, "total"), "MiB"),
        fb_reserved_mib=number(at(memory, "reserved"), "MiB"),
        fb_used_mib=number(at(memory, "used"), "MiB"),
        fb_free_mib=number(at(memory, "free"), "MiB"),
        utilization_gpu_pct=number(at(utilization, "gpu_util"), "%"),
        utilization_memory_pct=number(at(utilization, "memory_util"), "%"),
        utilization_encoder_pct=number(at(utilization, "encoder_util"), "%"),
        utilization_decoder_pct=number(at(utilization, "decoder_util"), "%"),
        temperature_c=number(at(temperature, "gpu_temp"), "C"),
        memory_temperature_c=number(at(temperature, "memory_temp"), "C"),
        thresholds=_thresholds(temperature),
        power_draw_w=number(pick(power, "power_draw", "average_power_draw"), "W"),
        power_instant_w=number(at(power, "instant_power_draw"), "W"),
        power_limit_w=number(limits.current, "W"),
        power_requested_limit_w=number(limits.requested, "W"),
        power_default_limit_w=number(limits.default, "W"),
        power_min_limit_w=number(at(power, "min_power_limit"), "W"),
        power_max_limit_w=number(at(power, "max_power_limit"), "W"),
        module_power_w=number(at(module, "average_power_draw"), "W"),
        module_power_limit_w=number(at(module, "current_power_limit"), "W"),
        clock_graphics_mhz=integer(at(clocks, "graphics_clock"), "MHz"),
        clock_sm_mhz=integer(at(clocks, "sm_clock"), "MHz"),
        clock_memory_mhz=integer(at(clocks, "mem_clock"), "MHz"),
        clock_video_mhz=integer(at(clocks, "video_clock"), "MHz"),
        applications_clock_graphics_mhz=integer(at(applications, "graphics_clock"), "MHz"),
        applications_clock_memory_mhz=integer(at(applications, "mem_clock"), "MHz"),
        default_applications_clock_graphics_mhz=integer(at(defaults, "graphics_clock"), "MHz"),
        default_applications_clock_memory_mhz=integer(at(defaults, "mem_clock"), "MHz"),
        max_clock_graphics_mhz=integer(at(maxima, "graphics_clock"), "MHz"),
        max_clock_sm_mhz=integer(at(maxima, "sm_clock"), "MHz"),
        max_clock_memory_mhz=integer(at(maxima, "mem_clock"), "MHz"),
        max_clock_video_mhz=integer(at(maxima, "video_clock"), "MHz"),
        fabric_state=string(gpu.get("fabric", "state")),
        fabric_status=string(gpu.get("fabric", "status")),
        fabric_health=fabric_health(
            gpu.get("fabric", "health"),
            (
                "bandwidth",
                "route_recovery_in_progress",
                "route_unhealthy",
                "access_timeout_recovery",
                "incorrect_configuration",
            ),
        ),
        fabric_clique_id=integer(gpu.get("fabric", "cliqueId")),
        fabric_cluster_uuid=uuid_text(gpu.get("fabric", "clusterUuid")),
        chassis_serial=printed(at(platform, "chassis_serial_number")),
        slot_number=integer(at(platform, "slot_number")),
        tray_index=integer(at(platform, "tray_index")),
        host_id=integer(at(platform, "host_id")),
        peer_type=string(at(platform, "peer_type")),
        platform_module_id=integer(at(platform, "module_id")),
        processes=tuple(_process(node) for node in entries(gpu.get("processes"), "process_info")),
    )


def _ecc(section: Node | None) -> EccCounts:
    if section is None:
        return EccCounts()
    if section.first("dram_correctable", "dram_uncorrectable", "sram_correctable") is None:
        # Before the SRAM/DRAM split: per-unit counts under <single_bit> and <double_bit>,
        # each with a <total>.
        return EccCounts(
            corrected=integer(section.get("single_bit", "total")),
            uncorrected=integer(section.get("double_bit", "total")),
        )
    return EccCounts(
        corrected=integer(section.get("dram_correctable")),
        uncorrected=integer(section.get("dram_uncorrectable")),
        sram_corrected=integer(section.get("sram_correctable")),
        sram_uncorrected=summed(
            integer(section.get("sram_uncorrectable")),
            integer(section.get("sram_uncorrectable_parity")),
            integer(section.get("sram_uncorrectable_secded")),
        ),
        sram_threshold_exceeded=flag(section.get("sram_threshold_exceeded")),
    )


def _thresholds(section: Node | None) -> TemperatureThresholds:
    if section is None:
        return TemperatureThresholds()

    def celsius(tag: str) -> float | None:
        return number(section.get(tag), "C")

    # The T.Limit scale when any *_tlimit_threshold has a value; <gpu_temp_tlimit> (the
    # margin) is there, as N/A, on absolute-scale GPUs too.
    tlimit = any(
        celsius(f"gpu_temp_{name}_tlimit_threshold") is not None
        for name in ("max", "slow", "max_gpu")
    )
    scale = "_tlimit_threshold" if tlimit else "_threshold"
    return TemperatureThresholds(
        tlimit=tlimit,
        shutdown=celsius("gpu_temp_max" + scale),
        slowdown=celsius("gpu_temp_slow" + scale),
        gpu_max=celsius("gpu_temp_max_gpu" + scale),
        memory_max=celsius("gpu_temp_max_mem" + scale),
        margin=celsius("gpu_temp_tlimit"),
        target=celsius("gpu_target_temperature"),
    )


def _clock_event_reasons(gpu: Node) -> ClockEventReasons | None:
    section = gpu.first("clocks_event_reasons", "clocks_throttle_reasons")
    if section is None or not section.children:
        return None
    prefix = section.key.removesuffix("s") + "_"  # clocks_event_reason_, clocks_throttle_...

    def reason(name: str) -> bool | None:
        return flag(section.get(prefix + name))

    return ClockEventReasons(
        idle=reason("gpu_idle"),
        applications_clocks=reason("applications_clocks_setting"),
        sw_power_cap=reason("sw_power_cap"),
        hw_slowdown=reason("hw_slowdown"),
        hw_thermal_slowdown=reason("hw_thermal_slowdown"),
        hw_power_brake_slowdown=reason("hw_power_brake_slowdown"),
        sync_boost=reason("sync_boost"),
        sw_thermal_slowdown=reason("sw_thermal_slowdown"),
        display_clocks=reason("display_clocks_setting"),
    )


def _process(node: Node) -> CapturedProcess:
    pid = integer(node.get("pid"))
    if pid is None:
        raise CaptureError(f"the <process_info> at line {node.line} has no <pid>", node.line)
    return CapturedProcess(
        pid=pid,
        # N/A where nvidia-smi cannot see the process (another PID namespace).
        name=string(node.get("process_name")) or "",
        type=string(node.get("type")) or "C",
        used_mib=number(node.get("used_memory"), "MiB"),
        gpu_instance_id=integer(node.get("gpu_instance_id")),
        compute_instance_id=integer(node.get("compute_instance_id")),
    )


def _mig_device(node: Node) -> CapturedMigDevice:
    index = integer(node.get("index"))
    gpu_instance = integer(node.get("gpu_instance_id"))
    compute_instance = integer(node.get("compute_instance_id"))
    if index is None or gpu_instance is None or compute_instance is None:
        raise CaptureError(
            "a <mig_device> lacks its <index>, <gpu_instance_id> or <compute_instance_id>",
            node.line,
        )
    return CapturedMigDevice(
        index=index,
        gpu_instance_id=gpu_instance,
        compute_instance_id=compute_instance,
        multiprocessor_count=integer(
            node.get("device_attributes", "shared", "multiprocessor_count")
        ),
        memory_total_mib=number(node.get("fb_memory_usage", "total"), "MiB"),
        memory_used_mib=number(node.get("fb_memory_usage", "used"), "MiB"),
    )
