"""``xid``: the GPU's XID errors (kernel log and NVML), judged by NVIDIA's catalog.

Each XID is judged by the catalog's immediate-action bucket. Application errors fade:
they are the workload's fault, so they only WARN for ``app_error_hold_seconds`` and turn
CRITICAL when they come faster than ``app_error_rate_per_hour``. Every other verdict holds
for as long as its event is in the event log: the fault stays until the GPU is reset or
the node rebooted. GSP error messages that no XID explains are judged here too. An XID
whose fault another check's finding reports (Xid 48 with the DBE counter, say) is left to
that finding: see checks/same_fault.py.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuagent.checks.common import EventView, Evidence, Outcome, Problem, fmt, plural
from gpuagent.checks.eventindex import RECENT_SECONDS, age, near, recent, times, within
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.kernel.xid import NvlinkError, NvlinkErrorClass, XidInfo, caused_by, is_hopper, lookup
from gpuagent.kernel.xid import nvlink_error as read_nvlink_error
from gpuagent.model import GpuEvent, Severity

FALLEN_OFF_THE_BUS = 79  # a node reboot whatever the catalog says: the GPU is unreachable
# XIDs that report a condition's end, and the XIDs that reported its start: the catalog's
# "Power Smoothing HW Circuitry capability reengaged" (162) ends "... disengaged" (163).
# The end is no fault itself, and clears the start logged before it on the same GPU.
ENDS = {162: frozenset({163})}
PREEMPTIVE_REMOVAL = 45
RECOVERY_ACTION_CHANGED = 154
# Channel teardowns: the driver logs one for every channel of every process it cleans up
# after a fault, so one fault brings thousands of them on every GPU its job touched. Alone
# they are the workload's error; after a fault on the same GPU, that fault's consequence.
TEARDOWN_XIDS = frozenset({43, PREEMPTIVE_REMOVAL})
# How soon after a fault a teardown on the same GPU is that fault's consequence, and how
# near another XID must be for an Xid 45 not to stand alone (NVIDIA's "solo" Xid 45).
CONSEQUENCE_SECONDS = 60.0
# Lines of one application crash (one per channel or SM) arrive together; events closer
# than this from the same process (or an unknown one) are one incident.
APP_INCIDENT_GAP_SECONDS = 10.0
APP_RATE_SECONDS = 3600.0
# GSP messages this close to an XID on the same GPU are that XID's details.
GSP_XID_SECONDS = 60.0

_RECOVERY = re.compile(r"recovery action changed from .*? to 0x([0-9A-Fa-f]+)(?: \(([^)]*)\))?")
# NVLink5 XIDs (144-150) print the error's fatality: "RLW_RXPIPE Nonfatal XC0 ...".
_NVLINK_FATALITY = re.compile(r"\b(Nonfatal|Non-fatal|Fatal)\b")


# Compared by identity: verdicts are the constants below, and grouping thousands of events
# by verdict must not hash their fields each time.
@dataclass(frozen=True, slots=True, eq=False)
class Verdict:
    severity: Severity
    label: str
    action: Action
    runbook: Runbook
    # NVIDIA's own escalation: this many within the repeat window (on the same NVLink, for
    # an Xid 74) is CRITICAL with ``escalate``; 0: none of its own.
    escalate_at: int = 0
    escalate: Action = Action.CONTACT_SUPPORT


IGNORED = Verdict(Severity.OK, "informational", Action.NONE, Runbook.NONE)
ENDED = Verdict(Severity.OK, "condition ended", Action.NONE, Runbook.NONE)
NO_RECOVERY = Verdict(Severity.OK, "no recovery action needed", Action.NONE, Runbook.NONE)
APP_ERROR = Verdict(
    Severity.WARN, "application error", Action.RESTART_APP, Runbook.GPU_XID_APP_ERROR
)
RESET = Verdict(
    Severity.CRITICAL, "reset required", Action.RESET_GPU, Runbook.GPU_XID_RESET_REQUIRED
)
DRAIN_AND_RESET = Verdict(
    Severity.CRITICAL,
    "drain and reset required",
    Action.DRAIN_AND_RESET,
    Runbook.GPU_XID_RESET_REQUIRED,
)
ECC_DBE = Verdict(
    Severity.CRITICAL,
    "uncorrectable ECC error, drain and reset required",
    Action.DRAIN_AND_RESET,
    Runbook.GPU_ECC_DBE,
)
REBOOT = Verdict(
    Severity.CRITICAL, "reboot required", Action.DRAIN_AND_REBOOT, Runbook.GPU_XID_REBOOT_REQUIRED
)
SUPPORT = Verdict(
    Severity.CRITICAL, "contact support", Action.CONTACT_SUPPORT, Runbook.GPU_XID_CONTACT_SUPPORT
)
NVLINK_NONFATAL = Verdict(
    Severity.WARN, "non-fatal NVLink error", Action.INVESTIGATE, Runbook.GPU_XID_NVLINK_NONFATAL
)
MECHANICALS = Verdict(
    Severity.WARN, "check power cables", Action.CHECK_POWER, Runbook.GPU_XID_CHECK_MECHANICALS
)
UNKNOWN = Verdict(Severity.WARN, "unknown XID", Action.INVESTIGATE, Runbook.GPU_XID_UNKNOWN)
# Xid 74 decoded (NVIDIA's WORKFLOW_NVLINK_ERR; see gpuagent.kernel.xid.nvlink_error).
NVLINK_SYMPATHETIC = Verdict(
    Severity.WARN,
    "the peer GPU or NVSwitch at the link's other end failed: investigate it, not this GPU",
    Action.INVESTIGATE,
    Runbook.GPU_XID_NVLINK_SYMPATHETIC,
)
NVLINK_SYMPATHETIC_FABRIC = Verdict(
    Severity.WARN,
    "the peer GPU or NVSwitch at the link's other end failed: investigate it, not this GPU;"
    " the fabric needs a reset",
    Action.INVESTIGATE,
    Runbook.GPU_XID_NVLINK_SYMPATHETIC,
)
NVLINK_HARDWARE = Verdict(
    Severity.CRITICAL,
    "possible hardware fault: check and reseat the link's connections, run diagnostics",
    Action.RESEAT_OR_REPLACE,
    Runbook.GPU_XID_NVLINK_HARDWARE,
)
NVLINK_SIGNAL = Verdict(
    Severity.WARN,
    "marginal channel: check the link's connections, run field diagnostics",
    Action.RESEAT_OR_REPLACE,
    Runbook.GPU_XID_NVLINK_HARDWARE,
)
NVLINK_ECC = Verdict(
    Severity.WARN,
    "likely hardware: a support case if it repeats on the link",
    Action.INVESTIGATE,
    Runbook.GPU_XID_NVLINK_ECC,
    escalate_at=3,  # "If seen more than 2 times on the same link, report a bug."
)
NVLINK_ECC_THRESHOLD = Verdict(
    Severity.WARN,
    "exceeded, nothing uncorrectable: keep running",
    Action.INVESTIGATE,
    Runbook.GPU_XID_NVLINK_ECC,
)
NVLINK_REPORT_IF_REPEATED = Verdict(
    Severity.WARN,
    "a support case if it repeats",
    Action.INVESTIGATE,
    Runbook.GPU_XID_NVLINK_HARDWARE,
    escalate_at=2,  # "If seen repeatedly, please report a bug."
)
NVLINK_IGNORABLE = Verdict(Severity.OK, "nothing to do", Action.NONE, Runbook.NONE)
# An Xid 45 naming a root XID this GPU did not log: the fault is on another GPU or node,
# which its own agent reports. Never more than a warning, and it fades like an app error.
CONSEQUENCE = Verdict(
    Severity.WARN,
    "consequence of a fault elsewhere",
    Action.INVESTIGATE,
    Runbook.GPU_XID_CONSEQUENCE,
)
# An Xid 45 with no other XID near it: NVIDIA's catalog says to restart Fabric Manager.
SOLO_TEARDOWN = Verdict(
    Severity.WARN,
    "channels removed with no other XID",
    Action.RESTART_FABRIC_MANAGER,
    Runbook.GPU_XID_SOLO_TEARDOWN,
)

# Catalog buckets that need no decoding. RESTART_VM restarts the operating system the
# agent runs in, which for this agent is a reboot. Buckets not listed here and not
# decoded below (CONTACT_SUPPORT, UPDATE_SWFW, CHECK_UVM, none) have no safe automatic
# fix, so they go to support.
_PLAIN = {
    "RESTART_APP": APP_ERROR,
    "IGNORE": IGNORED,
    "RESET_GPU": RESET,
    "RESTART_BM": REBOOT,
    "RESTART_VM": REBOOT,
    "CHECK_MECHANICALS": MECHANICALS,
    "WORKFLOW_XID_48": ECC_DBE,
}
# NVML_GPU_RECOVERY_ACTION_*: the driver's own verdict, printed by Xid 154. Draining
# peer-to-peer traffic (3) is covered by draining the GPU.
_RECOVERY_ACTIONS = {0: NO_RECOVERY, 1: RESET, 2: REBOOT, 3: DRAIN_AND_RESET, 4: DRAIN_AND_RESET}


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    info: XidInfo | None
    detail: str = ""  # how a workflow XID was decoded, for the reason
    root_xid: int | None = None
    recovery_action: str | None = None
    nvlink: NvlinkError | None = None  # an Xid 74's link and registers
    nvlink_class: NvlinkErrorClass | None = None  # the class its verdict comes from


def _plain(info: XidInfo) -> Judgement:
    """The judgement of an XID the catalog's bucket alone decides."""
    verdict = _PLAIN.get(info.action, SUPPORT)
    # The device plugin's application-error list marks XIDs that are the workload's fault;
    # that makes such an XID at least an application error, never less.
    if info.app_error and verdict.severity.rank < APP_ERROR.severity.rank:
        verdict = APP_ERROR
    return Judgement(verdict, info)


def _preemptive_removal(info: XidInfo, line: str) -> Judgement:
    # Newer drivers name the XID that made the driver tear the channel down; that XID is
    # the fault, judged on its own line where the GPU logged it (the check attaches this
    # line there). Alone, Xid 45 means a process's channels were removed (it was killed).
    root_xid = caused_by(line)
    if root_xid is None or root_xid == PREEMPTIVE_REMOVAL:
        return Judgement(APP_ERROR, info)
    root_verdict = judge(root_xid, "").verdict
    # A teardown after an application's own error is part of that crash; after an XID
    # that needs nothing, nothing.
    if root_verdict is APP_ERROR or root_verdict.severity is Severity.OK:
        verdict = root_verdict
    else:
        verdict = CONSEQUENCE
    return Judgement(verdict, info, detail=f"caused by Xid {root_xid}", root_xid=root_xid)


def _recovery_action(info: XidInfo, line: str) -> Judgement:
    found = _RECOVERY.search(line)
    if found is None:
        return Judgement(SUPPORT, info, detail="recovery action not readable")
    value, name = int(found[1], 16), found[2]
    shown = f"0x{value:x} ({name})" if name else f"0x{value:x}"
    verdict = _RECOVERY_ACTIONS.get(value, SUPPORT)
    return Judgement(verdict, info, detail=f"recovery action {shown}", recovery_action=shown)


def _nvlink5(info: XidInfo, line: str) -> Judgement:
    # The catalog's NVLink5 decode tables call for a GPU reset on every fatal status and
    # mostly for nothing on non-fatal ones; without the fatality there is no safe decode.
    found = _NVLINK_FATALITY.search(line)
    if found is None:
        return Judgement(SUPPORT, info)
    if found[1] == "Fatal":
        return Judgement(RESET, info, detail="fatal")
    return Judgement(NVLINK_NONFATAL, info, detail="non-fatal")


# Xid 74's classes, worst first: the verdict is the first class any set bit is of. A
# sympathetic bit counts only alone ("if seen with other bits set ..., follow the resolution
# for those"), and so does a marginal channel ("if other errors accompany this Xid, follow
# the resolution for those first").
_NVLINK_CLASSES: tuple[tuple[NvlinkErrorClass, Verdict], ...] = (
    ("hardware", NVLINK_HARDWARE),
    ("unexpected", SUPPORT),
    ("undocumented", SUPPORT),
    ("ecc_parity", NVLINK_ECC),
    ("report_if_repeated", NVLINK_REPORT_IF_REPEATED),
    ("signal_integrity", NVLINK_SIGNAL),
    ("ecc_threshold", NVLINK_ECC_THRESHOLD),
    ("sympathetic", NVLINK_SYMPATHETIC),
)
_NVLINK_WORDS: dict[NvlinkErrorClass, str] = {
    "sympathetic": "sympathetic",
    "ecc_parity": "ECC/parity",
    "ecc_threshold": "ECC error threshold",
    "hardware": "hardware",
    "signal_integrity": "signal integrity",
    "report_if_repeated": "error to watch",
    "unexpected": "unexpected bit",
    "undocumented": "undocumented bits",
}


def _nvlink(info: XidInfo, line: str, *, hopper: bool) -> Judgement:
    """Xid 74 by its register dump, as NVIDIA's WORKFLOW_NVLINK_ERR decodes it (Hopper)."""
    found = read_nvlink_error(line)
    if found is None:
        return Judgement(SUPPORT, info, detail="on an unnamed link")
    where = f"on NVLink {found.link}"
    if not hopper or not found.decoded:
        # The catalog documents the register layout of Hopper GPUs only; a line without
        # its dump (older drivers) leaves nothing to decode.
        return Judgement(SUPPORT, info, detail=where, nvlink=found)
    classes = found.classes
    if not classes:
        if found.ignored_bits:  # "can be safely ignored"
            return Judgement(NVLINK_IGNORABLE, info, f"{where}, ignorable bits", nvlink=found)
        return Judgement(SUPPORT, info, detail=f"{where}, no register bit set", nvlink=found)
    cls, verdict = next((c, v) for c, v in _NVLINK_CLASSES if c in classes)
    if verdict is NVLINK_SYMPATHETIC and found.fabric_reset:
        verdict = NVLINK_SYMPATHETIC_FABRIC
    detail = f"{where}, {_NVLINK_WORDS[cls]}"
    return Judgement(verdict, info, detail=detail, nvlink=found, nvlink_class=cls)


# Workflow buckets whose decoding the line makes possible.
_DECODERS: dict[str, Callable[[XidInfo, str], Judgement]] = {
    "WORKFLOW_XID_45": _preemptive_removal,
    "XID_154": _recovery_action,
    "WORKFLOW_NVLINK5_ERR": _nvlink5,
}
NVLINK_WORKFLOW = "WORKFLOW_NVLINK_ERR"


def judge(code: int | None, line: str, *, hopper: bool = False) -> Judgement:
    """What one XID line means for the GPU; ``hopper``: the GPU is a Hopper, whose Xid 74
    register layout NVIDIA documents."""
    if code is None:
        return Judgement(UNKNOWN, None)
    by_number = _by_number(code)
    return by_number if by_number is not None else _by_line(code, line, hopper=hopper)


# Every evaluation judges every retained XID again, so both steps are cached (beyond the
# event log's size); they depend on nothing but the catalog, which never changes.
@functools.lru_cache(maxsize=4096)
def _by_number(code: int) -> Judgement | None:
    """The judgement of an XID whose meaning does not depend on its line; else None."""
    info = lookup(code)
    if code == FALLEN_OFF_THE_BUS:
        return Judgement(REBOOT, info)
    if info is None:
        return Judgement(UNKNOWN, None)
    if code in ENDS:
        return Judgement(ENDED, info)
    return None if info.action in _DECODERS or info.action == NVLINK_WORKFLOW else _plain(info)


@functools.lru_cache(maxsize=16384)
def _by_line(code: int, line: str, *, hopper: bool) -> Judgement:
    """A workflow XID (one `_by_number` leaves to its line), decoded."""
    info = lookup(code)
    assert info is not None  # _by_number judged the XIDs the catalog lacks
    if info.action == NVLINK_WORKFLOW:
        return _nvlink(info, line, hopper=hopper)
    return _DECODERS[info.action](info, line)


@dataclass(frozen=True, slots=True)
class Policy:
    """What the check makes of an XID, for a person reading the catalog (`gpuagent xid
    explain`, `xid list`): the verdict of a line that gives nothing more to decode, and,
    for an XID whose line decides, what in the line does."""

    verdict: Verdict
    decided_by: str = ""  # "" where the number alone decides


# What decides a workflow XID's verdict, in the words of the decoders above.
_DECIDED_BY = {
    "WORKFLOW_XID_45": (
        "the XID the line names as its cause: that XID's own fault on this GPU, else a "
        "consequence of a fault elsewhere (WARN); naming none, an application error, or "
        "with no other XID near it a channel teardown to restart Fabric Manager for (WARN)"
    ),
    "XID_154": (
        "the recovery action the line names: none (OK), GPU reset, node reboot, or drain "
        "and reset (CRITICAL)"
    ),
    "WORKFLOW_NVLINK5_ERR": (
        "the error's fatality in the line: Fatal needs a GPU reset (CRITICAL), Non-fatal is "
        "a non-fatal NVLink error (WARN)"
    ),
    NVLINK_WORKFLOW: (
        "the link's register dump (Hopper GPUs): hardware (CRITICAL), ECC/parity (WARN, "
        "CRITICAL the 3rd time on the link), signal integrity, ECC threshold, sympathetic "
        "(the peer at the other end failed) (WARN), ignorable bits (OK)"
    ),
}
# Application errors fade, unless they come fast (see check_xid's app-error rules).
APP_ERROR_NOTE = (
    "WARN for checks.xid.app_error_hold_seconds; CRITICAL above "
    "checks.xid.app_error_rate_per_hour incidents"
)


def policy(code: int) -> Policy:
    """The check's verdict on XID ``code`` by its number (see `Policy`)."""
    verdict = judge(code, "").verdict
    info = lookup(code)
    if info is None or code == FALLEN_OFF_THE_BUS:
        return Policy(verdict)
    return Policy(verdict, _DECIDED_BY.get(info.action, ""))


# --- the check ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Subject:
    """The event a problem is about, for the finding's evidence."""

    event: GpuEvent
    count: int
    judgement: Judgement | None  # None for GSP messages
    consequences: int = 0  # teardown XIDs this fault caused on the GPU


@dataclass(frozen=True, slots=True)
class _Item:
    problem: Problem
    subject: _Subject


def _name(code: int | None, info: XidInfo | None) -> str:
    return f"Xid {code} ({info.mnemonic})" if info is not None else f"Xid {code}"


def _who(event: GpuEvent) -> str:
    if event.process and event.pid is not None:
        return f"{event.process} (pid {event.pid})"
    if event.process:
        return event.process
    return f"pid {event.pid}" if event.pid is not None else "an unknown process"


Judged = tuple[GpuEvent, Judgement]
Weight = Callable[[GpuEvent], int]
_GroupKey = tuple[int | None, Verdict, str]


@dataclass(frozen=True, slots=True)
class _Tally:
    """The GPU's XIDs sorted by what they mean, in one pass over them."""

    faults: dict[_GroupKey, list[Judged]]  # non-OK verdicts other than app errors
    apps: list[Judged]  # application errors and solo Xid 45s, which fade
    consequences: dict[_GroupKey, int]  # teardowns attached to the fault they followed


def _tally(
    xids: Sequence[GpuEvent], fade_before: float, weight: Weight, *, hopper: bool = False
) -> _Tally:
    """Sorts the GPU's XIDs; consequences of a fault elsewhere older than ``fade_before``
    are left out (they fade like application errors). ``weight`` says how many records
    a kept event stands for; ``hopper``: the GPU is a Hopper (see `judge`)."""
    faults: dict[_GroupKey, list[Judged]] = {}
    apps: list[Judged] = []
    consequences: dict[_GroupKey, int] = {}
    rooted: list[Judged] = []  # Xid 45s naming their root XID
    recovery: Judged | None = None
    last_fault: tuple[_GroupKey, float] | None = None
    xids = _without_ended(xids)
    others = times([e for e in xids if e.code != PREEMPTIVE_REMOVAL])
    for event in xids:
        judgement = judge(event.code, event.line, hopper=hopper)
        verdict = judgement.verdict
        if event.code == RECOVERY_ACTION_CHANGED:
            # Xid 154 reports the GPU's current recovery action: only the newest is true.
            recovery = (event, judgement)
        elif verdict is CONSEQUENCE:
            rooted.append((event, judgement))
        elif verdict is APP_ERROR and event.code in TEARDOWN_XIDS and judgement.root_xid is None:
            if last_fault is not None and 0 <= event.monotonic - last_fault[1] <= (
                CONSEQUENCE_SECONDS
            ):
                consequences[last_fault[0]] = consequences.get(last_fault[0], 0) + weight(event)
            elif event.code == PREEMPTIVE_REMOVAL and not near(
                event.monotonic, others, CONSEQUENCE_SECONDS
            ):
                apps.append((event, replace(judgement, verdict=SOLO_TEARDOWN)))
            else:
                apps.append((event, judgement))
        elif verdict is APP_ERROR:
            apps.append((event, judgement))
        elif verdict.severity is not Severity.OK:
            key = (event.code, verdict, judgement.detail)
            faults.setdefault(key, []).append((event, judgement))
            last_fault = (key, event.monotonic)
    if recovery is not None and recovery[1].verdict.severity is not Severity.OK:
        _, judgement = recovery
        faults[(RECOVERY_ACTION_CHANGED, judgement.verdict, judgement.detail)] = [recovery]
    _attach(rooted, faults, consequences, fade_before, weight)
    return _Tally(faults, apps, consequences)


def _without_ended(xids: Sequence[GpuEvent]) -> Sequence[GpuEvent]:
    """The GPU's XIDs (oldest first) less those whose condition a later one ended."""
    if not any(e.code in ENDS for e in xids):
        return xids
    kept: list[GpuEvent] = []
    for event in xids:
        ended = ENDS.get(event.code or 0)
        if ended:
            kept = [e for e in kept if e.code not in ended]
        kept.append(event)
    return kept


def _attach(
    rooted: list[Judged],
    faults: dict[_GroupKey, list[Judged]],
    consequences: dict[_GroupKey, int],
    fade_before: float,
    weight: Weight,
) -> None:
    """Each Xid 45 naming its root joins the root's problem where this GPU logged the root
    XID; else it is a consequence of a fault elsewhere, a warning of its own."""
    roots = {key[0]: key for key in faults}
    for event, judgement in rooted:
        root = roots.get(judgement.root_xid)
        if root is not None:
            consequences[root] = consequences.get(root, 0) + weight(event)
        elif event.monotonic >= fade_before:
            key = (event.code, CONSEQUENCE, judgement.detail)
            faults.setdefault(key, []).append((event, judgement))


def _group_reason(code: int | None, judgement: Judgement, count: int, consequences: int) -> str:
    times_seen = f" ({count} times)" if count > 1 else ""
    caused = f", and {plural(consequences, 'channel teardown')} after it" if consequences else ""
    if judgement.verdict is UNKNOWN:
        number = "(no number)" if code is None else str(code)
        return f"unknown XID {number}{times_seen}{caused}"
    detail = f" {judgement.detail}" if judgement.detail else ""
    label = judgement.verdict.label
    return f"{_name(code, judgement.info)}{detail}: {label}{times_seen}{caused}"


# Warning-level verdicts that escalate when the same XID keeps coming (checks.xid.repeat_*),
# besides those with NVIDIA's own count (Verdict.escalate_at). Sympathetic Xid 74s never
# do: however often the peer fails, this GPU is not the one to act on.
_REPEATABLE = (NVLINK_NONFATAL, MECHANICALS, UNKNOWN, NVLINK_SIGNAL)


def _repeat_items(view: EventView, tally: _Tally, weight: Weight) -> list[_Item]:
    """A warning-level XID seen at least its limit of times on the GPU within the window;
    an Xid 74 counted per link and class, against NVIDIA's own count where it names one."""
    config = view.config.xid
    items = []
    for (code, verdict, detail), members in tally.faults.items():
        if verdict not in _REPEATABLE and not verdict.escalate_at:
            continue
        window = [(e, j) for e, j in members if within(e, view.now, config.repeat_window_seconds)]
        seen = sum(weight(e) for e, _ in window)
        limit = config.repeat_limit(code, verdict.escalate_at or None)
        if seen < limit:
            continue
        event, judgement = window[-1]
        what = (
            f"{_name(code, judgement.info)} {detail}"
            if judgement.nvlink
            else _name(code, judgement.info)
        )
        reason = (
            f"{what} {seen} times in the last "
            f"{fmt(config.repeat_window_seconds)} s, at or above {limit}: repeating"
        )
        cause = f"Xid {code} {detail} repeating" if judgement.nvlink else f"Xid {code} repeating"
        if verdict.escalate_at:
            action, runbook = verdict.escalate, verdict.runbook
        else:
            action, runbook = Action.INVESTIGATE, Runbook.GPU_XID_REPEATING
        problem = Problem(Severity.CRITICAL, reason, action, runbook, cause)
        items.append(_Item(problem, _Subject(event, seen, judgement)))
    return items


def _fault_items(tally: _Tally, weight: Weight, owned: Mapping[int, str]) -> list[_Item]:
    """One problem per XID number and verdict, for every verdict that is not an app error,
    but those of ``owned`` XIDs (another check's finding reports their fault)."""
    items = []
    for key, members in tally.faults.items():
        code, verdict, _ = key
        if code in owned:
            continue  # its teardowns, attached to it, go with it
        event, judgement = members[-1]
        count = sum(weight(e) for e, _ in members)
        consequences = tally.consequences.get(key, 0)
        reason = _group_reason(code, judgement, count, consequences)
        cause = f"Xid {code} {judgement.detail}".rstrip()  # counts stay out: they grow
        problem = Problem(verdict.severity, reason, verdict.action, verdict.runbook, cause)
        items.append(_Item(problem, _Subject(event, count, judgement, consequences)))
    return items


def _incidents(events: Sequence[GpuEvent]) -> int:
    count, previous = 0, None
    for event in events:
        same = (
            previous is not None
            and abs(event.monotonic - previous.monotonic) <= APP_INCIDENT_GAP_SECONDS
            and (previous.pid is None or event.pid is None or previous.pid == event.pid)
        )
        count += 0 if same else 1
        previous = event
    return count


def _app_items(view: EventView, apps: list[Judged], incidents: int) -> list[_Item]:
    if not apps:
        return []
    config = view.config.xid
    event, judgement = apps[-1]
    subject = _Subject(event, len(apps), judgement)
    items = []
    if incidents > config.app_error_rate_per_hour:
        reason = (
            f"{incidents} application XID incidents in the last hour, "
            f"above {fmt(config.app_error_rate_per_hour)}"
        )
        problem = Problem(
            Severity.CRITICAL, reason, Action.INVESTIGATE, Runbook.GPU_XID_APP_ERROR_RATE
        )
        items.append(_Item(problem, subject))
    if age(event, view.now) < config.app_error_hold_seconds:
        verdict = judgement.verdict
        if verdict is SOLO_TEARDOWN:
            reason = f"{_name(event.code, judgement.info)} in {_who(event)}: {verdict.label}"
        else:
            reason = f"application error {_name(event.code, judgement.info)} in {_who(event)}"
        problem = Problem(Severity.WARN, reason, verdict.action, verdict.runbook)
        items.append(_Item(problem, subject))
    return items


def gsp_reason(count: int) -> str:
    return f"{plural(count, 'GSP error message')} in the last hour without an XID"


def _gsp_item(gsp: list[GpuEvent], records: int) -> list[_Item]:
    if not gsp:
        return []
    problem = Problem(Severity.WARN, gsp_reason(records), Action.INVESTIGATE, Runbook.GPU_GSP_ERROR)
    return [_Item(problem, _Subject(gsp[-1], records, None))]


def _untied_gsp(view: EventView, xids: Sequence[GpuEvent]) -> list[GpuEvent]:
    gsp = recent(view.events.for_device(view.bus_id, "gsp"), view.now, RECENT_SECONDS)
    if not gsp:
        return []
    xid_times = times(xids)
    return [e for e in gsp if not near(e.monotonic, xid_times, GSP_XID_SECONDS)]


def _worst(items: list[_Item]) -> _Item | None:
    # The same choice to_finding makes: the worst problem, the first listed among equals.
    return max(items, key=lambda item: item.problem.severity.rank, default=None)


def _subject_evidence(subject: _Subject | None) -> Evidence:
    event = None if subject is None else subject.event
    judgement = None if subject is None else subject.judgement
    info = None if judgement is None else judgement.info
    is_xid = judgement is not None
    return (
        ("xid", event.code if event is not None and is_xid else None),
        ("mnemonic", None if info is None else info.mnemonic),
        ("catalog_action", None if info is None else info.action or None),
        ("count", None if subject is None else subject.count),
        ("root_xid", None if judgement is None else judgement.root_xid),
        ("consequences", None if subject is None else subject.consequences),
        ("recovery_action", None if judgement is None else judgement.recovery_action),
        *_nvlink_evidence(judgement),
        ("line", None if event is None else event.line),
        ("time", None if event is None else event.time),
        ("pid", None if event is None else event.pid),
        ("process", None if event is None else event.process),
    )


def _nvlink_evidence(judgement: Judgement | None) -> Evidence:
    found = None if judgement is None else judgement.nvlink
    return (
        ("nvlink", None if found is None else found.link),
        ("nvlink_error", None if judgement is None else judgement.nvlink_class),
        ("nvlink_error_bits", None if found is None or not found.bits else found.bits_text()),
        (
            "nvlink_registers",
            None if found is None or not found.registers else ",".join(map(hex, found.registers)),
        ),
    )


def check_xid(view: EventView) -> Outcome:
    config = view.config.xid
    xids = view.events.for_device(view.bus_id, "xid")
    weight = view.events.weight
    hopper = is_hopper(view.identity.name)
    tally = _tally(xids, view.now - config.app_error_hold_seconds, weight, hopper=hopper)
    incidents = _incidents(recent((e for e, _ in tally.apps), view.now, APP_RATE_SECONDS))
    gsp = _untied_gsp(view, xids)
    gsp_records = view.events.records(gsp)
    items = [
        *_fault_items(tally, weight, view.owned_xids),
        *_repeat_items(view, tally, weight),
        *_app_items(view, tally.apps, incidents),
        *_gsp_item(gsp, gsp_records),
    ]
    # Newest first, so among equally bad problems the finding leads with the latest.
    items.sort(key=lambda item: _order(item.subject.event), reverse=True)
    worst = _worst(items)
    subject = worst.subject if worst is not None else _latest_subject(xids, hopper=hopper)
    evidence: Evidence = (
        ("xid_events", view.events.records(xids)),
        *_subject_evidence(subject),
        ("app_error_incidents_last_hour", incidents),
        ("app_error_rate_limit_per_hour", config.app_error_rate_per_hour),
        ("app_error_hold_seconds", config.app_error_hold_seconds),
        ("gsp_messages_last_hour", gsp_records),
    )
    ok = f"{plural(len(xids), 'XID')} seen, none needing action" if xids else "no XIDs"
    if view.owned_xids:
        ok = f"{plural(len(xids), 'XID')} seen, none needing action here; {_elsewhere(view)}"
    return Outcome(ok, evidence, tuple(item.problem for item in items))


def _elsewhere(view: EventView) -> str:
    """Where the owned XIDs are reported: "Xid 48 in the ecc finding"."""
    return ", ".join(
        f"Xid {code} in the {owner} finding" for code, owner in sorted(view.owned_xids.items())
    )


def _latest_subject(xids: Sequence[GpuEvent], *, hopper: bool) -> _Subject | None:
    """Without problems, the evidence shows the newest XID (an ignored one, say)."""
    if not xids:
        return None
    event = xids[-1]
    count = sum(1 for other in xids if other.code == event.code)
    return _Subject(event, count, judge(event.code, event.line, hopper=hopper))


def _order(event: GpuEvent) -> float:
    return -math.inf if math.isnan(event.monotonic) else event.monotonic  # NaN: oldest
