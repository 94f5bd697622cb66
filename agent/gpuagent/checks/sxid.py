"""``sxid`` (node): NVSwitch errors (SXids) from the kernel log.

There is no SXid catalog to judge the numbers by, so the agent does not guess what each
one means. What it does read is the fatality the driver prints in the first line of a
report ("SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"): a fatal SXid
leaves the NVLink fabric unusable until the switches and GPUs are reset, so it is
CRITICAL for as long as the event log keeps it. Every other SXid line (non-fatal ones and
a report's detail lines, which carry no fatality) is WARN for an hour.
"""

from __future__ import annotations

import functools
import re

from gpuagent.checks.common import Evidence, NodeView, Outcome, Problem, plural
from gpuagent.checks.eventindex import RECENT_SECONDS, event_evidence, latest, recent
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.model import GpuEvent, Severity

_FATALITY = re.compile(r"SXid\b.*?:\s*\d+,\s*(Non-fatal|Fatal)\b", re.IGNORECASE)


def _is_fatal(event: GpuEvent) -> bool:
    return _fatal_line(event.line)


@functools.lru_cache(maxsize=4096)  # each evaluation reads every retained SXid line again
def _fatal_line(line: str) -> bool:
    found = _FATALITY.search(line)
    return found is not None and found[1].lower() == "fatal"


def _switch(event: GpuEvent) -> str:
    return event.gpu or event.pci or "an unknown NVSwitch"


def _describe(events: list[GpuEvent]) -> str:
    last = events[-1]
    return f"last SXid {last.code} on {_switch(last)}"


def check_sxid(view: NodeView) -> Outcome:
    sxids = view.events.of_kind("sxid")
    fatal = [e for e in sxids if _is_fatal(e)]
    other = [e for e in recent(sxids, view.now, RECENT_SECONDS) if not _is_fatal(e)]
    records = view.events.records
    problems: list[Problem] = []
    if fatal:
        reason = f"{plural(records(fatal), 'fatal NVSwitch error')} ({_describe(fatal)})"
        problems.append(
            Problem(Severity.CRITICAL, reason, Action.DRAIN_AND_REBOOT, Runbook.NODE_SXID_FATAL)
        )
    if other:
        reason = f"{plural(records(other), 'NVSwitch SXid')} in the last hour ({_describe(other)})"
        problems.append(Problem(Severity.WARN, reason, Action.INVESTIGATE, Runbook.NODE_SXID))
    shown = latest(fatal) or latest(other)
    evidence: Evidence = (
        ("sxid_events", records(sxids)),
        ("fatal_sxids", records(fatal)),
        ("other_sxids_last_hour", records(other)),
        ("sxid", None if shown is None else shown.code),
        ("switch", None if shown is None else _switch(shown)),
        *event_evidence(shown),
    )
    return Outcome("no NVSwitch errors", evidence, tuple(problems))
