"""NVIDIA's XID catalog: what each XID means and what to do about it.

The data is agent/gpuagent/data/xid_catalog.csv, built by scripts/build-xid-catalog from
the shared reference catalog (docs/kernel-log.md). It is read once, on first use, so
commands that never look an XID up never pay for it.
"""

from __future__ import annotations

import csv
import functools
import io
import re
from dataclasses import dataclass
from importlib import resources
from typing import Final, Literal


@dataclass(frozen=True, slots=True)
class XidInfo:
    xid: int
    mnemonic: str
    description: str
    category: str  # application, memory, nvlink, bus, gsp, ...
    severity: str  # the catalog's grouping, e.g. "critical-gpu (GPU reset)"
    # NVIDIA's immediate action bucket: RESTART_APP, RESET_GPU, RESTART_BM, CONTACT_SUPPORT,
    # IGNORE, WORKFLOW_*, ...; "" where the catalog has none yet (XIDs 162-172).
    action: str
    investigatory_action: str
    app_error: bool  # NVIDIA's k8s-device-plugin treats it as the application's fault


# What each immediate action bucket asks of an operator, in a few words.
_ACTION_HINTS = {
    "RESTART_APP": "restart the application; the GPU stays usable",
    "RESET_GPU": "drain and reset the GPU",
    "RESTART_BM": "reboot the node",
    "RESTART_VM": "restart the VM",
    "CONTACT_SUPPORT": "contact NVIDIA support",
    "IGNORE": "no action needed",
    "CHECK_MECHANICALS": "check the board's power and cabling",
    "UPDATE_SWFW": "update the driver and firmware",
    "CHECK_UVM": "check the nvidia-uvm driver",
    "XID_154": "follow the recovery action the message names",
    "": "the catalog names no action yet",
}


def action_hint(action: str) -> str:
    """A few words on what an immediate action bucket asks for."""
    if action.startswith("WORKFLOW_"):
        return "follow NVIDIA's decode workflow for this XID"
    return _ACTION_HINTS.get(action, action.lower().replace("_", " "))


def _parse(text: str) -> dict[int, XidInfo]:
    # The generated file opens with a comment saying where it came from.
    body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
    catalog: dict[int, XidInfo] = {}
    for row in csv.DictReader(io.StringIO(body)):
        info = XidInfo(
            xid=int(row["xid"]),
            mnemonic=row["mnemonic"],
            description=row["description"],
            category=row["category"],
            severity=row["severity"],
            action=row["immediate_action"],
            investigatory_action=row["investigatory_action"],
            app_error=row["app_error"] == "yes",
        )
        catalog[info.xid] = info
    return catalog


@functools.cache
def _catalog() -> dict[int, XidInfo]:
    data = resources.files("gpuagent") / "data" / "xid_catalog.csv"
    return _parse(data.read_text(encoding="utf-8"))


# Case-sensitive but for the words NVIDIA has capitalised either way (a case-insensitive
# pattern costs three times as much, and storms search 100,000 lines).
_CAUSED_BY = re.compile(r"caused by [Pp]revious (?:Xid|XID|xid) (\d+)")


def caused_by(line: str) -> int | None:
    """The root XID a line names (newer drivers: `... caused by previous Xid 149`)."""
    if "caused by" not in line:  # cheap first: storms parse 100,000 of these
        return None
    found = _CAUSED_BY.search(line)
    return int(found[1]) if found else None


def lookup(xid: int) -> XidInfo | None:
    """What the catalog says about ``xid``; None for an XID it does not list."""
    return _catalog().get(xid)


def all_xids() -> tuple[XidInfo, ...]:
    """Every catalogued XID, in numeric order."""
    return tuple(sorted(_catalog().values(), key=lambda info: info.xid))


# --- Xid 74: the NVLink error's register dump -------------------------------------------------

# What NVIDIA's catalog says the set bits of an Xid 74 mean: its WORKFLOW_NVLINK_ERR
# resolution (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, the text
# as NVIDIA quotes it in https://github.com/NVIDIA/NVSentinel/issues/364). The line carries
# seven fields; "the first, third, fourth and fifth registers are valid for Hopper-based
# products", so only those are read, and only on Hopper GPUs: the catalog documents no
# other generation's layout, and no bit is guessed. "If bits other than those specifically
# outlined below are seen, please report a bug": any other set bit of those registers is
# "undocumented". Registers are counted from 1, as the catalog counts them.
NvlinkErrorClass = Literal[
    "sympathetic",  # generally secondary: the peer GPU or NVSwitch failed, this GPU saw it
    "ecc_parity",  # likely a hardware ECC/parity fault; report it past 2 on the same link
    "ecc_threshold",  # an ECC error threshold exceeded, nothing uncorrectable: keep running
    "hardware",  # possibly hardware: check and reseat the link's connections, run diagnostics
    "signal_integrity",  # a marginal channel: check the connections, run field diagnostics
    "report_if_repeated",  # report it (after field diagnostics, for some) if it repeats
    "unexpected",  # "not expected to be seen in production": report it
    "undocumented",  # a bit the catalog does not list: report it
]
_IGNORED: Final = None  # "can be safely ignored"
_XID74_BITS: Final[dict[int, dict[int, NvlinkErrorClass | None]]] = {
    1: {
        **dict.fromkeys((0, 23, 30), _IGNORED),
        **dict.fromkeys((1, 20), "sympathetic"),
        **dict.fromkeys((4, 5), "ecc_parity"),
        **dict.fromkeys((8, 9, 12, 16, 17, 24, 28), "hardware"),
        **dict.fromkeys((21, 22), "signal_integrity"),
        **dict.fromkeys((27, 29), "report_if_repeated"),
    },
    3: {
        **dict.fromkeys((0, 1, 2, 6), "ecc_parity"),
        13: "unexpected",
        **dict.fromkeys((16, 17, 18, 19), "report_if_repeated"),
    },
    # Bit 18: sympathetic too, "though a reset of the fabric is required".
    4: dict.fromkeys((16, 17, 18), "sympathetic"),
    5: {
        **dict.fromkeys((18, 19, 21, 22, 24, 25, 27, 28), "ecc_parity"),
        **dict.fromkeys((20, 23, 26, 29), "ecc_threshold"),
    },
}
FABRIC_RESET_BIT: Final = (4, 18)
_XID74_REGISTERS: Final = max(_XID74_BITS)
# The link and its seven registers, as "... fatal error detected on link 14(0x0, 0x0,
# 0x10000, 0x0, 0x0, 0x0, 0x0)" prints them; drivers that print no dump stop at the link.
_XID74_LINK = re.compile(
    r"\b[Ll]ink ([0-9]{1,3})(?:\s?\(((?:\s*0x[0-9A-Fa-f]{1,8}\s*,?){1,16})\))?"
)
_HEX = re.compile(r"0x([0-9A-Fa-f]{1,8})")
# The Hopper GPUs by their NVML names: H100, H200, H800, H20 and GH200, whatever follows.
_HOPPER_NAME = re.compile(r"\bG?H(?:100|200|800|20)\b")


@dataclass(frozen=True, slots=True)
class NvlinkError:
    """What an Xid 74 line says: the link, and the register dump when it prints one."""

    link: int
    registers: tuple[int, ...]  # as printed; () when the line prints none
    # (register from 1, bit, class) of every set bit of the registers the catalog
    # documents, but those it says can be ignored.
    bits: tuple[tuple[int, int, NvlinkErrorClass], ...] = ()
    ignored_bits: int = 0  # set bits the catalog says can be safely ignored

    @property
    def decoded(self) -> bool:
        return len(self.registers) >= _XID74_REGISTERS

    @property
    def classes(self) -> frozenset[NvlinkErrorClass]:
        return frozenset(cls for _, _, cls in self.bits)

    @property
    def fabric_reset(self) -> bool:
        """The fourth register's bit 18: the fabric needs a reset."""
        return any((register, bit) == FABRIC_RESET_BIT for register, bit, _ in self.bits)

    def bits_text(self) -> str:
        """The set bits by register: "register 1 bit 16; register 3 bits 0, 13"."""
        by_register: dict[int, list[int]] = {}
        for register, bit, _ in self.bits:
            by_register.setdefault(register, []).append(bit)
        return "; ".join(
            f"register {register} bit{'s' if len(bits) > 1 else ''} {', '.join(map(str, bits))}"
            for register, bits in sorted(by_register.items())
        )


def is_hopper(gpu_name: str) -> bool:
    """Whether NVML's name for a GPU is a Hopper's (the layout Xid 74's decode is for)."""
    return _HOPPER_NAME.search(gpu_name) is not None


def nvlink_error(line: str) -> NvlinkError | None:
    """The link and registers of an Xid 74 line, their set bits classed by NVIDIA's
    catalog (the Hopper layout); None when the line names no link."""
    found = _XID74_LINK.search(line)
    if found is None:
        return None
    link = int(found[1])
    registers = tuple(int(value, 16) for value in _HEX.findall(found[2] or ""))
    if len(registers) < _XID74_REGISTERS:
        return NvlinkError(link, registers)
    bits: list[tuple[int, int, NvlinkErrorClass]] = []
    ignored = 0
    for register, meanings in _XID74_BITS.items():
        value = registers[register - 1]
        for bit in range(32):
            if not value >> bit & 1:
                continue
            meaning = meanings.get(bit, "undocumented")
            if meaning is None:
                ignored += 1
            else:
                bits.append((register, bit, meaning))
    return NvlinkError(link, registers, tuple(bits), ignored)
