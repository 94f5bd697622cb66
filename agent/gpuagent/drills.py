"""Fault drills: realistic kernel-log lines written where the agent reads the kernel log.

On a node the line goes into /dev/kmsg (root only), so the real path is exercised end to
end: kernel log → parser → finding → metric → (later) remediation and reports. Every drill
line ends with a marker, so drills can be told apart from real faults afterwards.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from gpuagent.kernel.xid import lookup
from gpuagent.sources.kmsg import DRILL_MARKER

DRILL_KINDS = ("xid", "sxid", "fallen_off_bus", "aer")
_AER_SEVERITY = {
    "corrected": "Corrected",
    "nonfatal": "Uncorrected (Non-Fatal)",
    "fatal": "Uncorrected (Fatal)",
}


def _short_bus(bus_id: str) -> str:
    """ "0000:3b:00.0" → "0000:3b:00", as Xid lines print it."""
    return bus_id.rsplit(".", 1)[0]


def compose_line(kind: str, bus_id: str, values: Mapping[str, object]) -> str:
    """The drill's kernel-log message (without the kmsg level prefix)."""
    if kind == "xid":
        xid = _int(values, "code")
        info = lookup(xid)
        text = info.description if info else "Unknown error"
        pid = values.get("pid", "'<unknown>'")
        name = values.get("name", "<unknown>")
        line = f"NVRM: Xid (PCI:{_short_bus(bus_id)}): {xid}, pid={pid}, name={name}, {text}"
    elif kind == "sxid":
        sxid = _int(values, "code")
        severity = "Fatal" if values.get("fatal", False) else "Non-fatal"
        line = f"nvidia-nvswitch0: SXid (PCI:{bus_id}): {sxid}, {severity}, Link 00 drill"
    elif kind == "fallen_off_bus":
        line = f"NVRM: GPU {bus_id}: GPU has fallen off the bus."
    elif kind == "aer":
        severity = str(values.get("severity", "corrected"))
        if severity not in _AER_SEVERITY:
            raise ValueError(f"aer severity must be one of {', '.join(_AER_SEVERITY)}")
        line = (
            f"nvidia {bus_id}: PCIe Bus Error: severity={_AER_SEVERITY[severity]}, "
            "type=Physical Layer, (Receiver ID)"
        )
    else:
        raise ValueError(f"unknown drill {kind!r} (known: {', '.join(DRILL_KINDS)})")
    return f"{line} {DRILL_MARKER}"


def _int(values: Mapping[str, object], key: str) -> int:
    value = values.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"the drill needs {key}=N (an integer)")  # noqa: TRY004 - user input
    return value


def write_kernel_line(path: Path, message: str) -> None:
    """Write ``message`` where the agent reads the kernel log.

    /dev/kmsg takes one record per write, with a `<level>` prefix (3: error, as the
    driver logs faults); a FIFO or file (tests, simulated nodes) gets a plain line.
    """
    mode = path.stat().st_mode
    if stat.S_ISCHR(mode):
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, f"<3>{message}".encode())
        finally:
            os.close(fd)
        return
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
    if stat.S_ISFIFO(mode):
        flags |= os.O_NONBLOCK  # the agent holds the FIFO open; never block the daemon
    fd = os.open(path, flags)
    try:
        os.write(fd, f"{message}\n".encode())
    finally:
        os.close(fd)
