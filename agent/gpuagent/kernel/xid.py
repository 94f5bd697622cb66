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
