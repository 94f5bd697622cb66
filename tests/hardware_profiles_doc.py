"""docs/hardware-profiles.md, generated: the simulator's GPU profiles and what the agent
says about every real-host capture. `test_hardware_profiles_doc` holds the file equal to
`render()`; `GPUAGENT_WRITE_DOCS=1 pytest tests/test_hardware_profiles_doc.py` rewrites it.

(This module holds no tests itself.)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from gpuagent.config import Config
from gpuagent.daemon import Agent
from gpuagent.model import NodeSnapshot, Severity
from gpuagent.render import settings_text
from gpuagent.sim import GpuProfile, replay_scenario
from gpuagent.sim.catalog import PROFILES
from gpuagent.smi import Capture, CapturedGpu, load_capture
from gpuagent.statusview import status_document

REPO = Path(__file__).resolve().parent.parent
REAL_HOSTS = REPO / "tests" / "data" / "real-hosts"
CAPTURES = sorted(p for p in REAL_HOSTS.iterdir() if ".nvidia-smi-q." in p.name)
DOC = REPO / "docs" / "hardware-profiles.md"


@dataclass(frozen=True)
class Verdict:
    """What `gpuagent check --from-nvidia-smi` says: the exit code and every finding that
    is not OK, keyed by (GPU index or None for the node, check)."""

    exit_code: int
    problems: dict[tuple[int | None, str], str]
    reasons: tuple[str, ...]


def collect(
    capture: Path, kernel_log: bytes | None = None, config: Config | None = None
) -> NodeSnapshot:
    """One `gpuagent check` of the replayed capture (and kernel log), in this process."""
    agent = Agent(config or Config(), simulate=replay_scenario(load_capture(capture)))
    return asyncio.run(agent.collect_once(kernel_log))


def judge(capture: Path, snapshot: NodeSnapshot | None = None) -> Verdict:
    snapshot = snapshot or collect(capture)
    index = {g.identity.pci_bus_id: g.identity.index for g in snapshot.gpus}
    bad = snapshot.health.problems()
    return Verdict(
        exit_code=snapshot.health.severity.value,
        problems={
            (None if f.gpu is None else index.get(f.gpu), f.check): f.severity.name for f in bad
        },
        reasons=tuple(
            f"{'node' if f.gpu is None else f'GPU {index.get(f.gpu)}'} {f.check}: {f.reason}"
            for f in bad
            if f.severity is not Severity.OK
        ),
    )


def _na(gpu: CapturedGpu) -> str:
    """What the capture shows as N/A, in words an SRE reads in `nvidia-smi -q`."""
    missing = [
        label
        for label, value in (
            ("ECC", gpu.ecc_current),
            ("retired pages", gpu.retired_pages_sbe),
            ("remapped rows", gpu.remapped_rows_correctable),
            ("memory temperature", gpu.memory_temperature_c),
            ("utilization", gpu.utilization_gpu_pct),
            ("fabric", gpu.fabric_state),
            ("GSP firmware", gpu.gsp_firmware_version),
            ("serial", gpu.serial),
        )
        if value is None
    ]
    return ", ".join(missing) or "-"


def _unsupported(profile: GpuProfile) -> str:
    """What the model has no value for (NVML answers NOT_SUPPORTED)."""
    missing = [
        label
        for label, has in (
            ("ECC", profile.ecc),
            ("retired pages", profile.retired_pages),
            ("remapped rows", profile.row_remapping),
            ("memory temperature", profile.memory_temperature_offset_c is not None),
            ("NVLink", profile.nvlinks > 0),
            ("MIG", profile.mig),
            ("GSP firmware", profile.gsp_firmware),
            ("fabric", profile.fabric),
            ("applications clocks", profile.applications_clock_mhz is not None),
            ("throttle counters", profile.violation_counters),
            ("serial", profile.serial_number),
            ("fan", profile.fan_idle_pct is not None),
        )
        if not has
    ]
    if profile.mig and not profile.row_remapping_under_mig:
        missing.append("remapped rows and utilization under MIG")
    elif profile.mig:
        missing.append("utilization under MIG")
    return ", ".join(missing) or "-"


def _profiles_table() -> list[str]:
    lines = [
        "| `[node] model` | product name | power limit | idle | busy | PCIe | NVLinks | N/A |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in PROFILES:
        idle_gen = p.pcie_idle_generation or p.pcie_max_generation
        lines.append(
            f"| `{p.key}` | {p.name} | {p.power_min_limit_w:g}-{p.power_max_limit_w:g} W "
            f"(default {p.power_default_limit_w:g}) | {p.power_idle_w:g} W, P{p.idle_pstate}, "
            f"SM {p.sm_clock_idle_mhz} MHz, Gen{idle_gen} | up to {p.power_full_w:g} W, "
            f"P{p.busy_pstate}, SM {p.sm_clock_max_mhz} MHz | Gen{p.pcie_max_generation} "
            f"x{p.pcie_max_width} | {p.nvlinks} | {_unsupported(p)} |"
        )
    return lines


def _captures_table() -> list[str]:
    lines = [
        (
            "| capture | GPUs | driver | N/A on GPU 0 | read as absent | settings of GPU 0 | exit "
            "| findings |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in CAPTURES:
        capture = load_capture(path)
        snapshot = collect(path)
        verdict = judge(path, snapshot)
        first = capture.gpus[0]
        findings = "; ".join(verdict.reasons) or "none"
        settings = settings_text(status_document(snapshot)["gpus"][0]) or "-"
        lines.append(
            f"| `{path.name}` | {len(capture.gpus)} x {first.product_name} | "
            f"{capture.driver_version} | {_na(first)} | {_absent(capture)} | {settings} | "
            f"{verdict.exit_code} | {findings} |"
        )
    return lines


def _absent(capture: Capture) -> str:
    """The fields whose value the parser did not understand (read as absent), by label."""
    fields = sorted({note.split(": ", 2)[1].split(" / ", 1)[-1] for note in capture.notes})
    return ", ".join(fields) or "-"


def render() -> str:
    lines = [
        "# Hardware profiles and real hosts",
        "",
        "Generated by `tests/test_hardware_profiles_doc.py` from the simulator's profiles and",
        "the captures in `tests/data/real-hosts/`; do not edit by hand",
        "(`GPUAGENT_WRITE_DOCS=1 .venv/bin/pytest tests/test_hardware_profiles_doc.py`",
        "rewrites it). See [simulation.md](simulation.md) for how a profile or a capture is",
        "served beneath NVML.",
        "",
        "## GPU profiles",
        "",
        "What a simulated GPU of each model reports. Idle: no process (0 % utilization, the",
        "GPU-idle clock event reason); busy: a `process` fault. N/A: values the model does",
        "not have, answered `NOT_SUPPORTED` beneath NVML and so never exported.",
        "",
        *_profiles_table(),
        "",
        "## What each real-host capture yields",
        "",
        "`gpuagent check --from-nvidia-smi FILE` on each capture: the exit code",
        "(0 OK, 1 WARN, 2 CRITICAL, 3 UNKNOWN) and every finding that is not OK. Read as",
        "absent: fields whose value the parser did not understand; the check names each once,",
        "with its line, on stderr (`replay_notes` with `--json`). What nvidia-smi prints for no",
        'value (N/A, "Requested functionality has been deprecated", which drivers 570 and',
        "later print for applications clocks, ...) is not among them. Settings are",
        "facts, shown as `gpuagent status` shows them: without a declared or learned",
        "expectation none of them is a finding (see",
        "[checks.md](checks.md#settings-and-faults)).",
        "",
        *_captures_table(),
        "",
    ]
    return "\n".join(lines)
