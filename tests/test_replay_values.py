"""A replayed capture shows what the capture prints and nothing else, value by value.

For every capture in tests/data/real-hosts, each GPU's values are read here from the
capture's own text, by a plain reader of this file (text by section path and key, XML by
element path; not the project's parser), and compared with what the replay shows: the
status document, else the snapshot's readings or identity, and for the few values the
agent does not carry (FB total, the graphics clock, the maximum graphics and memory
clocks, the fan) the simulated NVML itself. A value printed N/A, or not printed, must be
absent (None); a number must agree to the precision it is printed with.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuagent.model import GpuState
from gpuagent.sim import SimulatedNode, replay_scenario
from gpuagent.smi import load_capture
from gpuagent.statusview import status_document
from hardware_profiles_doc import CAPTURES, REAL_HOSTS, collect

_MIB = 1024 * 1024
_NUMBER = re.compile(r"[+-]?[0-9]+(?:\.([0-9]+))?")
# nvmlComputeMode_t as the agent names it ("Compute Mode : Exclusive_Process").
_COMPUTE_MODES = {"default", "exclusive_thread", "prohibited", "exclusive_process"}


# --- the capture, read plainly ---------------------------------------------------------------


class Printed:
    """One GPU's block: the value at each path of keys ("pci/gpu link info/link width/max"
    or "pci/pci_gpu_link_info/link_widths/max_link_width"), lower-cased; the first of a
    repeated path counts."""

    def __init__(self, values: dict[str, str]) -> None:
        self._values = values

    def has(self, path: str) -> bool:
        return path in self._values

    def first(self, *paths: str) -> str | None:
        """The value at the first of ``paths`` that is there (N/A included)."""
        return next((self._values[p] for p in paths if p in self._values), None)


def _text_gpus(text: str) -> list[Printed]:
    """`nvidia-smi -q`: a "GPU 0000..." line at the margin opens a block; below it each
    line's key sits under the nearest line indented less."""
    gpus: list[dict[str, str]] = []
    keys: list[tuple[int, str]] = []
    for line in text.splitlines():
        body = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if not body:
            continue
        if indent == 0:
            if re.fullmatch(r"GPU [0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]", body):
                gpus.append({})
            keys = []
            continue
        if not gpus:
            continue
        key, colon, value = body.partition(" : ")
        while keys and keys[-1][0] >= indent:
            keys.pop()
        keys.append((indent, key.strip().lower()))
        if colon:
            gpus[-1].setdefault("/".join(k for _, k in keys), value.strip())
    return [Printed(values) for values in gpus]


def _xml_gpus(text: str) -> list[Printed]:
    """`nvidia-smi -q -x`: every leaf element under a <gpu>, by its path of tags."""
    found = []
    for gpu in ET.fromstring(text).findall("gpu"):
        values: dict[str, str] = {}
        _leaves(gpu, "", values)
        found.append(Printed(values))
    return found


def _leaves(element: ET.Element, prefix: str, into: dict[str, str]) -> None:
    for child in element:
        path = f"{prefix}{child.tag.lower()}"
        if len(child):
            _leaves(child, path + "/", into)
        else:
            into.setdefault(path, (child.text or "").strip())


def printed_gpus(path: Path) -> tuple[str, list[Printed]]:
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("<"):
        return "xml", _xml_gpus(text)
    return "text", _text_gpus(text)


@dataclass(frozen=True)
class Number:
    value: float
    step: float  # the last printed digit's worth: 0.01 for "38.89 W", 1 for "596 MiB"


Value = Number | str | None


def number(printed: str | None) -> Number | None:
    """A printed number with its unit after it ("38.89 W", "16x", "P8"); None for N/A,
    a deprecation note or anything else."""
    if printed is None:
        return None
    match = _NUMBER.match(printed.removeprefix("P"))
    if match is None:
        return None
    decimals = len(match[1] or "")
    return Number(float(match[0]), 10.0**-decimals)


# Where each layout prints a value: (text path, XML path), one pair per layout.
Where = tuple[tuple[str, str], ...]
# The power block: "GPU Power Readings" since 535, "Power Readings" before; R610 nests the
# current, requested and default limits in "GPU Ceiling Power Limit" beneath it.
POWER_BLOCKS = (("gpu power readings", "gpu_power_readings"), ("power readings", "power_readings"))
CEILING = (
    "gpu power readings/gpu ceiling power limit",
    "gpu_power_readings/gpu_ceiling_power_limit",
)
# ECC counts as the project's model keeps them: the DRAM count where the driver splits SRAM
# and DRAM, else the Single Bit / Double Bit total; by corrected or not.
ECC_KEYS = {
    True: (("dram correctable", "dram_correctable"), ("single bit/total", "single_bit/total")),
    False: (
        ("dram uncorrectable", "dram_uncorrectable"),
        ("double bit/total", "double_bit/total"),
    ),
}


def _power(key: tuple[str, str], *, nested: bool = False) -> Where:
    """``key`` (text, XML) in the power block of any layout (and in R610's nested one)."""
    blocks = (*POWER_BLOCKS, CEILING) if nested else POWER_BLOCKS
    return tuple((f"{text}/{key[0]}", f"{xml}/{key[1]}") for text, xml in blocks)


class Reader:
    """The values of one GPU in one format."""

    def __init__(self, gpu: Printed, xml: bool) -> None:
        self.gpu = gpu
        self.xml = xml

    def paths(self, where: Where) -> tuple[str, ...]:
        return tuple(x if self.xml else t for t, x in where)

    def value(self, *where: tuple[str, str]) -> str | None:
        return self.gpu.first(*self.paths(where))

    def number(self, *where: tuple[str, str]) -> Number | None:
        return number(self.value(*where))

    def has(self, *where: tuple[str, str]) -> bool:
        return any(self.gpu.has(p) for p in self.paths(where))

    # --- values whose place depends on the layout ----------------------------------------

    def power_draw(self) -> Number | None:
        # The 1 s average where printed, else the instantaneous draw (GA100 and older).
        for key in (
            ("power draw", "power_draw"),
            ("average power draw", "average_power_draw"),
            ("instantaneous power draw", "instant_power_draw"),
        ):
            found = self.number(*_power(key))
            if found is not None:
                return found
        return None

    def current_limit(self) -> Number | None:
        # Since 535 "Current Power Limit"; before, "Enforced Power Limit", or the one limit.
        return self.number(
            *_power(("current power limit", "current_power_limit"), nested=True),
            *_power(("enforced power limit", "enforced_power_limit")),
            *_power(("power limit", "power_limit")),
        )

    def requested_limit(self) -> Number | None:
        requested = _power(("requested power limit", "requested_power_limit"), nested=True)
        if self.has(*requested):
            return self.number(*requested)
        # Before 535 "Power Limit" is the requested one, beside "Enforced Power Limit".
        if self.has(*_power(("enforced power limit", "enforced_power_limit"))):
            return self.number(*_power(("power limit", "power_limit")))
        return None

    def default_limit(self) -> Number | None:
        return self.number(*_power(("default power limit", "default_power_limit"), nested=True))

    def ecc(self, counter: str, corrected: bool) -> Number | None:
        dram, total = (
            (f"ecc errors/{counter}/{text}", f"ecc_errors/{counter}/{xml}")
            for text, xml in ECC_KEYS[corrected]
        )
        return self.number(dram) if self.has(dram) else self.number(total)

    def compute_mode(self) -> str | None:
        mode = self.value(("compute mode", "compute_mode"))
        folded = None if mode is None else mode.strip().lower()
        return folded if folded in _COMPUTE_MODES else None


@dataclass(frozen=True)
class Field:
    name: str
    printed: Callable[[Reader], Value]
    # Where the replay shows it: ("status", key), ("readings", attribute), ("identity",
    # attribute) or ("nvml", name of a reader in NVML_READERS); the first that is there.
    shown: tuple[tuple[str, str], ...]


def _num(*where: tuple[str, str]) -> Callable[[Reader], Value]:
    return lambda reader: reader.number(*where)


FIELDS = (
    Field(
        "temperature",
        _num(("temperature/gpu current temp", "temperature/gpu_temp")),
        (("status", "temperature_c"),),
    ),
    Field("power draw", Reader.power_draw, (("status", "power_w"),)),
    Field("current power limit", Reader.current_limit, (("status", "power_limit_w"),)),
    Field(
        "requested power limit",
        Reader.requested_limit,
        (("status", "power_requested_limit_w"), ("readings", "power_requested_limit_w")),
    ),
    Field("default power limit", Reader.default_limit, (("identity", "power_default_limit_w"),)),
    Field("FB total", _num(("fb memory usage/total", "fb_memory_usage/total")), (("nvml", "fb"),)),
    Field(
        "FB used",
        _num(("fb memory usage/used", "fb_memory_usage/used")),
        (("status", "fb_used_mib"),),
    ),
    Field(
        "FB free",
        _num(("fb memory usage/free", "fb_memory_usage/free")),
        (("readings", "fb_free_mib"),),
    ),
    Field(
        "FB reserved",
        _num(("fb memory usage/reserved", "fb_memory_usage/reserved")),
        (("readings", "fb_reserved_mib"),),
    ),
    Field(
        "PCIe generation",
        _num(
            (
                "pci/gpu link info/pcie generation/current",
                "pci/pci_gpu_link_info/pcie_gen/current_link_gen",
            )
        ),
        (("status", "pcie_generation"),),
    ),
    Field(
        "PCIe max generation",
        _num(
            (
                "pci/gpu link info/pcie generation/max",
                "pci/pci_gpu_link_info/pcie_gen/max_link_gen",
            )
        ),
        (("identity", "pcie_max_generation"),),
    ),
    Field(
        "PCIe width",
        _num(
            (
                "pci/gpu link info/link width/current",
                "pci/pci_gpu_link_info/link_widths/current_link_width",
            )
        ),
        (("status", "pcie_width"),),
    ),
    Field(
        "PCIe max width",
        _num(
            (
                "pci/gpu link info/link width/max",
                "pci/pci_gpu_link_info/link_widths/max_link_width",
            )
        ),
        (("identity", "pcie_max_width"),),
    ),
    Field("SM clock", _num(("clocks/sm", "clocks/sm_clock")), (("readings", "sm_clock_mhz"),)),
    Field(
        "graphics clock",
        _num(("clocks/graphics", "clocks/graphics_clock")),
        (("nvml", "graphics clock"),),
    ),
    Field(
        "memory clock",
        _num(("clocks/memory", "clocks/mem_clock")),
        (("readings", "memory_clock_mhz"),),
    ),
    Field(
        "max SM clock",
        _num(("max clocks/sm", "max_clocks/sm_clock")),
        (("identity", "sm_clock_max_mhz"),),
    ),
    Field(
        "max graphics clock",
        _num(("max clocks/graphics", "max_clocks/graphics_clock")),
        (("nvml", "max graphics clock"),),
    ),
    Field(
        "max memory clock",
        _num(("max clocks/memory", "max_clocks/mem_clock")),
        (("nvml", "max memory clock"),),
    ),
    Field(
        "ECC corrected volatile",
        lambda r: r.ecc("volatile", corrected=True),
        (("status", "ecc_sbe_volatile"),),
    ),
    Field(
        "ECC uncorrected volatile",
        lambda r: r.ecc("volatile", corrected=False),
        (("status", "ecc_dbe_volatile"),),
    ),
    Field(
        "ECC corrected aggregate",
        lambda r: r.ecc("aggregate", corrected=True),
        (("readings", "ecc_sbe_aggregate"),),
    ),
    Field(
        "ECC uncorrected aggregate",
        lambda r: r.ecc("aggregate", corrected=False),
        (("readings", "ecc_dbe_aggregate"),),
    ),
    Field(
        "retired pages SBE",
        _num(
            (
                "retired pages/single bit ecc",
                "retired_pages/multiple_single_bit_retirement/retired_count",
            )
        ),
        (("readings", "retired_pages_sbe"),),
    ),
    Field(
        "retired pages DBE",
        _num(("retired pages/double bit ecc", "retired_pages/double_bit_retirement/retired_count")),
        (("readings", "retired_pages_dbe"),),
    ),
    Field(
        "remapped rows correctable",
        _num(("remapped rows/correctable error", "remapped_rows/remapped_row_corr")),
        (("readings", "remapped_rows_correctable"),),
    ),
    Field(
        "remapped rows uncorrectable",
        _num(("remapped rows/uncorrectable error", "remapped_rows/remapped_row_unc")),
        (("readings", "remapped_rows_uncorrectable"),),
    ),
    Field(
        "GPU utilization",
        _num(("utilization/gpu", "utilization/gpu_util")),
        (("status", "utilization_gpu_pct"),),
    ),
    Field(
        "memory utilization",
        _num(("utilization/memory", "utilization/memory_util")),
        (("readings", "utilization_memory_pct"),),
    ),
    Field(
        "P-state",
        _num(("performance state", "performance_state")),
        (("status", "performance_state"),),
    ),
    Field("fan", _num(("fan speed", "fan_speed")), (("nvml", "fan"),)),
    Field(
        "compute mode",
        Reader.compute_mode,
        (("status", "compute_mode"), ("readings", "compute_mode")),
    ),
)


# --- what the replay shows -------------------------------------------------------------------


def _answer(call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except pynvml.NVMLError_NotSupported:
        return None


def _fb_total(handle: Any) -> float | None:
    # The v1 struct: drivers before R510 have no v2 (and print no Reserved).
    memory = _answer(pynvml.nvmlDeviceGetMemoryInfo, handle)
    return None if memory is None else memory.total / _MIB


NVML_READERS: dict[str, Callable[[Any], Any]] = {
    "fb": _fb_total,
    "graphics clock": lambda h: _answer(
        pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_GRAPHICS
    ),
    "max graphics clock": lambda h: _answer(
        pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_GRAPHICS
    ),
    "max memory clock": lambda h: _answer(
        pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM
    ),
    "fan": lambda h: _answer(pynvml.nvmlDeviceGetFanSpeed, h),
}


@contextmanager
def replayed_nvml(path: Path) -> Iterator[None]:
    """pynvml, initialised against the replayed capture."""
    with SimulatedNode(replay_scenario(load_capture(path))):
        pynvml.nvmlInit()
        try:
            yield
        finally:
            pynvml.nvmlShutdown()


class _Missing:
    """A place the agent does not have (yet): not the same as a value read as absent."""

    def __repr__(self) -> str:
        return "(not read by the agent)"


MISSING = _Missing()


def shown(field: Field, status: dict[str, Any], gpu: GpuState, index: int) -> tuple[Any, str]:
    """The value the replay shows for ``field``, and where it was found."""
    for source, name in field.shown:
        if source == "status" and name in status:
            return status[name], f"status {name}"
        if source == "readings" and hasattr(gpu.readings, name):
            return getattr(gpu.readings, name), f"readings.{name}"
        if source == "identity" and hasattr(gpu.identity, name):
            return getattr(gpu.identity, name), f"identity.{name}"
        if source == "nvml":
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            return NVML_READERS[name](handle), f"NVML {name}"
    return MISSING, " or ".join(f"{source} {name}" for source, name in field.shown)


def agrees(printed: Value, value: Any) -> bool:
    if printed is None or value is None:
        return printed is None and value is None
    if isinstance(printed, str):
        return isinstance(value, str) and value == printed
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    # The value the replay shows rounds to the one printed.
    return abs(value - printed.value) <= printed.step / 2 + 1e-9


@dataclass(frozen=True)
class Row:
    gpu: int
    field: str
    printed: Value
    shown: Any
    where: str

    @property
    def ok(self) -> bool:
        return agrees(self.printed, self.shown)

    def __str__(self) -> str:
        printed = self.printed.value if isinstance(self.printed, Number) else self.printed
        return (
            f"GPU {self.gpu} {self.field}: printed {printed!r}, shown {self.shown!r} ({self.where})"
        )


def _canonical(bus_id: str | None) -> str:
    """nvidia-smi's "00000000:0C:00.0" as the agent keys GPUs: "0000:0c:00.0"."""
    domain, _, rest = (bus_id or "").lower().partition(":")
    return f"{int(domain or '0', 16):04x}:{rest}"


def compare(path: Path) -> list[Row]:
    """Every value of every GPU of the capture: printed, and shown by the replay."""
    fmt, gpus = printed_gpus(path)
    snapshot = collect(path)
    document = status_document(snapshot)
    assert len(snapshot.gpus) == len(gpus), f"{path.name}: {len(snapshot.gpus)} GPUs replayed"
    rows = []
    with replayed_nvml(path):
        for index, (printed, gpu) in enumerate(zip(gpus, snapshot.gpus, strict=True)):
            assert gpu.readings is not None, f"{path.name}: GPU {index} gave no readings"
            reader = Reader(printed, fmt == "xml")
            bus_id = _canonical(reader.value(("pci/bus id", "pci/pci_bus_id")))
            assert bus_id == gpu.identity.pci_bus_id, f"{path.name}: GPU {index} is {bus_id}"
            status = document["gpus"][index]
            for field in FIELDS:
                value, where = shown(field, status, gpu, index)
                rows.append(Row(index, field.name, field.printed(reader), value, where))
    return rows


@pytest.mark.parametrize("path", CAPTURES, ids=[p.name for p in CAPTURES])
def test_the_replay_shows_every_value_as_printed(path: Path) -> None:
    rows = compare(path)
    wrong = [str(row) for row in rows if not row.ok]
    assert not wrong, f"{path.name}: {len(wrong)} of {len(rows)} values differ:\n" + "\n".join(
        wrong
    )


# The plain reader itself, on each layout: what `nvidia-smi -q` printed there.
READ_AS = [
    ("RTX2080S-idle.610.57.04.nvidia-smi-q.txt", "power draw", 38.89),  # instantaneous only
    ("RTX2080S-idle.610.57.04.nvidia-smi-q.txt", "current power limit", 250.0),  # nested
    ("RTX2080S-idle.610.57.04.nvidia-smi-q.txt", "FB used", 211.0),
    ("RTX2080S-idle.610.57.04.nvidia-smi-q.txt", "compute mode", "default"),
    ("RTX2080S-idle.610.57.04.nvidia-smi-q.txt", "ECC corrected volatile", None),
    ("T4-aws.595.91.07.nvidia-smi-q.xml", "power draw", 33.51),
    ("a10g.nvidia-smi-q.xml", "requested power limit", 300.0),  # <power_limit>
    ("a10g.nvidia-smi-q.xml", "ECC uncorrected aggregate", 0.0),
    ("a10.535.129.03.nvidia-smi-q.txt", "remapped rows uncorrectable", 4.0),
    ("h100-sxm-x8.535.161.08.nvidia-smi-q.txt", "PCIe max width", 16.0),
    ("titan-v.560.35.03.nvidia-smi-q.txt", "ECC corrected volatile", None),  # Single Bit N/A
    ("titan-v.560.35.03.nvidia-smi-q.txt", "P-state", 8.0),
]


@pytest.mark.parametrize(("name", "field", "expected"), READ_AS)
def test_the_plain_reader_reads_each_layout(
    name: str, field: str, expected: float | str | None
) -> None:
    fmt, gpus = printed_gpus(REAL_HOSTS / name)
    (spec,) = [f for f in FIELDS if f.name == field]
    value = spec.printed(Reader(gpus[0], fmt == "xml"))
    assert (value.value if isinstance(value, Number) else value) == expected
