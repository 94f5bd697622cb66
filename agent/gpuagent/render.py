"""Human-readable status table, rendered from the status document (a plain dict), so
the CLI needs nothing but the JSON it received."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from typing import Any, Literal, TextIO

ColorChoice = Literal["auto", "always", "never"]

_COLUMNS = (
    "GPU",
    "BUS ID",
    "MODEL",
    "TEMP",
    "POWER",
    "UTIL",
    "P",
    "ECC SBE/DBE",
    "HEALTH",
    "REASON",
)
# Clock event reasons that are normal operation, not worth a line on a healthy GPU.
_ROUTINE_CLOCK_EVENTS = {"gpu_idle", "applications_clocks", "sw_power_cap"}
# SGR colours of the severities: red, yellow, green, magenta.
_SEVERITY_COLORS = {"CRITICAL": "31", "WARN": "33", "OK": "32", "UNKNOWN": "35"}
# An SGR escape: it takes no column on the screen.
_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def fit_to_width(text: str, width: int) -> str:
    """Each line cut to ``width`` columns (colour escapes count none), ending in "…" where
    cut, so a redrawn screen never wraps (`status --watch` on a terminal)."""
    return "\n".join(_fit_line(line, width) for line in text.split("\n"))


def _fit_line(line: str, width: int) -> str:
    visible = _ESCAPE.sub("", line)
    if len(visible) <= width or width < 2:
        return line
    kept, columns, position = [], 0, 0
    while columns < width - 1:
        escape = _ESCAPE.match(line, position)
        if escape:
            kept.append(escape.group())
            position = escape.end()
            continue
        kept.append(line[position])
        position += 1
        columns += 1
    # A colour cut off is ended, so it does not run into the next line.
    reset = "\x1b[0m" if "\x1b[" in line else ""
    return "".join(kept) + reset + "…"


def color_enabled(
    choice: ColorChoice, stream: TextIO, environ: Mapping[str, str] = os.environ
) -> bool:
    """Whether to colour what goes to ``stream``: ``always``, ``never``, or (``auto``) on a
    terminal only, unless NO_COLOR is set to anything but "" (https://no-color.org) or the
    terminal is "dumb"."""
    if choice != "auto":
        return choice == "always"
    if environ.get("NO_COLOR") or environ.get("TERM") == "dumb":
        return False
    return stream.isatty()


def _paint(text: str, severity: str, color: bool) -> str:
    """``text`` in the colour of ``severity`` (a severity name); unchanged without colour."""
    code = _SEVERITY_COLORS.get(severity)
    return f"\x1b[{code}m{text}\x1b[0m" if color and code else text


def _fmt(value: object, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def _gpu_row(gpu: dict[str, Any]) -> tuple[str, ...]:
    findings = gpu.get("findings") or []
    reason = findings[0]["reason"] if findings else ("" if gpu["status"] == "ok" else gpu["status"])
    # Throttle reasons asserted without a finding (e.g. HW Slowdown on an idle H100): shown,
    # so nobody wonders why the metric says so while the health says OK.
    asserted = [r for r in gpu.get("clock_event_reasons") or [] if r not in _ROUTINE_CLOCK_EVENTS]
    if not findings and asserted:
        reason = f"clock events asserted: {', '.join(asserted)}"
    pstate = gpu.get("performance_state")
    ecc = (
        "-"
        if gpu.get("ecc_sbe_volatile") is None and gpu.get("ecc_dbe_volatile") is None
        else f"{_fmt(gpu.get('ecc_sbe_volatile'))}/{_fmt(gpu.get('ecc_dbe_volatile'))}"
    )
    return (
        str(gpu["index"]),
        gpu["pci_bus_id"],
        (gpu.get("model") or "?").removeprefix("NVIDIA "),
        _fmt(gpu.get("temperature_c"), "C"),
        _fmt(gpu.get("power_w"), "W"),
        _fmt(gpu.get("utilization_gpu_pct"), "%"),
        "-" if pstate is None else f"P{pstate}",
        ecc,
        gpu["health"],
        reason,
    )


def settings_text(gpu: dict[str, Any]) -> str:
    """One GPU's settings, as facts ("persistence off, ECC on, power limit 700 W, ...")."""
    parts = []
    for key, name in (("persistence_mode", "persistence"), ("ecc_enabled", "ECC")):
        if gpu.get(key) is not None:
            parts.append(f"{name} {'on' if gpu[key] else 'off'}")
    limit, requested = gpu.get("power_limit_w"), gpu.get("power_requested_limit_w")
    if limit is not None:
        below = requested is not None and limit < requested - 1
        parts.append(f"power limit {limit:g} W" + (f" of {requested:g} W asked" if below else ""))
    if gpu.get("applications_clock_mhz") is not None:
        parts.append(f"applications clock {gpu['applications_clock_mhz']} MHz")
    if gpu.get("compute_mode") is not None:
        parts.append(f"compute mode {gpu['compute_mode']}")
    if gpu.get("mig_mode"):
        parts.append("MIG on")
    return ", ".join(parts)


def _settings_lines(gpus: list[dict[str, Any]]) -> list[str]:
    """The GPUs' settings, one line for each group of GPUs that share them."""
    groups: dict[str, list[str]] = {}
    for gpu in gpus:
        text = settings_text(gpu)
        if text:
            groups.setdefault(text, []).append(str(gpu["index"]))
    if len(groups) == 1 and len(next(iter(groups.values()))) == len(gpus):
        return [f"Settings: {next(iter(groups))}"]
    return [f"Settings of GPU {','.join(indices)}: {text}" for text, indices in groups.items()]


def _place_lines(doc: dict[str, Any]) -> list[str]:
    """Where the node sits: its location labels, the GPUs' NVLink domains and racks."""
    lines = []
    labels = doc["node"].get("labels") or {}
    if labels:
        lines.append("Labels: " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    domains: dict[str, list[str]] = {}
    for gpu in doc["gpus"]:
        fabric, place = gpu.get("fabric"), gpu.get("platform")
        where = [] if fabric is None else [fabric.get("nvlink_domain") or "unassigned"]
        if place:
            where.append(
                f"chassis {place['chassis_serial'] or '-'} slot {place['slot_number']} "
                f"tray {place['tray_index']} host {place['host_id']}"
            )
        if where:
            domains.setdefault(", ".join(where), []).append(str(gpu["index"]))
    lines.extend(
        f"NVLink domain of GPU {','.join(gpus)}: {where}" for where, gpus in domains.items()
    )
    return lines


def _inventory_lines(inventory: dict[str, Any] | None) -> list[str]:
    """The node section: what the node is (see docs/inventory.md)."""
    if not inventory:
        return []
    pci = inventory.get("pci")
    pci_gpus = None if pci is None else sum(1 for f in pci if f["role"] == "gpu")
    switches = None if pci is None else sum(1 for f in pci if f["role"] == "nvswitch")
    services = inventory.get("services") or {}
    fingerprint = inventory.get("fingerprint") or {}
    elsewhere = inventory.get("gpus_other_driver") or {}
    drivers = ", ".join(sorted(set(elsewhere.values())))
    return [
        (
            f"GPUs: NVML {_fmt(inventory.get('gpus_nvml'))}, PCI {_fmt(pci_gpus)}"
            + (f" ({len(elsewhere)} on {drivers})" if elsewhere else "")
            + f"  NVSwitches {_fmt(switches)}"
            f"  module {inventory.get('module_version') or '-'}"
            f"  VBIOS {fingerprint.get('vbios') or '-'}"
            f"  GSP {fingerprint.get('gsp_firmware') or '-'}"
        ),
        (
            f"Kernel {inventory.get('kernel_release') or '-'}"
            f"  OS {inventory.get('os_release') or '-'}"
            f"  agent {inventory.get('agent_version') or '-'}"
            f"  fingerprint {inventory.get('fingerprint_id') or '-'}"
        ),
        "Services: " + (", ".join(f"{name} {state}" for name, state in services.items()) or "-"),
    ]


def _rdma_lines(ports: list[dict[str, Any]] | None) -> list[str]:
    """One line for the node's RDMA ports: how many are up, at which rates, and every
    port that is not ACTIVE/LinkUp by name. Nothing on a node without RDMA devices."""
    if not ports:
        return []
    up = [p for p in ports if p["active"]]
    rates = sorted({p["rate_gbps"] for p in up if p["rate_gbps"] is not None}, reverse=True)
    down = [
        f"{p['device']}/{p['port']} {p['state'] or '?'}/{p['phys_state'] or '?'}"
        for p in ports
        if not p["active"]
    ]
    return [
        f"RDMA: {len(up)} of {len(ports)} ports active"
        + (" at " + ", ".join(f"{r:g} Gb/s" for r in rates) if rates else "")
        + (f"; down: {', '.join(down)}" if down else "")
    ]


def render_status(
    doc: dict[str, Any],
    now: float | None = None,
    *,
    color: bool = False,
    width: int = 0,
    title: str | None = None,
) -> str:
    """The status table; with ``color``, severities in ANSI colours (for a terminal); with
    ``width``, the GPU table's least needed columns left out until it fits (GPU, HEALTH and
    REASON always stay). ``title`` names what a replay shows (the capture) in place of this
    node, its simulation and the snapshot's age, none of which a capture has."""
    node = doc["node"]
    now = time.time() if now is None else now
    driver, cuda = node.get("driver_version") or "-", node.get("cuda_driver_version") or "-"
    versions = f"Driver {driver}  CUDA {cuda}"
    health = _paint(node["health"], node["health"], color)
    if title is not None:
        lines = [f"{title}: {health}", versions]
    else:
        lines = [
            f"Node {node['name']} (cluster {node['cluster']}): {health}"
            + (" [simulated]" if node.get("simulated") else ""),
            f"{versions}  snapshot {now - doc['taken_at']:.1f} s old",
        ]
    lines.extend(_inventory_lines(node.get("inventory")))
    lines.extend(_settings_lines(doc["gpus"]))
    lines.extend(_place_lines(doc))
    lines.extend(_rdma_lines(node.get("infiniband")))
    lines.extend(
        f"  {_paint(f['severity'], f['severity'], color)} {f['check']}: {f['reason']}"
        f" (action: {f['action']})"
        for f in node.get("findings", [])
    )
    lines.append("")
    lines.extend(_gpu_table(doc["gpus"], color, width))
    problems = [(g, f) for g in doc["gpus"] for f in g.get("findings", [])[1:]]
    if problems:
        lines.append("")
        lines.extend(
            f"GPU {g['index']} {_paint(f['severity'], f['severity'], color)} {f['check']}: "
            f"{f['reason']}"
            for g, f in problems
        )
    lines.extend(_workload_lines(doc["gpus"]))
    lines.extend(_remediation_lines(doc.get("remediation")))
    sources = doc.get("sources") or []
    if sources:
        lines.append("")
        lines.append(
            "Sources: "
            + ", ".join(
                f"{s['name']} {_source_state(s)}"
                + (f" ({s['last_error']})" if s.get("last_error") and not s["up"] else "")
                for s in sources
            )
        )
    lines.extend(_dcgm_lines(doc, now))
    return "\n".join(lines)


# Left out first when the table must be narrower, in this order.
_DROPPABLE = ("MODEL", "ECC SBE/DBE", "P", "UTIL", "POWER", "BUS ID", "TEMP")
# What REASON keeps at least when columns are left out for a narrow terminal.
_MIN_REASON = 24


def _gpu_table(gpus: list[dict[str, Any]], color: bool, width: int) -> list[str]:
    rows = [_COLUMNS, *(_gpu_row(g) for g in gpus)]
    shown = list(range(len(_COLUMNS)))
    widths = {i: max(len(r[i]) for r in rows) for i in shown}

    def table_width() -> int:
        return sum(widths[i] + 2 for i in shown[:-1]) + _MIN_REASON

    for name in _DROPPABLE:
        if not width or table_width() <= width:
            break
        shown.remove(_COLUMNS.index(name))
    health = _COLUMNS.index("HEALTH")
    lines = []
    for number, row in enumerate(rows):
        cells = []
        for i in shown[:-1]:
            cell = row[i].ljust(widths[i])
            if number and i == health:  # the padding stays outside the escape codes
                cell = _paint(row[i], row[i], color) + cell[len(row[i]) :]
            cells.append(cell)
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return lines


def _source_state(source: dict[str, Any]) -> str:
    if source["up"]:
        return "up"
    # An agent from before "available" has no such key: a source not up is down.
    return "unavailable" if source.get("available") is False else "DOWN"


def _workload_lines(gpus: list[dict[str, Any]]) -> list[str]:
    """Who each GPU belongs to (workload attribution): nothing when off or nobody is known."""
    owned = [(g, g.get("workloads") or []) for g in gpus]
    if not any(workloads for _, workloads in owned):
        return []
    lines = ["", "Workloads:"]
    for gpu, workloads in owned:
        for workload in workloads:
            who = []
            if "pod" in workload:
                who.append(
                    f"pod {workload['namespace']}/{workload['pod']} ({workload['container']})"
                )
            if "hpc_job" in workload:
                who.append(f"job {workload['hpc_job']}")
            mig = f" on {workload['device']}" if "device" in workload else ""
            lines.append(f"  GPU {gpu['index']}{mig}: {', '.join(who)}")
    return lines


def _remediation_lines(remediation: dict[str, Any] | None) -> list[str]:
    """The latest remediation plan, each action with what it came to; in observe mode what
    enforce would do, so a refusal reads "refused" with why."""
    steps = (remediation or {}).get("plan") or []
    if not steps or remediation is None:
        return []
    mode = remediation["mode"] + (", paused" if remediation.get("paused") else "")
    lines = ["", f"Remediation plan ({mode}):"]
    for step in steps:
        times = f" ({step['count']} times)" if step["count"] > 1 else ""
        detail = f" [{step['detail']}]" if step["detail"] else ""
        lines.append(
            f"  {step['result']}{times} {step['action']} {step['target']}: {step['reason']}{detail}"
        )
    return lines


def _dcgm_lines(doc: dict[str, Any], now: float) -> list[str]:
    """DCGM's state (nothing on a node without DCGM) and the latest diagnostics."""
    lines: list[str] = []
    dcgm = doc.get("dcgm")
    if dcgm and dcgm["state"] != "absent":
        where = ", ".join(v for v in (dcgm.get("version"), dcgm.get("hostengine")) if v)
        state = "up" if dcgm["state"] == "up" else "DOWN"
        incidents = len(dcgm.get("incidents") or [])
        lines.append(
            f"DCGM {state}"
            + (f" ({where})" if where else "")
            + (f": {dcgm['detail']}" if dcgm.get("detail") and state == "DOWN" else "")
            + (f", {incidents} health incident{'s' if incidents != 1 else ''}" if incidents else "")
        )
    for diag in doc.get("diag") or []:
        verdict = "passed" if diag["passed"] else "FAILED"
        failed = ", ".join(
            f["test"] + ("" if f["gpu"] is None else f" (GPU {f['gpu']})") for f in diag["failed"]
        )
        minutes = (now - diag["finished"]) / 60
        lines.append(
            f"Diagnostic level {diag['level']} {verdict} {minutes:.0f} min ago"
            + (f": {failed or diag['error']}" if not diag["passed"] else "")
        )
    return ["", *lines] if lines else []
