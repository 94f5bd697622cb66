"""Inventory checks: is the node what it should be, rather than is it healthy.

Node level: `gpu_count` (GPUs missing, and whether from NVML only or from the bus),
`driver` (kernel modules and their version against the NVML library), `firmware` (GSP
firmware against the driver) and `drift` (versions against the expected ones and the
learned baseline); `services` and `fabric` are in `gpuagent.checks.daemons`. Per GPU:
`mig_layout` (GPU instances against the expected layout); the settings checks are in
`gpuagent.checks.settings`. Pure functions of the inventory, the expectations and the
baseline.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from gpuagent.checks.common import Evidence, Outcome, Problem, SinceBoot, plural
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.config import ChecksSection, InventoryExpected
from gpuagent.inventory.baseline import Baseline
from gpuagent.inventory.model import GpuInventory, NodeInventory, fingerprint, joined
from gpuagent.model import Severity

# What drift compares; the agent's own version is in the fingerprint but not drift.
DRIFT_KEYS = ("driver", "cuda", "kernel", "vbios")


@dataclass(frozen=True, slots=True)
class InventoryView:
    inventory: NodeInventory
    expected: InventoryExpected
    baseline: Baseline | None = None  # learn mode's, once learned
    # (bus id, the limit before) of each GPU the agent's thermal remediation capped and has
    # not restored: the one setting judged without an expectation, being ours.
    power_capped: tuple[tuple[str, float], ...] = ()
    boot: SinceBoot | None = None  # None: when the node booted is not known


def version_matches(actual: str, expected: str) -> bool:
    """Exact, or a prefix at a component boundary: "550" and "550." match "550.54.15"."""
    if not expected:
        return True
    prefix = expected.rstrip(".")
    return actual == prefix or actual.startswith(prefix + ".")


# --- gpu_count ----------------------------------------------------------------------------


def _expected_gpus(view: InventoryView) -> tuple[int, bool]:
    """How many GPUs the node should have (0: no expectation): the configured number,
    else the learned baseline's; and whether it is the baseline's."""
    learned = view.baseline.gpus if view.baseline is not None else None
    if view.expected.gpus or not learned:
        return view.expected.gpus, False
    return learned, True


def check_gpu_count(view: InventoryView) -> Outcome:
    inventory = view.inventory
    expected, learned = _expected_gpus(view)
    pci_gpus = inventory.pci("gpu")
    nvml_ids = {g.pci_bus_id for g in inventory.gpus}
    nvml_count = len(inventory.gpus) if inventory.nvml_ok else None
    # GPUs another driver holds (vfio-pci: passed through to a VM) are there, not missing.
    elsewhere = inventory.gpus_on_other_drivers()
    # Present on the bus, absent from NVML: the driver did not take the GPU.
    unlisted = (
        ()
        if pci_gpus is None or not inventory.nvml_ok
        else tuple(f.address for f in pci_gpus if f.address not in nvml_ids and f not in elsewhere)
    )
    # GPUs NVML counts but could not identify yet (wedged or lost before their bus id was
    # read) may be exactly those: only more PCI-only GPUs than that are proof.
    unidentified = sum(1 for g in inventory.gpus if g.pci_bus_id.startswith("unknown"))
    if len(unlisted) <= unidentified:
        unlisted = ()
    evidence: Evidence = (
        ("gpus_expected", view.expected.gpus or None),
        ("gpus_baseline", None if view.baseline is None else view.baseline.gpus),
        ("gpus_nvml", nvml_count),
        ("gpus_pci", None if pci_gpus is None else len(pci_gpus)),
        ("pci_not_in_nvml", ",".join(unlisted) or None),
        ("pci_other_driver", ",".join(f"{f.address} {f.driver}" for f in elsewhere) or None),
    )
    problems: list[Problem] = []
    if unlisted:
        problems.append(
            Problem(
                Severity.CRITICAL,
                f"{plural(len(unlisted), 'GPU')} on the PCI bus but not in NVML "
                f"({', '.join(unlisted)}): driver did not take it",
                Action.LOAD_DRIVER,
                Runbook.NODE_GPU_MISSING_DRIVER,
            )
        )
    # Fewer GPUs on the bus than expected: gone from PCI, which no driver fixes. Without
    # sysfs, fall back on NVML's count (NVML unusable is the nvml check's finding).
    seen = inventory.gpus_seen
    if expected and seen is not None and seen < expected:
        where = "on the PCI bus" if pci_gpus is not None else "in NVML"
        problems.append(
            Problem(
                Severity.CRITICAL,
                f"{expected - seen} of {expected} "
                f"{'GPUs of the learned baseline' if learned else 'expected GPUs'} "
                f"missing: {seen} {where}",
                Action.DRAIN_AND_REBOOT,
                Runbook.NODE_GPU_MISSING_PCI,
            )
        )
    if nvml_count is not None:
        shown: int | None = nvml_count
    else:
        shown = None if seen is None else seen - len(elsewhere)
    ok = "GPU count not reported" if shown is None else f"{shown} GPUs"
    if elsewhere:
        drivers = ", ".join(sorted({f.driver or "" for f in elsewhere}))
        ok += f" and {len(elsewhere)} bound to {drivers}"
    if expected:
        ok += f", {expected} {'in the learned baseline' if learned else 'expected'}"
    return Outcome(ok, evidence, tuple(problems))


# --- driver ------------------------------------------------------------------------------


def check_driver(view: InventoryView) -> Outcome:
    inventory = view.inventory
    host = inventory.host
    # NVML's own word when it runs; else the installed library file's, which is what a
    # mismatch leaves us (nvmlInit fails with LIB_RM_VERSION_MISMATCH).
    library = inventory.nvml_library_version or host.library_version
    required = tuple(view.expected.modules)
    evidence: Evidence = (
        ("module_version", host.module_version),
        ("nvml_library_version", inventory.nvml_library_version),
        ("installed_library_version", host.library_version),
        ("driver_version", inventory.driver_version),
        *((f"module_{name}", loaded) for name, loaded in host.modules),
    )
    missing = [name for name in required if host.module_loaded(name) is False]
    problems: list[Problem] = []
    if missing:
        problems.append(
            Problem(
                Severity.CRITICAL,
                f"kernel module{'s' if len(missing) > 1 else ''} not loaded: {', '.join(missing)}",
                Action.LOAD_DRIVER,
                Runbook.NODE_DRIVER_MODULE,
            )
        )
    module = host.module_version
    if module and library and module != library:
        problems.append(
            Problem(
                Severity.CRITICAL,
                f"driver/library mismatch: kernel module {module}, NVML library {library}",
                Action.REBOOT,
                Runbook.NODE_DRIVER_MODULE,
            )
        )
    if host.loaded_modules() is None:
        ok = "kernel modules not reported (/sys/module cannot be read)"
    else:
        ok = f"kernel module {module or 'version not reported'}"
    return Outcome(ok, evidence, tuple(problems))


# --- kernel_module -----------------------------------------------------------------------


def check_kernel_module(view: InventoryView) -> Outcome:
    """The newest installed kernel, which the next boot usually starts, and the running
    one must each have an nvidia module on disk, or that boot (or a module reload) comes
    up with no GPU at all."""
    host = view.inventory.host
    newest = host.newest_kernel
    missing = [k.release for k in host.kernels if k.has_nvidia is False]
    evidence: Evidence = (
        ("running_kernel", host.kernel_release),
        ("newest_kernel", None if newest is None else newest.release),
        ("kernels_without_module", ",".join(missing) or None),
    )
    if newest is None:
        return Outcome("installed kernels not read", evidence)
    problems: list[Problem] = []
    if newest.has_nvidia is False:
        running = " (running)" if newest.release == host.kernel_release else ""
        problems.append(
            Problem(
                Severity.WARN,
                f"newest kernel {newest.release}{running} has no nvidia module: "
                "the next boot into it loses every GPU",
                Action.INSTALL_DRIVER,
                Runbook.NODE_KERNEL_WITHOUT_MODULE,
            )
        )
    if host.kernel_release in missing and host.kernel_release != newest.release:
        problems.append(
            Problem(
                Severity.WARN,
                f"running kernel {host.kernel_release} has no nvidia module on disk: "
                "a reboot into it or a module reload loses every GPU",
                Action.INSTALL_DRIVER,
                Runbook.NODE_KERNEL_WITHOUT_MODULE,
            )
        )
    if newest.has_nvidia is None:
        ok = f"newest kernel {newest.release}: its modules cannot be read"
    else:
        ok = f"newest kernel {newest.release} has an nvidia module"
    return Outcome(ok, evidence, tuple(problems))


# --- firmware ----------------------------------------------------------------------------


def check_firmware(view: InventoryView) -> Outcome:
    driver = view.inventory.driver_version
    reported = [g for g in view.inventory.gpus if g.gsp_firmware_version]
    versions = sorted({g.gsp_firmware_version for g in reported if g.gsp_firmware_version})
    evidence: Evidence = (("driver_version", driver), ("gsp_firmware", ",".join(versions) or None))
    if not driver or not reported:
        return Outcome("GSP firmware not reported", evidence)
    odd = [g for g in reported if g.gsp_firmware_version != driver]
    if not odd:
        return Outcome(f"GSP firmware {driver} on {plural(len(reported), 'GPU')}", evidence)
    gpus = ", ".join(f"GPU {g.index} {g.gsp_firmware_version}" for g in odd)
    problem = Problem(
        Severity.WARN,
        f"GSP firmware differs from driver {driver}: {gpus}",
        Action.INSTALL_DRIVER,
        Runbook.NODE_GSP_FIRMWARE_MISMATCH,
    )
    return Outcome("", evidence, (problem,))


# --- drift -------------------------------------------------------------------------------


def _baseline_differences(view: InventoryView, current: dict[str, str]) -> list[str]:
    """What changed since the learned baseline; a value unknown on either side is not
    compared. Fewer GPUs is the gpu_count check's finding, and a required module not
    loaded the driver check's, so neither is repeated here."""
    baseline, inventory = view.baseline, view.inventory
    if baseline is None:
        return []
    differences = [
        f"{key} {current[key]}, baseline {baseline.fingerprint[key]}"
        for key in DRIFT_KEYS
        if baseline.fingerprint.get(key) and current[key]
        and current[key] != baseline.fingerprint[key]
    ]  # fmt: skip
    models = joined([g.model for g in inventory.gpus])
    if baseline.models and models and models != baseline.models:
        differences.append(f"GPU model {models}, baseline {baseline.models}")
    gpus = inventory.gpus_seen
    if baseline.gpus is not None and gpus is not None and gpus > baseline.gpus:
        differences.append(f"GPUs {gpus}, baseline {baseline.gpus}")
    switches = inventory.nvswitches_seen
    if None not in (baseline.nvswitches, switches) and switches != baseline.nvswitches:
        differences.append(f"NVSwitches {switches}, baseline {baseline.nvswitches}")
    modules, required = inventory.host.loaded_modules(), set(view.expected.modules)
    if (
        baseline.modules is not None
        and modules is not None
        and set(modules) - required != set(baseline.modules) - required
    ):
        differences.append(
            f"kernel modules {','.join(modules) or 'none'}, "
            f"baseline {','.join(baseline.modules) or 'none'}"
        )
    return differences


def check_drift(view: InventoryView) -> Outcome:
    inventory, expected, baseline = view.inventory, view.expected, view.baseline
    current = fingerprint(inventory)
    evidence: Evidence = (
        *((key, current[key] or None) for key in DRIFT_KEYS),
        ("baseline", None if baseline is None else ",".join(
            f"{k}={baseline.fingerprint.get(k, '')}" for k in DRIFT_KEYS
        )),
        ("baseline_gpus", None if baseline is None else baseline.gpus),
        ("baseline_nvswitches", None if baseline is None else baseline.nvswitches),
        ("baseline_models", None if baseline is None else baseline.models),
        ("baseline_modules", None if baseline is None or baseline.modules is None
         else ",".join(baseline.modules)),
    )  # fmt: skip
    differences: list[str] = []
    wanted = {
        "driver": expected.driver_version,
        "cuda": expected.cuda_driver_version,
        "kernel": expected.kernel_release,
    }
    for key, want in wanted.items():
        if want and current[key] and not version_matches(current[key], want):
            differences.append(f"{key} {current[key]}, expected {want}")
    vbios = {g.vbios_version for g in inventory.gpus if g.vbios_version}
    if expected.vbios_version and any(v != expected.vbios_version for v in vbios):
        differences.append(f"VBIOS {current['vbios']}, expected {expected.vbios_version}")
    models = {g.model for g in inventory.gpus if g.model}
    if expected.model and any(expected.model not in m for m in models):
        differences.append(f"GPU model {', '.join(sorted(models))}, expected {expected.model}")
    differences += _baseline_differences(view, current)
    if not differences:
        against = " and baseline" if baseline is not None else ""
        return Outcome(f"inventory as expected{against}", evidence)
    problem = Problem(
        Severity.WARN,
        "inventory drifted: " + "; ".join(differences),
        Action.INVESTIGATE,
        Runbook.NODE_INVENTORY_DRIFT,
    )
    return Outcome("", evidence, (problem,))


# --- per GPU -----------------------------------------------------------------------------


def layout_text(profiles: tuple[str, ...] | list[str]) -> str:
    """A multiset of profiles, most specific first: "2x 1g.10gb, 3g.40gb"."""
    if not profiles:
        return "no GPU instances"
    counts = sorted(Counter(profiles).items())
    return ", ".join(name if n == 1 else f"{n}x {name}" for name, n in counts)


def check_mig_layout(gpu: GpuInventory, view: InventoryView, _checks: ChecksSection) -> Outcome:
    wanted = tuple(sorted(view.expected.mig_profiles_for(gpu.index)))
    evidence: Evidence = (
        ("mig_mode_current", gpu.mig_current),
        ("mig_instances", None if gpu.mig_instances is None else ",".join(gpu.mig_instances)),
        ("mig_profiles_expected", ",".join(wanted) or None),
    )
    # MIG off (or not supported): no instances to judge; the mode is the mig check's.
    if gpu.mig_current is not True:
        return Outcome("MIG mode off: no GPU instances", evidence)
    if gpu.mig_instances is None:
        return Outcome("MIG GPU instances not reported", evidence)
    have = layout_text(gpu.mig_instances)
    if not wanted:
        return Outcome(f"MIG layout {have}", evidence)
    if Counter(gpu.mig_instances) == Counter(wanted):
        return Outcome(f"MIG layout {have}, as expected", evidence)
    missing = Counter(wanted) - Counter(gpu.mig_instances)
    extra = Counter(gpu.mig_instances) - Counter(wanted)
    parts = [
        f"{label} {layout_text(tuple(diff.elements()))}"
        for label, diff in (("missing", missing), ("unexpected", extra))
        if diff
    ]
    problem = Problem(
        Severity.WARN,
        f"MIG layout {have}, expected {layout_text(wanted)} ({'; '.join(parts)})",
        Action.SET_MIG_LAYOUT,
        Runbook.GPU_MIG_LAYOUT,
    )
    return Outcome("", evidence, (problem,))
