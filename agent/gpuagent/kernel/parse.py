"""Kernel-log messages → what they say about GPUs, NVSwitches and the PCIe bus.

Pure functions, no I/O. They accept whatever a kernel log line looks like in practice:
the bare message /dev/kmsg gives after the ``;``, a whole /dev/kmsg record line, and
``dmesg``, ``dmesg -T``, ``dmesg -x --time-format iso``, syslog and journal lines. None of
them ever raises: the agent feeds them every line the kernel writes, and one odd line must
not stop the stream. docs/kernel-log.md lists the forms and shows an example of each.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

from gpuagent.model import AerSeverity, KernelKind, KernelLine

# --- prefixes: timestamps, syslog and journal headers ---------------------------------------

_LEVELS = r"(?:emerg|alert|crit|err|warn|warning|notice|info|debug)"
_FACILITIES = r"(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local[0-7])"
_ISO_TIME = (
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?"
    r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?"
)
# One pass strips every prefix in any order and number: `journalctl` lines carry a syslog
# header *and* the kernel's own timestamp, Talos adds a host and a level, a kernel built
# with CONFIG_PRINTK_CALLER puts the caller (thread T<pid> or CPU C<n>) after the time,
# with a blank (util-linux dmesg) or without (the console, syslog(2)), and so on. Every
# alternative consumes at least one character and nothing follows the repetition, so the
# match simply stops at the first position no alternative fits: it never backtracks over
# the prefixes already taken, and its cost stays linear in the line's length.
_PREFIXES = re.compile(
    rf"""(?:
        \s+                                              # padding, multi-line indents
      | <[0-9]{{1,3}}>                                   # dmesg -r: <6>
      | [0-9]{{1,3}},[0-9]{{1,20}},[0-9]{{1,20}}(?:,[!-:<-~]{{0,64}})?;   # /dev/kmsg record header
      | \[\s*[+-]?[0-9]{{1,12}}(?:[.,][0-9]{{1,9}})?(?:\s*<[^>]{{0,24}}>)?\]:?   # [ 12.345678]
      | \[\s{{0,8}}[TC][0-9]{{1,10}}\]                   # CONFIG_PRINTK_CALLER: [  T291], [ C3]
      | \[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)\s[^\]]{{1,40}}\]:?   # dmesg -T
      | \[?{_ISO_TIME}\]?:?                              # dmesg --time-format iso, short-iso
      | [^\W\d_]{{3,5}}\.?\s{{1,2}}[0-9]{{1,2}}\s[0-9]{{2}}:[0-9]{{2}}:[0-9]{{2}}(?:\.[0-9]{{1,9}})?
        (?:\s+[\w.-]{{1,253}}(?=\s+[^\s:]{{1,64}}:))?     # syslog: "Jul 09 10:42:47 host"
      | [\w.-]{{1,253}}(?=\s+kernel:)                    # the host before "kernel:"
      | kernel:                                          # syslog/journal tag
      | (?:[\w.-]{{1,253}}:\s+)?{_FACILITIES}\s*:\s*{_LEVELS}\s*:   # dmesg -x, Talos
    )*""",
    re.VERBOSE,
)

# --- what the NVIDIA driver prints ------------------------------------------------------------

# A bus id inside a line, domain required so that times ("16:24:18") never look like one.
_BUS_ID = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"

# NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., text    (also "(0000:3b:00)", old drivers)
# The bus id is taken as printed; anything else inside the parentheses is tolerated.
# The code ends at a comma, a blank or the end of the line: "79\x001" is not Xid 79, and a
# control character inside the parentheses makes the header damaged, not an Xid report.
# What follows the code: "pid=1234, name=python3", "pid='<unknown>', name=<unknown>", a pid
# without a name, or neither. The name is the process's comm, which may hold spaces
# ("Web Content"); it ends at ", ". (One pattern, one search: storms parse 100,000.)
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]{0,20})[^)\x00-\x1f\x7f]{0,64}\): ?"
    r"(?P<code>[0-9]{1,9})(?=[, \t\r\n]|$)"
    r"(?:,\s*pid=(?:'?<unknown>'?|(?P<pid>[0-9]{1,10}))"
    r"(?:,\s*name=(?P<name>.*?))?(?:,\s|,?$))?",
    re.DOTALL,
)
_UNKNOWN_NAMES = frozenset({"<unknown>", "'<unknown>'", ""})
GRAPHICS_EXCEPTION = 13
# Where on the die an Xid 13 happened: "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0):
# Illegal Instruction Parameter", "Graphics SM Global Exception on (GPC 9, TPC 1, SM 1):
# Multiple Warp Errors"; drivers of the Pascal days name no SM: "... on (GPC 0, TPC 1): Out Of
# Range Address". The "Graphics Exception: ESR ..." and "Graphics Exception: ChID ..." lines
# of the same crash name no place at all.
_XID13_LOCATION = re.compile(r"\(GPC ([0-9]{1,4}), TPC ([0-9]{1,4})(?:, SM ([0-9]{1,4}))?\)")

# nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 ...
# (The same rules for the header as for Xid lines.)
_SXID = re.compile(
    r"SXid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]{0,20})[^)\x00-\x1f\x7f]{0,64}\): ?"
    r"(?P<code>[0-9]{1,9})(?=[, \t\r\n]|$)"
)

# The GPU a driver message is about: "GPU 0000:91:00.0:", "GPU at PCI:0000:9b:00:",
# "GPU at 0000:01:00.0 has", "The NVIDIA GPU 0000:b3:00.0".
_NVRM_GPU = re.compile(rf"GPU(?: at)? (?:PCI:)?(?P<pci>{_BUS_ID})")

# "GPU has fallen off the bus", and the three-line probe-time form, whose first two lines
# name the GPU but not the fault:
#   NVRM: The NVIDIA GPU 0000:b3:00.0
#   NVRM: (PCI ID: 10de:26b5) installed in this system has
#   NVRM: fallen off the bus and is not responding to commands.
# (Every other "The NVIDIA GPU ..." message carries "(PCI ID: ...)" on its first line.)
_FALLEN = re.compile(
    rf"fallen off the bus"
    rf"|The NVIDIA GPU {_BUS_ID}(?: \(PCI ID: [0-9A-Fa-f]{{4}}:[0-9A-Fa-f]{{4}}\) installed"
    rf" in this system has)?\s*$"
    rf"|^NVRM: \(PCI ID: [0-9A-Fa-f]{{4}}:[0-9A-Fa-f]{{4}}\) installed in this system has\s*$",
    re.MULTILINE,
)
_CRASH_DUMP = "crash dump has been created"
# NVRM: API mismatch: the client has the version 570.153.02, but
# NVRM: this kernel module has the version 535.86.10.  Please
# NVRM: API mismatch: the client 'kwin_wayland' (pid 1005)
# The wording that names no client (old drivers print only it, current ones still do on
# some paths) splits one sentence over two records, each naming one of the versions.
# The second is a mismatch by itself: the first may have been overwritten in the ring
# buffer, fallen before the look-back, or be filtered out by whatever fed us the log, and
# the kernel module's version is the half an operator needs to see.
_MISMATCH = re.compile(r"API mismatch|[Vv]ersion mismatch|this kernel module has the version\b")
_MISMATCH_CLIENT = re.compile(r"client '(?P<name>[^']{1,64})' \(pid (?P<pid>[0-9]{1,10})\)")
# GSP firmware and its RPC channel: "GSP", "kgsp..."/"...Gsp..." in function names, and the
# RPC plumbing ("_issueRpcAndWait", "rpcSendMessage", "RPC history"). Case matters: a
# case-insensitive "gsp" would match inside unrelated identifiers.
_GSP = re.compile(r"GSP|Gsp|kgsp|\bgsp|RPC|Rpc|\brpc")
# The kernel's firmware loader failing to find the driver's GSP firmware (r510 and later
# request nvidia/<driver version>/gsp*.bin when RM boots on GSP): the installed driver
# lacks its firmware, so no GPU it drives will initialise.
#   nvidia 0000:3b:00.0: Direct firmware load for nvidia/535.161.08/gsp_ga10x.bin failed
#     with error -2
#   (NULL device *): Direct firmware load for ...      (no device: dev_warn(NULL, ...))
#   nvidia 0000:3b:00.0: firmware: failed to load nvidia/.../gsp_tu10x.bin (-2)   (Debian)
# The bus id is the device prefix dev_warn() prints, when it names a PCI device. Other
# firmware (Wi-Fi .ucode, nouveau's nvidia/<chip>/gsp/...) is not the NVIDIA driver's.
_GSP_FIRMWARE = re.compile(
    rf"(?:(?P<pci>{_BUS_ID}): )?"
    r"(?:Direct firmware load for|firmware: failed to load)"
    r" nvidia/[0-9][0-9.]{0,30}/gsp\w{0,32}\.bin\b"
)
# nvidia: probe of 0000:5d:00.0 failed with error -1   (the PCI driver, not RM: no "NVRM")
_PROBE_FAILED = re.compile(rf"nvidia: probe of (?P<pci>{_BUS_ID}) failed")

# --- PCIe AER -----------------------------------------------------------------------------------

# "<driver> <bus id>: " and then a line of an AER report. Kernels from 4.19 on prefix every
# line with "AER:"; older ones print the detail lines bare:
#   pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer
#   pcieport 0000:00:1c.0:   device [8086:9d10] error status/mask=00002001/00002000
#   nvidia 0000:01:00.0:    [ 0] RxErr                  (First)
# "AER: enabled with IRQ 24" is the port driver starting up, not a report.
_AER = re.compile(
    rf"[\w.-]{{1,64}} (?P<pci>{_BUS_ID}):\s"
    r"(?:AER:(?!\s*enabled with IRQ)|PCIe Bus Error:"
    r"|\s*device \[[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}\] error status/mask="
    r"|\s*\[\s?[0-9]{1,2}\] |\s*TLP Header:)"
)
# The root port announces each error it received and names the function that sent it:
#   pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:86:00.0   (4.19-6.x)
#   pcieport 0000:00:01.0: AER: Uncorrectable (Fatal) error message received from 0000:86:00.0
#   pcieport 0000:00:1c.0: AER: Multiple Corrected error received: id=00e5       (older)
# The error is that function's (the GPU), not the port's. The old id= form is the source's
# bus number and devfn, in the port's PCI domain.
_AER_SOURCE = re.compile(
    r"error (?:message )?received(?::| from)\s*"
    rf"(?:(?P<pci>{_BUS_ID})|id=(?P<id>[0-9A-Fa-f]{{4}})\b)"
)
_AER_HINTS = ("AER", "PCIe Bus Error", "status/mask", "   [", "TLP Header")
_AER_SEVERITY = re.compile(
    r"Uncorrect(?:ed|able) \((?P<fatality>Non-Fatal|Fatal)\)|Correct(?:ed|able)\b"
)


def _strip_prefixes(line: str) -> str:
    match = _PREFIXES.match(line)
    return line[match.end() :].rstrip() if match else line.rstrip()


def parse_message(message: str, *, bare: bool = False) -> KernelLine:
    """Classify one kernel-log message (or dmesg/syslog/journal line). ``bare``: the
    message of a /dev/kmsg record, which carries no tool's timestamp or header to strip."""
    text = message.strip() if bare else _strip_prefixes(message)
    # Cheap substring tests first: almost every line on a node is noise, and a
    # `str.__contains__` costs far less than running the patterns below.
    if "NVRM" in text:
        return _nvrm(text)
    if "SXid" in text:
        return _sxid(text)
    if any(hint in text for hint in _AER_HINTS):
        aer = _aer(text)
        if aer is not None:
            return aer
    if "/gsp" in text:
        firmware = _GSP_FIRMWARE.search(text)
        if firmware is not None:
            return KernelLine(kind="gsp", pci=firmware["pci"], text=text)
    if "probe of" in text:
        probe = _PROBE_FAILED.search(text)
        if probe is not None:
            return KernelLine(kind="other_nvrm", pci=probe["pci"], text=text)
    return KernelLine(kind="noise", text=text)


def _nvrm(text: str) -> KernelLine:
    if "Xid" in text:
        xid = _XID.search(text)
        if xid is not None:
            return _xid(text, xid)
    kind: KernelKind = "other_nvrm"
    pid: int | None = None
    process: str | None = None
    if _FALLEN.search(text):
        kind = "fallen_off_bus"
    elif _CRASH_DUMP in text:
        kind = "crash_dump"
    elif _MISMATCH.search(text):
        kind = "driver_mismatch"
        client = _MISMATCH_CLIENT.search(text)
        if client is not None:
            pid, process = int(client["pid"]), client["name"]
    elif _GSP.search(text):
        kind = "gsp"
    gpu = _NVRM_GPU.search(text)
    return KernelLine(
        kind=kind,
        pci=gpu["pci"] if gpu else None,
        pid=pid,
        process=process,
        text=text,
    )


def _xid(text: str, xid: re.Match[str]) -> KernelLine:
    pid, name = xid["pid"], xid["name"]
    code = int(xid["code"])
    line = KernelLine(
        kind="xid",
        code=code,
        pci=xid["pci"] or None,
        pid=int(pid) if pid else None,
        process=None if name is None or name in _UNKNOWN_NAMES else name,
        text=text,
    )
    if code == GRAPHICS_EXCEPTION and "GPC" in text:
        where = _XID13_LOCATION.search(text, xid.end())
        if where is not None:
            sm = where[3]
            return line._replace(
                gpc=int(where[1]), tpc=int(where[2]), sm=int(sm) if sm is not None else None
            )
    return line


def _sxid(text: str) -> KernelLine:
    sxid = _SXID.search(text)
    if sxid is None:
        # "SXid" in some other wording (a summary, a tool's echo): not a fault report.
        return KernelLine(kind="noise", text=text)
    return KernelLine(kind="sxid", code=int(sxid["code"]), pci=sxid["pci"] or None, text=text)


def _aer(text: str) -> KernelLine | None:
    report = _AER.match(text)
    if report is None:
        return None
    return KernelLine(
        kind="aer",
        pci=_aer_source(text, report["pci"]),
        aer_severity=_aer_severity(text),
        text=text,
    )


def _aer_source(text: str, reporter: str) -> str:
    """The function an AER line is about: the one a root port's announcement names as the
    error's source, else the device that printed the line."""
    if "received" not in text:
        return reporter
    found = _AER_SOURCE.search(text)
    if found is None:
        return reporter
    if found["pci"] is not None:
        return found["pci"]
    source = int(found["id"], 16)
    domain = reporter.split(":", 1)[0]
    bus, device, function = source >> 8, (source >> 3) & 0x1F, source & 0x7
    return f"{domain}:{bus:02x}:{device:02x}.{function}"


def _aer_severity(text: str) -> AerSeverity | None:
    found = _AER_SEVERITY.search(text)
    if found is None:
        return None
    fatality = found["fatality"]
    if fatality is None:
        return "corrected"
    return "fatal" if fatality == "Fatal" else "nonfatal"


# --- PCI bus ids ----------------------------------------------------------------------------

_PCI_FORM = re.compile(
    r"(?:(?i:PCI):)?(?:(?P<domain>[0-9A-Fa-f]{1,8}):)?(?P<bus>[0-9A-Fa-f]{1,2})"
    r":(?P<device>[0-9A-Fa-f]{1,2})(?:\.(?P<function>[0-7]))?"
)
_MAX_DEVICE = 0x1F


@functools.lru_cache(maxsize=1024)  # a node has a few dozen devices; storms repeat them
def canonical_pci(raw: str) -> str | None:
    """Any bus-id form a line may give → sysfs's ``0000:3b:00.0``; None if not a bus id.

    Accepts ``PCI:0000:3b:00`` (Xid lines), ``0000:3b:00``, ``0000:3B:00.0``,
    ``00000000:3b:00.0`` (NVML) and ``3b:00.0``. A bare ``3b:00`` (neither domain nor
    function) is refused: it reads as well as a time of day as a bus id.
    """
    found = _PCI_FORM.fullmatch(raw.strip())
    if found is None:
        return None
    domain, function = found["domain"], found["function"]
    if domain is None and function is None:
        return None
    device = int(found["device"], 16)
    if device > _MAX_DEVICE:
        return None
    return f"{int(domain or '0', 16):04x}:{int(found['bus'], 16):02x}:{device:02x}.{function or 0}"


# --- /dev/kmsg records --------------------------------------------------------------------------


class KmsgRecord(NamedTuple):
    """One /dev/kmsg record (Documentation/ABI/testing/dev-kmsg); a named tuple, built
    fast (storms)."""

    priority: int  # the syslog level: 0 emerg ... 7 debug
    facility: int  # 0 for the kernel's own messages
    sequence: int
    usec: int  # monotonic microseconds since boot
    continuation: bool  # flagged as a fragment of a line ('c', or '+' from old kernels)
    message: str


_KMSG_ESCAPE = re.compile(rb"\\x([0-9A-Fa-f]{2})")
# "prio,seq,usec[,flags[,caller=T17...]];message": the numbers are 64-bit counters (at
# most 20 digits), the rest of the header printable ASCII without blanks. The message ends
# at the first newline (the record's dictionary lines follow it) and holds no raw control
# character: the kernel escapes every one as ``\xNN`` (a tab and the CR of a CRLF line
# ending are tolerated). One match checks all of it: a storm parses 100,000 of these.
_KMSG_RECORD = re.compile(
    rb"([0-9]{1,20}),([0-9]{1,20}),([0-9]{1,20})(?:,([!-+\--:<-~]*)(?:,[!-:<-~]*)?)?;"
    rb"([^\x00-\x08\x0a-\x1f\x7f]*)\r?(?:\n|\Z)"
)
# Raw control characters no kernel-log line carries: the kernel escapes every one in
# /dev/kmsg, and dmesg, journalctl and syslog daemons print them escaped too.
_RAW_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def decode_line(raw: bytes) -> str | None:
    """One kernel-log line as read (no newline) → its text, or None when it is damaged.

    A line holding a raw control character (a NUL, an escape, ...; see ``_RAW_CONTROL``)
    was not written by the kernel or a log tool: a NUL-filled block after a crash, binary
    written into a FIFO, two writes torn into each other. Its fields cannot be trusted, so
    it is refused instead of guessed at. A trailing CR is dropped; invalid UTF-8 is
    replaced.
    """
    raw = raw.removesuffix(b"\r")
    if _RAW_CONTROL.search(raw):
        return None
    return raw.decode("utf-8", errors="replace")


def _unescape(match: re.Match[bytes]) -> bytes:
    return bytes((int(match[1], 16),))


def parse_kmsg_record(record: bytes) -> KmsgRecord | None:
    """``prio,seq,usec,flags[,more];message`` + ``\\n KEY=value`` lines → a record, or None.

    The kernel writes non-printable bytes, bytes ≥ 0x7f and the backslash as ``\\xNN``;
    they are unescaped and the message decoded as UTF-8 (invalid bytes replaced). The
    dictionary lines after the message are ignored. A record whose header holds anything
    but printable ASCII, or whose message holds a raw control character (the kernel never
    writes one; a trailing CR and a tab are tolerated), is malformed: None, never a guess.
    """
    found = _KMSG_RECORD.match(record)
    if found is None:
        return None
    prio_field, sequence_field, usec_field, flags, raw_message = found.groups()
    prio = int(prio_field)
    if b"\\x" in raw_message:
        raw_message = _KMSG_ESCAPE.sub(_unescape, raw_message)
    message = raw_message.decode("utf-8", errors="replace")
    continuation = flags is not None and (b"c" in flags or b"+" in flags)
    return KmsgRecord(
        prio & 7, prio >> 3, int(sequence_field), int(usec_field), continuation, message
    )
