"""Scenario files: the simulated node and the faults to apply to it, as TOML.

Validation matches the agent configuration: unknown keys and wrong types are rejected with
a `ConfigError` naming the dotted key (``fault[2].kind``, faults counted from 0) and line.
The node's GPU model (`[node] model`, a key or product name of `gpuagent.sim.catalog`)
decides what its GPUs report; node keys left out take the model's values.
"""

from __future__ import annotations

import math
import re
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpuagent.config import ConfigError, build_dataclass, find_line, parse_toml, read_text
from gpuagent.inventory.model import ServiceState
from gpuagent.model import NvmlInitProblem
from gpuagent.sim import catalog, hardware
from gpuagent.sim.faults import FaultError, ParamValue, check_params
from gpuagent.sim.profiles import GpuProfile
from gpuagent.sim.replay import profile_for

if TYPE_CHECKING:
    from gpuagent.smi import Capture

# The simulated nvmlInit failures: each one the problem gpuagent.nvml.errors classifies.
InitError = NvmlInitProblem
INIT_ERRORS: tuple[InitError, ...] = typing.get_args(InitError)
# nvmlComputeMode_t by name (codes.COMPUTE_MODES); "exclusive_thread" only older drivers had.
ComputeMode = Literal["default", "exclusive_process", "prohibited", "exclusive_thread"]

_VERSION_BUFFER = 80  # NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
_DRIVER_VERSION_RE = re.compile(r"^\d{3}\.\d{2,3}(\.\d{2,3})?$")
_CUDA_RE = re.compile(r"^(\d+)\.(\d+)")
_UUID_RE = re.compile(r"^[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$", re.IGNORECASE)
_CHASSIS_SERIAL_RE = re.compile(r"^[\x21-\x7e]*$")  # printable ASCII, no spaces
_CLIQUE_MAX = 2**32 - 1  # cliqueId is a c_uint32
_PLATFORM_INDEX_MAX = 255  # slotNumber, trayIndex, hostId are single bytes


@dataclass(frozen=True)
class NodeSpec:
    gpus: int = 8
    # A catalog key ("h100-sxm") or the product name NVML reports ("NVIDIA H100 80GB HBM3").
    model: str = catalog.DEFAULT.key
    driver_version: str = "550.54.15"
    cuda_driver_version: int = 12040
    nvml_version: str = ""  # empty: "<CUDA major>.<driver_version>", e.g. "12.550.54.15"
    init_error: InitError | None = None
    seed: int = 0
    # None: the model's, but none on a one-GPU node (see default_nvlinks).
    nvlinks: int | None = None
    mig_mode: bool = False
    # GPU instances on every GPU while MIG mode is on, by profile name ("1g.10gb").
    mig_profiles: list[str] = field(default_factory=list)
    ecc: bool | None = None  # None: the mode the model ships with
    persistence: bool = True
    compute_mode: ComputeMode = "default"
    vbios_version: str = ""  # empty: the model's
    # Empty: the driver version (GSP firmware ships with the driver) on models that run
    # GSP firmware, not supported on the others; "none": not supported (GSP off).
    gsp_firmware_version: str = ""
    # The host side (sysfs, procfs, systemd), for the inventory.
    module_version: str = ""  # /sys/module/nvidia/version; empty: driver_version
    modules: list[str] = field(default_factory=lambda: ["nvidia", "nvidia_uvm", "nvidia_modeset"])
    pci_only_gpus: int = 0  # GPUs on the PCI bus that NVML does not list (probe failed)
    nvswitches: int = 0  # NVSwitch functions on the PCI bus
    fabric_state: Literal["not_supported", "not_started", "in_progress", "completed"] = (
        "not_supported"
    )
    # How long before the simulation starts the node booted (the checks' post-boot grace
    # for NVLinks and the fabric counts from then); the default is well past any grace.
    uptime_seconds: float = 86400.0
    # The NVLink domain the fabric info names (models with a fabric): empty / None: the
    # model's (its capture's).
    fabric_cluster_uuid: str = ""
    fabric_clique_id: int | None = None
    # Where the GPUs sit, as nvmlDeviceGetPlatformInfo reports it (models that answer it):
    # the chassis serial and the slot, tray and host indices; each GPU's module id is its
    # index + 1. Left out: empty and 0, what a platform that does not say reports.
    chassis_serial: str = ""
    slot_number: int = 0
    tray_index: int = 0
    host_id: int = 0
    persistenced: ServiceState = "active"
    fabricmanager: ServiceState = "not_installed"
    imex: ServiceState = "not_installed"
    kernel_release: str = "6.1.0-18-amd64"
    # Kernels installed besides the running one (a kernel update awaiting its reboot), and
    # those of all installed kernels that have no nvidia module (DKMS did not build it).
    installed_kernels: list[str] = field(default_factory=list)
    kernels_without_module: list[str] = field(default_factory=list)
    os_release: str = "Debian GNU/Linux 12 (bookworm)"
    # RDMA: GPUs 0..ib_hcas-1 each have an HCA mlx5_<i> beside them (0: no RDMA devices),
    # with one port at this rate (Gb/s) and link layer ("Ethernet": RoCE).
    ib_hcas: int = 0
    ib_rate_gbps: float = 400.0
    ib_link_layer: Literal["InfiniBand", "Ethernet"] = "InfiniBand"
    # The Kubernetes GPU stack (read only when the agent's checks.kubernetes applies): the
    # device plugin's socket, registered with kubelet; a CDI spec naming every GPU; the
    # NVIDIA container runtime.
    k8s_device_plugin: bool = True
    k8s_cdi_spec: bool = True
    k8s_runtime: bool = True
    # An `nvidia-smi -q` (or `-q -x`) capture to serve instead (relative to the scenario
    # file): the capture describes the node, so no other [node] key may be set with it
    # (but nvml_costs).
    nvidia_smi: str = ""
    # Charge every NVML call the CPU time it takes on a real GPU (gpuagent.sim.costs): for
    # benchmarks that predict a real node's cost. Off, calls answer in microseconds.
    nvml_costs: bool = False

    @property
    def resolved_nvml_version(self) -> str:
        return self.nvml_version or f"{self.cuda_driver_version // 1000}.{self.driver_version}"

    @property
    def resolved_module_version(self) -> str:
        return self.module_version or self.driver_version

    @property
    def driver_major(self) -> int:
        return int(self.driver_version.split(".", 1)[0])


@dataclass(frozen=True)
class NodeHardware:
    """What the node's GPUs are: the model, and the node keys resolved against it."""

    profile: GpuProfile
    name: str  # what nvmlDeviceGetName returns
    nvlinks: int
    ecc: bool
    vbios_version: str
    gsp_firmware_version: str | None  # None: not supported
    fabric_cluster_uuid: str  # canonical lower-case "8-4-4-4-12"
    fabric_clique_id: int


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` applied to GPU ``gpu`` at ``at`` seconds after the node starts."""

    kind: str
    gpu: int
    at: float = 0.0
    params: tuple[tuple[str, ParamValue], ...] = ()

    def param_dict(self) -> dict[str, ParamValue]:
        return dict(self.params)


@dataclass(frozen=True)
class Scenario:
    node: NodeSpec = field(default_factory=NodeSpec)
    faults: tuple[Fault, ...] = ()
    # A GPU model built in code (for example from a capture): used instead of node.model.
    profile: GpuProfile | None = None
    # A captured host to serve (see gpuagent.sim.replay): its GPUs, values and N/As.
    capture: Capture | None = None


def replay_scenario(
    capture: Capture, faults: tuple[Fault, ...] = (), *, source: str = ""
) -> Scenario:
    """The scenario that serves ``capture``'s host (read from ``source``), with ``faults``."""
    first = capture.gpus[0]
    profile = profile_for(first)
    found = catalog.find_profile(first.product_name)
    node = NodeSpec(
        gpus=len(capture.gpus),
        model=(found[0] if found else catalog.DEFAULT).key,
        driver_version=capture.driver_version,
        cuda_driver_version=_cuda_version(capture.cuda_version),
        nvlinks=0,
        ecc=bool(first.ecc_current) if first.ecc_current is not None else None,
        persistence=bool(first.persistence_mode),
        vbios_version=first.vbios_version or "",
        gsp_firmware_version=first.gsp_firmware_version or "none",
        fabric_state="not_supported",
        nvidia_smi=source,
    )
    return Scenario(node=node, faults=faults, profile=profile, capture=capture)


def _cuda_version(text: str | None) -> int:
    """CUDA's integer form ("12.2" → 12020); a capture without one gets 12.0."""
    match = _CUDA_RE.match(text or "")
    return int(match[1]) * 1000 + int(match[2]) * 10 if match else 12000


def node_hardware(scenario: Scenario) -> NodeHardware:
    """The scenario's GPU model and node keys resolved against it; ConfigError naming
    ``node.model`` for a model the catalog does not know."""
    return _hardware(scenario.node, scenario.profile, "")


def _hardware(node: NodeSpec, profile: GpuProfile | None, text: str) -> NodeHardware:
    if profile is None:
        found = catalog.find_profile(node.model)
        if found is None:
            raise ConfigError(
                f"unknown GPU model {node.model!r} (known: {', '.join(catalog.KEYS)}, or a"
                " model's product name)",
                key="node.model",
                line=find_line(text, "node.model") if text else None,
            )
        profile, name = found
    else:
        name = profile.name
    if node.gsp_firmware_version == "none":
        gsp: str | None = None
    elif node.gsp_firmware_version:
        gsp = node.gsp_firmware_version
    else:
        gsp = node.driver_version if profile.gsp_firmware else None
    return NodeHardware(
        profile=profile,
        name=name,
        nvlinks=default_nvlinks(profile, node.gpus) if node.nvlinks is None else node.nvlinks,
        ecc=profile.ecc_default if node.ecc is None else node.ecc,
        vbios_version=node.vbios_version or profile.vbios_version,
        gsp_firmware_version=gsp,
        fabric_cluster_uuid=(node.fabric_cluster_uuid or profile.fabric_cluster_uuid).lower(),
        fabric_clique_id=(
            profile.fabric_clique_id if node.fabric_clique_id is None else node.fabric_clique_id
        ),
    )


def default_nvlinks(profile: GpuProfile, gpus: int) -> int:
    """The NVLinks each GPU of a ``gpus``-GPU node of this model has when the scenario
    does not say: the model's (its baseboard's, 18 on HGX), but none for a single GPU. A
    lone SXM GPU is one passed through to a virtual machine, as the live H200 and H100
    runs were: its links lead nowhere and NVML answers NvLinkState NOT_SUPPORTED."""
    return profile.nvlinks if gpus > 1 else 0


def load_scenario(path: Path) -> Scenario:
    return parse_scenario(read_text(path), base=path.parent)


def parse_scenario(text: str, base: Path | None = None) -> Scenario:
    """A scenario from its TOML; ``base`` is where a relative `node.nvidia_smi` is found
    (the scenario file's directory; else the working directory)."""
    data = parse_toml(text)
    for key in data:
        if key not in ("node", "fault"):
            raise ConfigError(
                "unknown key (known here: fault, node)", key=key, line=find_line(text, key)
            )
    node_table = data.get("node", {})
    if not isinstance(node_table, dict):
        raise ConfigError("expected a table", key="node", line=find_line(text, "node"))
    node = build_dataclass(NodeSpec, node_table, text, prefix="node.")
    scenario = Scenario(node=node)
    if node.nvidia_smi:
        scenario = _replayed(node_table, text, base or Path())
        scenario = replace(scenario, node=replace(scenario.node, nvml_costs=node.nvml_costs))
    node = scenario.node
    hardware_ = _hardware(node, scenario.profile, text)
    _check_node(node, hardware_, text)
    fault_tables = data.get("fault", [])
    if not isinstance(fault_tables, list) or not all(isinstance(t, dict) for t in fault_tables):
        raise ConfigError("expected [[fault]] tables", key="fault", line=find_line(text, "fault"))
    faults = tuple(_parse_fault(i, t, node, hardware_, text) for i, t in enumerate(fault_tables))
    for index, fault in enumerate(faults):
        if (problem := hca_problem(fault.kind, fault.gpu, node.ib_hcas)) is not None:
            raise ConfigError(
                problem, key=f"fault[{index}].gpu", line=_fault_line(text, index, "gpu")
            )
    return Scenario(node=node, faults=faults, profile=scenario.profile, capture=scenario.capture)


def _replayed(table: dict[str, Any], text: str, base: Path) -> Scenario:
    """`[node] nvidia_smi = FILE`: the node is the captured host, and nothing else."""
    others = sorted(key for key in table if key not in ("nvidia_smi", "nvml_costs"))
    if others:
        key = f"node.{others[0]}"
        raise ConfigError(
            "cannot be set with node.nvidia_smi: the capture describes the node",
            key=key,
            line=find_line(text, key),
        )
    path = base / str(table["nvidia_smi"])
    # The capture parsers only where a scenario replays one (the others never use them).
    from gpuagent.smi import CaptureError, load_capture  # noqa: PLC0415

    try:
        capture = load_capture(path)
    except CaptureError as exc:
        raise ConfigError(
            f"{path}: {exc}", key="node.nvidia_smi", line=find_line(text, "node.nvidia_smi")
        ) from None
    return replay_scenario(capture, source=str(path))


def check_node(scenario: Scenario) -> NodeHardware:
    """The node's hardware; ConfigError (naming the ``node.`` key) when the scenario's
    node cannot be simulated."""
    resolved = node_hardware(scenario)
    _check_node(scenario.node, resolved, "")
    return resolved


def _check_node(node: NodeSpec, resolved: NodeHardware, text: str) -> None:
    profile = resolved.profile
    most = profile.max_gpus
    problems = (
        ("gpus", not 1 <= node.gpus <= most,
         f"must be 1..{most} ({profile.key} layouts)"),
        ("nvlinks", not 0 <= resolved.nvlinks <= hardware.MAX_NVLINKS,
         f"must be 0..{hardware.MAX_NVLINKS}"),
        ("driver_version", not _DRIVER_VERSION_RE.match(node.driver_version),
         'must look like "550.54.15"'),
        ("cuda_driver_version", not 1000 <= node.cuda_driver_version <= 99999,
         "must be CUDA's integer form, e.g. 12040 for 12.4"),
        ("nvml_version", len(node.nvml_version.encode()) >= _VERSION_BUFFER,
         f"must be under {_VERSION_BUFFER} bytes"),
        ("seed", node.seed < 0, "must not be negative"),
        ("uptime_seconds", not 0 <= node.uptime_seconds < math.inf, "must not be negative"),
        ("module_version", bool(node.module_version)
         and not _DRIVER_VERSION_RE.match(node.module_version), 'must look like "550.54.15"'),
        ("pci_only_gpus", not 0 <= node.pci_only_gpus <= most - node.gpus,
         f"must be 0..{most} minus node.gpus"),
        ("nvswitches", not 0 <= node.nvswitches <= len(hardware.NVSWITCH_BUSES),
         f"must be 0..{len(hardware.NVSWITCH_BUSES)}"),
        ("nvswitches", node.nvswitches > 0 and profile.nvswitch_device_id is None,
         f"the {profile.name} is not on an NVSwitch baseboard"),
        ("ecc", resolved.ecc and not profile.ecc, f"the {profile.name} has no ECC"),
        ("mig_mode", node.mig_mode and not profile.mig, f"the {profile.name} has no MIG"),
        ("mig_profiles", (problem := profile.mig_layout_problem(node.mig_profiles)) is not None,
         problem or ""),
        ("fabric_state", node.fabric_state != "not_supported" and not profile.fabric,
         f"the {profile.name} is not in an NVSwitch fabric"),
        *_domain_problems(node, profile),
        *_platform_problems(node, profile),
        ("ib_hcas", not 0 <= node.ib_hcas <= node.gpus, "must be 0..node.gpus (one per GPU)"),
        ("ib_rate_gbps", not 0 < node.ib_rate_gbps <= 3200, "must be above 0, at most 3200"),
        ("kernels_without_module", not set(node.kernels_without_module)
         <= {node.kernel_release, *node.installed_kernels},
         "must name node.kernel_release or node.installed_kernels"),
    )  # fmt: skip
    for key, bad, message in problems:
        if bad:
            dotted = f"node.{key}"
            raise ConfigError(message, key=dotted, line=find_line(text, dotted) if text else None)


def _domain_problems(node: NodeSpec, profile: GpuProfile) -> tuple[tuple[str, bool, str], ...]:
    no_fabric = f"the {profile.name} is not in an NVSwitch fabric"
    return (
        ("fabric_cluster_uuid", bool(node.fabric_cluster_uuid)
         and not _UUID_RE.match(node.fabric_cluster_uuid),
         'must be a UUID like "a1b2c3d4-0000-4000-8000-00000000abcd"'),
        ("fabric_cluster_uuid", bool(node.fabric_cluster_uuid) and not profile.fabric, no_fabric),
        ("fabric_clique_id", node.fabric_clique_id is not None
         and not 0 <= node.fabric_clique_id <= _CLIQUE_MAX, f"must be 0..{_CLIQUE_MAX}"),
        ("fabric_clique_id", node.fabric_clique_id is not None and not profile.fabric,
         no_fabric),
    )  # fmt: skip


def _platform_problems(node: NodeSpec, profile: GpuProfile) -> tuple[tuple[str, bool, str], ...]:
    no_platform = f"the {profile.name} reports no platform info (chassis, slot, tray, host)"
    limit = hardware.CHASSIS_SERIAL_LEN
    indices = (("slot_number", node.slot_number), ("tray_index", node.tray_index),
               ("host_id", node.host_id))  # fmt: skip
    return (
        ("chassis_serial", len(node.chassis_serial) > limit
         or not _CHASSIS_SERIAL_RE.match(node.chassis_serial),
         f"must be at most {limit} printable ASCII characters, no spaces"),
        ("chassis_serial", bool(node.chassis_serial) and not profile.platform_info,
         no_platform),
        *((key, not 0 <= value <= _PLATFORM_INDEX_MAX, f"must be 0..{_PLATFORM_INDEX_MAX}")
          for key, value in indices),
        *((key, value != 0 and not profile.platform_info, no_platform)
          for key, value in indices),
    )  # fmt: skip


def hca_problem(kind: str, gpu: int, hcas: int) -> str | None:
    """Why an `ib_*` fault cannot hit GPU ``gpu``'s HCA (None: it can, or not such a fault)."""
    if not kind.startswith("ib_") or gpu < hcas:
        return None
    if hcas == 0:
        return "this node has no HCAs (node.ib_hcas = 0)"
    return f"GPU {gpu} has no HCA (node.ib_hcas = {hcas}: GPUs 0..{hcas - 1} have one)"


def _parse_fault(
    index: int, table: dict[str, Any], node: NodeSpec, resolved: NodeHardware, text: str
) -> Fault:
    prefix = f"fault[{index}]"

    def error(key: str, message: str) -> ConfigError:
        return ConfigError(message, key=f"{prefix}.{key}", line=_fault_line(text, index, key))

    kind = table.get("kind")
    if kind is None:
        raise error("kind", "required")
    if not isinstance(kind, str):
        raise error("kind", f"expected a string, got {type(kind).__name__} {kind!r}")
    gpu = table.get("gpu")
    if gpu is None:
        raise error("gpu", "required")
    if isinstance(gpu, bool) or not isinstance(gpu, int):
        raise error("gpu", f"expected an integer, got {type(gpu).__name__} {gpu!r}")
    if not 0 <= gpu < node.gpus:
        raise error("gpu", f"no such GPU: this node has {node.gpus} (0..{node.gpus - 1})")
    at = table.get("at", 0.0)
    if isinstance(at, bool) or not isinstance(at, int | float):
        raise error("at", f"expected a number, got {type(at).__name__} {at!r}")
    if at < 0:
        raise error("at", "must not be negative")
    given = {k: v for k, v in table.items() if k not in ("kind", "gpu", "at")}
    try:
        params = check_params(kind, given, profile=resolved.profile, nvlinks=resolved.nvlinks)
    except FaultError as exc:
        raise error(exc.key, exc.problem) from None
    return Fault(kind=kind, gpu=gpu, at=float(at), params=tuple(params.items()))


_ARRAY_HEADER_RE = re.compile(r"^\s*\[\[\s*fault\s*\]\]\s*(#.*)?$")
_ANY_HEADER_RE = re.compile(r"^\s*\[")


def _fault_line(text: str, index: int, key: str) -> int | None:
    """Line of ``key`` in the ``index``-th [[fault]] table, else the table's header line."""
    lines = text.splitlines()
    headers = [n for n, line in enumerate(lines) if _ARRAY_HEADER_RE.match(line)]
    if index >= len(headers):
        return find_line(text, "fault")
    start = headers[index]
    key_re = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
    for number in range(start + 1, len(lines)):
        if _ANY_HEADER_RE.match(lines[number]):
            break
        if key_re.match(lines[number]):
            return number + 1
    return start + 1
