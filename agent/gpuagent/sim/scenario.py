"""Scenario files: the simulated node and the faults to apply to it, as TOML.

Validation matches the agent configuration: unknown keys and wrong types are rejected with
a `ConfigError` naming the dotted key (``fault[2].kind``, faults counted from 0) and line.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpuagent.config import ConfigError, build_dataclass, find_line, parse_toml, read_text
from gpuagent.inventory.model import ServiceState
from gpuagent.sim import hardware
from gpuagent.sim.faults import FaultError, ParamValue, check_params

InitError = Literal[
    "driver_not_loaded",
    "library_not_found",
    "version_mismatch",
    "no_permission",
    "timeout",
    "other",
]
INIT_ERRORS: tuple[InitError, ...] = typing.get_args(InitError)

_NAME_BUFFER = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE, with its terminating NUL
_VERSION_BUFFER = 80  # NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
_DRIVER_VERSION_RE = re.compile(r"^\d{3}\.\d{2,3}(\.\d{2,3})?$")


@dataclass(frozen=True)
class NodeSpec:
    gpus: int = 8
    model: str = "NVIDIA H100 80GB HBM3"
    driver_version: str = "550.54.15"
    cuda_driver_version: int = 12040
    nvml_version: str = ""  # empty: "<CUDA major>.<driver_version>", e.g. "12.550.54.15"
    init_error: InitError | None = None
    seed: int = 0
    nvlinks: int = hardware.MAX_NVLINKS
    mig_mode: bool = False
    # GPU instances on every GPU while MIG mode is on, by profile name ("1g.10gb").
    mig_profiles: list[str] = field(default_factory=list)
    ecc: bool = True
    persistence: bool = True
    vbios_version: str = hardware.VBIOS_VERSION
    # Empty: the driver version (GSP firmware ships with the driver); "none": no GSP.
    gsp_firmware_version: str = ""
    # The host side (sysfs, procfs, systemd), for the inventory.
    module_version: str = ""  # /sys/module/nvidia/version; empty: driver_version
    modules: list[str] = field(default_factory=lambda: ["nvidia", "nvidia_uvm", "nvidia_modeset"])
    pci_only_gpus: int = 0  # GPUs on the PCI bus that NVML does not list (probe failed)
    nvswitches: int = 0  # NVSwitch functions on the PCI bus
    fabric_state: Literal["not_supported", "not_started", "in_progress", "completed"] = (
        "not_supported"
    )
    persistenced: ServiceState = "active"
    fabricmanager: ServiceState = "not_installed"
    kernel_release: str = "6.1.0-18-amd64"
    os_release: str = "Debian GNU/Linux 12 (bookworm)"

    @property
    def resolved_nvml_version(self) -> str:
        return self.nvml_version or f"{self.cuda_driver_version // 1000}.{self.driver_version}"

    @property
    def resolved_module_version(self) -> str:
        return self.module_version or self.driver_version

    @property
    def resolved_gsp_firmware_version(self) -> str | None:
        if self.gsp_firmware_version == "none":
            return None
        return self.gsp_firmware_version or self.driver_version


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


def load_scenario(path: Path) -> Scenario:
    return parse_scenario(read_text(path))


def parse_scenario(text: str) -> Scenario:
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
    _check_node(node, text)
    fault_tables = data.get("fault", [])
    if not isinstance(fault_tables, list) or not all(isinstance(t, dict) for t in fault_tables):
        raise ConfigError("expected [[fault]] tables", key="fault", line=find_line(text, "fault"))
    faults = tuple(_parse_fault(i, t, node, text) for i, t in enumerate(fault_tables))
    return Scenario(node=node, faults=faults)


def check_node(node: NodeSpec) -> None:
    """Raise ConfigError (naming the ``node.`` key) when ``node`` cannot be simulated."""
    _check_node(node, "")


def _check_node(node: NodeSpec, text: str) -> None:
    layout_problem = hardware.mig_layout_problem(node.mig_profiles)
    problems = (
        ("gpus", not 1 <= node.gpus <= hardware.MAX_GPUS, f"must be 1..{hardware.MAX_GPUS}"),
        ("nvlinks", not 0 <= node.nvlinks <= hardware.MAX_NVLINKS,
         f"must be 0..{hardware.MAX_NVLINKS}"),
        ("model", not 0 < len(node.model.encode()) < _NAME_BUFFER,
         f"must be 1..{_NAME_BUFFER - 1} bytes"),
        ("driver_version", not _DRIVER_VERSION_RE.match(node.driver_version),
         'must look like "550.54.15"'),
        ("cuda_driver_version", not 1000 <= node.cuda_driver_version <= 99999,
         "must be CUDA's integer form, e.g. 12040 for 12.4"),
        ("nvml_version", len(node.nvml_version.encode()) >= _VERSION_BUFFER,
         f"must be under {_VERSION_BUFFER} bytes"),
        ("seed", node.seed < 0, "must not be negative"),
        ("module_version", bool(node.module_version)
         and not _DRIVER_VERSION_RE.match(node.module_version), 'must look like "550.54.15"'),
        ("pci_only_gpus", not 0 <= node.pci_only_gpus <= hardware.MAX_GPUS - node.gpus,
         f"must be 0..{hardware.MAX_GPUS} minus node.gpus"),
        ("nvswitches", not 0 <= node.nvswitches <= len(hardware.NVSWITCH_BUSES),
         f"must be 0..{len(hardware.NVSWITCH_BUSES)}"),
        ("mig_profiles", layout_problem is not None, layout_problem or ""),
    )  # fmt: skip
    for key, bad, message in problems:
        if bad:
            dotted = f"node.{key}"
            raise ConfigError(message, key=dotted, line=find_line(text, dotted) if text else None)


def _parse_fault(index: int, table: dict[str, Any], node: NodeSpec, text: str) -> Fault:
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
        params = check_params(kind, given, nvlinks=node.nvlinks)
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
