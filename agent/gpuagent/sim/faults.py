"""Fault kinds: what parameters each takes, how they are checked, what each does to a GPU.

Scenario files and `SimulatedNode.inject` share this table, so a fault means the same
thing whether it is scheduled or injected by a test. Faults are checked against the GPU
model: one the model cannot have (a retired page on a GPU that remaps rows instead, an
ECC error on a GPU without ECC) is refused. Application runs under the node lock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from gpuagent.inventory.model import FABRIC_MANAGER, IMEX
from gpuagent.model import FABRIC_CONDITIONS
from gpuagent.sim import codes, hardware
from gpuagent.sim.codes import RECOVERY_ACTION_CODES
from gpuagent.sim.events import OPERATIONAL_EVENT
from gpuagent.sim.gpu import C2C_COUNTERS, SimGpu, SimProcess, make_instances
from gpuagent.sim.infiniband import DOWN_STATES, ERROR_COUNTERS
from gpuagent.sim.profiles import GpuProfile

ParamValue = int | float | bool | str | tuple[str, ...]
Params = Mapping[str, ParamValue]
# (NVML event type, event data) pairs a fault raises on its GPU.
Events = tuple[tuple[int, int], ...]

THROTTLE_REASONS: dict[str, int] = {
    "gpu_idle": codes.REASON_GPU_IDLE,
    "applications_clocks": codes.REASON_APPLICATIONS_CLOCKS,
    "sw_power_cap": codes.REASON_SW_POWER_CAP,
    "hw_slowdown": codes.REASON_HW_SLOWDOWN,
    "sync_boost": codes.REASON_SYNC_BOOST,
    "sw_thermal": codes.REASON_SW_THERMAL,
    "hw_thermal": codes.REASON_HW_THERMAL,
    "power_brake": codes.REASON_POWER_BRAKE,
}


class FaultError(ValueError):
    """An invalid fault: ``key`` is the offending parameter (or "kind")."""

    def __init__(self, message: str, *, key: str) -> None:
        self.key = key
        self.problem = message
        super().__init__(f"{key}: {message}")


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    type: Literal["int", "number", "bool", "str", "names"]
    required: bool = False
    # None on an optional parameter: the default depends on the GPU model (`pcie_degrade`).
    default: ParamValue | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[int | str, ...] = ()


Apply = Callable[[SimGpu, Params, float], Events]


@dataclass(frozen=True, slots=True)
class FaultKind:
    name: str
    params: tuple[Param, ...]
    apply: Apply


# --- what each kind does ---------------------------------------------------------------


def _setting(attribute: str, *, to: bool) -> Apply:
    """A fault that only sets one flag of the GPU."""

    def apply(gpu: SimGpu, _params: Params, _at: float) -> Events:
        setattr(gpu, attribute, to)
        return ()

    return apply


def _ecc_sbe(gpu: SimGpu, params: Params, _at: float) -> Events:
    count = _int(params["count"])
    gpu.ecc_sbe_volatile += count
    gpu.ecc_sbe_aggregate += count
    return ((codes.EVENT_SINGLE_BIT_ECC, 0),)


def _ecc_dbe(gpu: SimGpu, params: Params, _at: float) -> Events:
    count = _int(params["count"])
    gpu.ecc_dbe_volatile += count
    gpu.ecc_dbe_aggregate += count
    return ((codes.EVENT_DOUBLE_BIT_ECC, 0),)


def _retired_pages(gpu: SimGpu, params: Params, _at: float) -> Events:
    count = _int(params["count"])
    if params["cause"] == "sbe":
        gpu.retired_sbe += count
    else:
        gpu.retired_dbe += count
    if params["pending"]:
        gpu.retired_pending = True
    return ()


def _row_remap_pending(gpu: SimGpu, params: Params, _at: float) -> Events:
    # An uncorrectable error remapped a row; the remap takes effect at the next reset.
    gpu.remapped_uncorrectable += _int(params["rows"])
    gpu.remap_pending = True
    return ()


def _row_remap_failure(gpu: SimGpu, _params: Params, _at: float) -> Events:
    gpu.remap_failure = True
    # A failed remap means a bank ran out of spare rows: one bank moves to "none".
    if gpu.remap_histogram[0] > 0:
        gpu.remap_histogram[0] -= 1
        gpu.remap_histogram[4] += 1
    return ()


def _temperature(gpu: SimGpu, params: Params, _at: float) -> Events:
    gpu.temperature_override = float(_number(params["celsius"]))
    return ()


def _throttle(gpu: SimGpu, params: Params, _at: float) -> Events:
    mask = 0
    for name in _names(params["reasons"]):
        mask |= THROTTLE_REASONS[name]
    gpu.throttle_reasons = mask
    return ()


def _pcie_degrade(gpu: SimGpu, params: Params, _at: float) -> Events:
    gpu.pcie_generation_limit = _int(params["gen"])
    gpu.pcie_width = _int(params["width"])
    return ()


def _pcie_replay(gpu: SimGpu, params: Params, _at: float) -> Events:
    gpu.pcie_replays += _int(params["count"])
    return ()


def _pci_remove(gpu: SimGpu, _params: Params, _at: float) -> Events:
    # Off the bus, NVML loses the GPU too (it still counts it, as after gpu_lost).
    gpu.lost = True
    gpu.on_pci_bus = False
    return ()


def _nvml_hang(gpu: SimGpu, params: Params, at: float) -> Events:
    # The window starts when the fault was due, even if it is applied a little later.
    gpu.hang_until = max(gpu.hang_until, at + _number(params["seconds"]))
    return ()


def _nvlink_down(gpu: SimGpu, params: Params, _at: float) -> Events:
    gpu.nvlink_up[_int(params["link"])] = False
    return ()


def _nvlink_errors(gpu: SimGpu, params: Params, _at: float) -> Events:
    link = _int(params["link"])
    gpu.nvlink_crc_flit[link] += _int(params["crc_flit"])
    gpu.nvlink_crc_data[link] += _int(params["crc_data"])
    gpu.nvlink_replay[link] += _int(params["replay"])
    gpu.nvlink_recovery[link] += _int(params["recovery"])
    return ()


def _nvlink_ber(gpu: SimGpu, params: Params, _at: float) -> Events:
    link = _int(params["link"])
    gpu.nvlink_effective_ber[link] = _number(params["effective_ber"])
    gpu.nvlink_symbol_ber[link] = _number(params["symbol_ber"])
    return ()


def _c2c_errors(gpu: SimGpu, params: Params, _at: float) -> Events:
    gpu.c2c_errors[str(params["counter"])][_int(params["link"])] += _int(params["count"])
    return ()


def _process(gpu: SimGpu, params: Params, _at: float) -> Events:
    pid = _int(params["pid"])
    used = int(_number(params["used_mib"]) * hardware.MIB)
    gpu.processes[pid] = SimProcess(
        pid=pid,
        name=str(params["name"]),
        used_bytes=used,
        uid=_int(params["uid"]),
        job=_int(params["job"]),
    )
    return ()


def _process_exit(gpu: SimGpu, params: Params, _at: float) -> Events:
    gpu.processes.pop(_int(params["pid"]), None)
    return ()


def _process_gone(gpu: SimGpu, params: Params, _at: float) -> Events:
    # The PID leaves the process table; NVML goes on listing it with its memory.
    process = gpu.processes.get(_int(params["pid"]))
    if process is not None:
        process.alive = False
    return ()


def _hung(gpu: SimGpu, params: Params, _at: float) -> Events:
    process = gpu.processes.get(_int(params["pid"]))
    if process is not None:
        process.hung = True
    return ()


def _memory_leak(gpu: SimGpu, params: Params, _at: float) -> Events:
    gpu.leaked_bytes += int(_number(params["used_mib"]) * hardware.MIB)
    return ()


def _xid(_gpu: SimGpu, params: Params, _at: float) -> Events:
    return ((codes.EVENT_XID, _int(params["xid"])),)


def _operational_event(_gpu: SimGpu, params: Params, _at: float) -> Events:
    return ((OPERATIONAL_EVENT, _int(params["xid"])),)


def _ecc_mode(gpu: SimGpu, params: Params, _at: float) -> Events:
    # `nvidia-smi -e`: the new mode is pending until the next reset.
    gpu.ecc_pending = bool(params["enabled"])
    return ()


def _mig_mode(gpu: SimGpu, params: Params, _at: float) -> Events:
    gpu.mig_pending = bool(params["enabled"])
    return ()


def _mig_instances(gpu: SimGpu, params: Params, _at: float) -> Events:
    # `nvidia-smi mig -dgi` / `-cgi`: the GPU's instances become exactly these (MIG mode on).
    if gpu.mig_mode:
        gpu.mig_instances = make_instances(gpu.profile, _names(params["profiles"]))
    return ()


def _power_limit(gpu: SimGpu, params: Params, _at: float) -> Events:
    gpu.set_power_limit(round(_number(params["watts"]) * 1000))
    return ()


def _app_clocks(gpu: SimGpu, params: Params, _at: float) -> Events:
    gpu.applications_clock_mhz = _int(params["mhz"])
    return ()


def _fabric(gpu: SimGpu, params: Params, _at: float) -> Events:
    gpu.fabric_state = codes.FABRIC_STATES[str(params["state"])]
    gpu.fabric_status = codes.SUCCESS if params["ok"] else codes.ERROR_UNKNOWN
    return ()


def _fabric_health(gpu: SimGpu, params: Params, _at: float) -> Events:
    # The fabric reports every condition from then on; those named are true.
    if gpu.fabric_state == codes.FABRIC_STATE_NOT_SUPPORTED:
        gpu.fabric_state = codes.FABRIC_STATES["completed"]
    named = set(_names(params["bits"]))
    gpu.fabric_health = {name: name in named for name in FABRIC_CONDITIONS}
    return ()


def _ib_port_down(gpu: SimGpu, params: Params, _at: float) -> Events:
    gpu.hca.port_down(str(params["state"]))
    return ()


def _ib_rate(gpu: SimGpu, params: Params, _at: float) -> Events:
    gpu.hca.rate_gbps = _number(params["gbps"])
    return ()


def _ib_errors(gpu: SimGpu, params: Params, _at: float) -> Events:
    gpu.hca.counters[str(params["counter"])] += _int(params["count"])
    return ()


def _fabric_manager(gpu: SimGpu, params: Params, _at: float) -> Events:
    # Node-wide (a systemd unit), kept on this GPU until `clear` here.
    gpu.service_faults[str(params["service"])] = str(params["state"])
    return ()


def _recovery_action(gpu: SimGpu, params: Params, _at: float) -> Events:
    # The driver asks for this until it is done (a reset for the reset kinds; `clear`,
    # standing for a reboot, for every kind).
    gpu.recovery_action = RECOVERY_ACTION_CODES[str(params["action"])]
    return ((codes.EVENT_GPU_RECOVERY_ACTION, gpu.recovery_action),)


def _repair_pending(gpu: SimGpu, params: Params, _at: float) -> Events:
    channel, tpc = gpu.repair_pending or (False, False)
    gpu.repair_pending = (True, tpc) if params["unit"] == "channel" else (channel, True)
    return ()


def _clear(gpu: SimGpu, _params: Params, _at: float) -> Events:
    gpu.clear()
    return ()


_COUNT = Param("count", "int", default=1, minimum=1)
_PID = Param("pid", "int", required=True, minimum=1, maximum=2**32 - 1)
_LINK = Param("link", "int", required=True, minimum=0, maximum=hardware.MAX_NVLINKS - 1)
_ERRORS = tuple(Param(n, "int", default=0, minimum=0) for n in ("crc_flit", "crc_data"))
_MORE_ERRORS = tuple(Param(n, "int", default=0, minimum=0) for n in ("replay", "recovery"))

KINDS: dict[str, FaultKind] = {
    k.name: k
    for k in (
        FaultKind("ecc_sbe", (_COUNT,), _ecc_sbe),
        FaultKind("ecc_dbe", (_COUNT,), _ecc_dbe),
        FaultKind(
            "retired_pages",
            (
                _COUNT,
                Param("pending", "bool", default=False),
                Param("cause", "str", default="dbe", choices=("sbe", "dbe")),
            ),
            _retired_pages,
        ),
        FaultKind(
            "row_remap_pending", (Param("rows", "int", default=1, minimum=1),), _row_remap_pending
        ),
        FaultKind("row_remap_failure", (), _row_remap_failure),
        FaultKind(
            "temperature",
            (Param("celsius", "number", required=True, minimum=0, maximum=130),),
            _temperature,
        ),
        FaultKind(
            "throttle",
            (Param("reasons", "names", required=True, choices=tuple(THROTTLE_REASONS)),),
            _throttle,
        ),
        FaultKind(
            "pcie_degrade",
            (
                Param("gen", "int", minimum=1),
                Param("width", "int", choices=hardware.PCIE_WIDTHS),
            ),
            _pcie_degrade,
        ),
        FaultKind("pcie_replay", (_COUNT,), _pcie_replay),
        FaultKind("gpu_lost", (), _setting("lost", to=True)),
        FaultKind("pci_remove", (), _pci_remove),
        FaultKind(
            "nvml_hang",
            (Param("seconds", "number", required=True, minimum=0.001, maximum=3600),),
            _nvml_hang,
        ),
        FaultKind("persistence_off", (), _setting("persistence", to=False)),
        FaultKind(
            "recovery_action",
            (Param("action", "str", required=True, choices=tuple(RECOVERY_ACTION_CODES)),),
            _recovery_action,
        ),
        FaultKind(
            "repair_pending",
            (Param("unit", "str", default="channel", choices=("channel", "tpc")),),
            _repair_pending,
        ),
        FaultKind("unrepairable_memory", (), _setting("unrepairable_memory", to=True)),
        FaultKind("nvlink_down", (_LINK,), _nvlink_down),
        FaultKind("nvlink_errors", (_LINK, *_ERRORS, *_MORE_ERRORS), _nvlink_errors),
        # NVLink-C2C errors on a Grace-Blackwell GPU (profile c2c_links).
        FaultKind(
            "c2c_errors",
            (
                Param("count", "int", default=1, minimum=1),
                Param("counter", "str", default="crc", choices=C2C_COUNTERS),
                Param("link", "int", default=0, minimum=0, maximum=hardware.MAX_NVLINKS - 1),
            ),
            _c2c_errors,
        ),
        # The bit-error rates the link measures (NVML packs them as one significant digit).
        FaultKind(
            "nvlink_ber",
            (
                _LINK,
                Param("effective_ber", "number", required=True, minimum=0, maximum=1),
                Param("symbol_ber", "number", default=0.0, minimum=0, maximum=1),
            ),
            _nvlink_ber,
        ),
        FaultKind(
            "process",
            (
                _PID,
                Param("name", "str", required=True),
                Param("used_mib", "number", required=True, minimum=0),
                Param("uid", "int", default=0, minimum=0, maximum=2**32 - 2),
                # A Slurm job id: the process's cgroup is that job's step 0; 0: no job.
                Param("job", "int", default=0, minimum=0, maximum=2**32 - 1),
            ),
            _process,
        ),
        FaultKind("process_exit", (_PID,), _process_exit),
        FaultKind("process_gone", (_PID,), _process_gone),
        FaultKind("hung", (_PID,), _hung),
        FaultKind(
            "memory_leak",
            (Param("used_mib", "number", required=True, minimum=0),),
            _memory_leak,
        ),
        FaultKind("xid", (Param("xid", "int", required=True, minimum=1, maximum=999),), _xid),
        # A GPU operational event carrying that legacy Xid (drivers R615 and later).
        FaultKind(
            "operational_event",
            (Param("xid", "int", required=True, minimum=1, maximum=999),),
            _operational_event,
        ),
        FaultKind("ecc_mode", (Param("enabled", "bool", required=True),), _ecc_mode),
        FaultKind("mig_mode", (Param("enabled", "bool", required=True),), _mig_mode),
        FaultKind("mig_instances", (Param("profiles", "names", required=True),), _mig_instances),
        FaultKind("power_limit", (Param("watts", "number", required=True),), _power_limit),
        FaultKind("app_clocks", (Param("mhz", "int", required=True),), _app_clocks),
        FaultKind(
            "fabric",
            (
                Param("state", "str", required=True, choices=tuple(codes.FABRIC_STATES)),
                Param("ok", "bool", default=True),
            ),
            _fabric,
        ),
        FaultKind(
            "fabric_health",
            (Param("bits", "names", required=True, choices=FABRIC_CONDITIONS),),
            _fabric_health,
        ),
        # The HCA beside the GPU (node key ib_hcas): see gpuagent.sim.infiniband.
        FaultKind(
            "ib_port_down",
            (Param("state", "str", default="down", choices=tuple(DOWN_STATES)),),
            _ib_port_down,
        ),
        FaultKind(
            "ib_rate",
            (Param("gbps", "number", required=True, minimum=1, maximum=3200),),
            _ib_rate,
        ),
        FaultKind(
            "ib_errors",
            (
                Param("counter", "str", default="symbol_error", choices=ERROR_COUNTERS),
                Param("count", "int", default=100, minimum=1),
            ),
            _ib_errors,
        ),
        # A fabric daemon stopped, or restarting in a loop (systemd's NRestarts rising), or
        # (the IMEX daemon) running and not ready.
        FaultKind(
            "fabric_manager",
            (
                Param("state", "str", required=True, choices=("down", "flapping", "not_ready")),
                Param("service", "str", default=FABRIC_MANAGER, choices=(FABRIC_MANAGER, IMEX)),
            ),
            _fabric_manager,
        ),
        # Node-wide (the plugin's socket is gone), kept on this GPU until `clear` here.
        FaultKind("device_plugin_down", (), _setting("device_plugin_down", to=True)),
        FaultKind("cdi_stale", (), _setting("in_cdi_spec", to=False)),
        FaultKind("clear", (), _clear),
    )
}


# --- validation --------------------------------------------------------------------------


def check_params(
    kind: str, given: Mapping[str, object], *, profile: GpuProfile, nvlinks: int
) -> dict[str, ParamValue]:
    """Validated parameters of a ``kind`` fault on a GPU of model ``profile`` with
    ``nvlinks`` links, defaults filled in; raises FaultError."""
    spec = KINDS.get(kind)
    if spec is None:
        raise FaultError(f"unknown fault kind {kind!r} (known: {', '.join(KINDS)})", key="kind")
    names = [p.name for p in spec.params]
    for key in given:
        if key not in names:
            known = ", ".join(names) if names else "none"
            raise FaultError(f"unknown key for fault kind {kind!r} (known: {known})", key=key)
    checked: dict[str, ParamValue] = {}
    for param in spec.params:
        if param.name in given:
            checked[param.name] = _check_value(param, given[param.name])
        elif param.required:
            raise FaultError(f"required by fault kind {kind!r}", key=param.name)
        elif param.default is not None:
            checked[param.name] = param.default
    missing = _MISSING_FEATURE.get(kind)
    if missing is not None and not missing[0](profile):
        raise FaultError(f"the {profile.name} {missing[1]}", key="kind")
    _check_for_model(kind, given, checked, profile, nvlinks)
    return checked


# Fault kinds a model can only have with a feature: (has it, what to say when it has not).
_MISSING_FEATURE: dict[str, tuple[Callable[[GpuProfile], bool], str]] = {
    "ecc_sbe": (lambda p: p.ecc, "has no ECC"),
    "ecc_dbe": (lambda p: p.ecc, "has no ECC"),
    "ecc_mode": (lambda p: p.ecc, "has no ECC"),
    "retired_pages": (
        lambda p: p.retired_pages,
        "does not retire pages (use row_remap_pending on GPUs that remap rows)",
    ),
    "row_remap_pending": (lambda p: p.row_remapping, "does not remap rows"),
    "row_remap_failure": (lambda p: p.row_remapping, "does not remap rows"),
    "mig_mode": (lambda p: p.mig, "has no MIG"),
    "mig_instances": (lambda p: p.mig, "has no MIG"),
    "app_clocks": (
        lambda p: p.applications_clock_mhz is not None,
        "has no applications clocks",
    ),
    "fabric": (lambda p: p.fabric, "is not in an NVSwitch fabric"),
    "fabric_health": (lambda p: p.fabric, "is not in an NVSwitch fabric"),
    "c2c_errors": (lambda p: p.c2c_links > 0, "has no NVLink-C2C (Grace-Blackwell only)"),
}


def _check_for_model(
    kind: str,
    given: Mapping[str, object],
    checked: dict[str, ParamValue],
    profile: GpuProfile,
    nvlinks: int,
) -> None:
    """Rules about parameters together, or about the GPU model they apply to; fills in the
    defaults that depend on the model."""
    if kind == "pcie_degrade":
        if not given:
            raise FaultError("give gen, width or both", key="gen")
        checked.setdefault("gen", profile.pcie_max_generation)
        checked.setdefault("width", profile.pcie_max_width)
        _within(checked, "gen", 1, profile.pcie_max_generation)
        _within(checked, "width", 1, profile.pcie_max_width)
    elif kind == "mig_instances":
        problem = profile.mig_layout_problem(_names(checked["profiles"]))
        if problem is not None:
            raise FaultError(problem, key="profiles")
    elif kind in ("process", "memory_leak"):
        usable = profile.memory_total_mib - profile.memory_reserved_mib
        _within(checked, "used_mib", 0, usable)
    elif kind == "power_limit":
        _within(checked, "watts", profile.power_min_limit_w, profile.power_max_limit_w)
    elif kind == "app_clocks":
        _within(checked, "mhz", profile.sm_clock_idle_mhz, profile.sm_clock_max_mhz)
    elif (
        kind == "fabric_manager" and checked["state"] == "not_ready" and checked["service"] != IMEX
    ):
        raise FaultError(f"only {IMEX} says whether it is ready", key="state")
    _check_link(kind, checked, profile, nvlinks)


def _check_link(
    kind: str, checked: Mapping[str, ParamValue], profile: GpuProfile, nvlinks: int
) -> None:
    """A link index names an NVLink the GPU has (a C2C link, for `c2c_errors`)."""
    if "link" not in checked:
        return
    if kind == "c2c_errors":
        if _int(checked["link"]) >= profile.c2c_links:
            raise FaultError(f"no such C2C link: this GPU has {profile.c2c_links}", key="link")
    elif _int(checked["link"]) >= nvlinks:
        raise FaultError(f"no such NVLink: this GPU has {nvlinks} links", key="link")


def _within(checked: Mapping[str, ParamValue], name: str, low: float, high: float) -> None:
    value = _number(checked[name])
    if value < low:
        raise FaultError(f"must be at least {low:g} on this GPU model", key=name)
    if value > high:
        raise FaultError(f"must be at most {high:g} on this GPU model", key=name)


def _check_value(param: Param, value: object) -> ParamValue:
    converted = _CONVERTERS[param.type](value)
    if converted is None:
        expected = _EXPECTED[param.type]
        shown = f"{type(value).__name__} {value!r}"
        raise FaultError(f"expected {expected}, got {shown}", key=param.name)
    if isinstance(converted, tuple):
        unknown = [name for name in converted if param.choices and name not in param.choices]
        if unknown:
            known = ", ".join(str(c) for c in param.choices)
            raise FaultError(f"unknown {unknown[0]!r} (known: {known})", key=param.name)
        return converted
    if param.choices and converted not in param.choices:
        choices = ", ".join(repr(c) for c in param.choices)
        raise FaultError(f"expected one of {choices}, got {converted!r}", key=param.name)
    if isinstance(converted, int | float) and not isinstance(converted, bool):
        if param.minimum is not None and converted < param.minimum:
            raise FaultError(f"must be at least {param.minimum:g}", key=param.name)
        if param.maximum is not None and converted > param.maximum:
            raise FaultError(f"must be at most {param.maximum:g}", key=param.name)
    return converted


def _as_bool(value: object) -> ParamValue | None:
    return value if isinstance(value, bool) else None


def _as_str(value: object) -> ParamValue | None:
    return value if isinstance(value, str) and value else None


def _as_names(value: object) -> ParamValue | None:
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(str(v) for v in value)
    return None


def _as_int(value: object) -> ParamValue | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _as_number(value: object) -> ParamValue | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


_CONVERTERS: dict[str, Callable[[object], ParamValue | None]] = {
    "bool": _as_bool,
    "str": _as_str,
    "names": _as_names,
    "int": _as_int,
    "number": _as_number,
}
_EXPECTED = {
    "bool": "true or false",
    "str": "a non-empty string",
    "names": "a list of strings",
    "int": "an integer",
    "number": "a number",
}


def _int(value: ParamValue) -> int:
    assert isinstance(value, int)
    return value


def _number(value: ParamValue) -> float:
    assert isinstance(value, int | float)
    return float(value)


def _names(value: ParamValue) -> tuple[str, ...]:
    assert isinstance(value, tuple)
    return value
