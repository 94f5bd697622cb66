"""``kernel`` (node): NVIDIA driver messages that concern the node rather than one GPU.

- "API mismatch": a client's driver libraries differ from the loaded kernel module, the
  mark of a driver upgrade without a reboot. It stays CRITICAL while the event log keeps
  the line; the reboot that fixes it starts a new kernel log.
- "A GPU crash dump has been created": the driver saved state after a GPU failure; WARN
  for an hour, while the XID that caused it is judged by the ``xid`` check.
- GSP error messages that name no GPU the agent knows and come with no XID (those with
  a known GPU are judged by that GPU's ``xid`` check); WARN for an hour.

This check has no switch: these lines are rare, and each one needs a person.
"""

from __future__ import annotations

from gpuagent.checks.common import Evidence, NodeView, Outcome, Problem, plural
from gpuagent.checks.eventindex import RECENT_SECONDS, event_evidence, near, recent, times
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.checks.xid import GSP_XID_SECONDS, gsp_reason
from gpuagent.model import GpuEvent, Severity


def _node_gsp(view: NodeView) -> list[GpuEvent]:
    gsp = [
        e
        for e in recent(view.events.of_kind("gsp"), view.now, RECENT_SECONDS)
        if e.gpu not in view.gpus
    ]
    if not gsp:
        return []
    xid_times = times(view.events.of_kind("xid"))
    return [e for e in gsp if not near(e.monotonic, xid_times, GSP_XID_SECONDS)]


def check_kernel(view: NodeView) -> Outcome:
    mismatches = view.events.of_kind("driver_mismatch")
    dumps = recent(view.events.of_kind("crash_dump"), view.now, RECENT_SECONDS)
    gsp = _node_gsp(view)
    problems: list[Problem] = []
    shown: GpuEvent | None = None
    # Most severe first: the evidence shows the line of the problem the finding leads with.
    for events, severity, reason, action, runbook in (
        (
            mismatches,
            Severity.CRITICAL,
            f"driver/library version mismatch ({plural(len(mismatches), 'kernel message')})",
            Action.DRAIN_AND_REBOOT,
            Runbook.NODE_DRIVER_MISMATCH,
        ),
        (
            dumps,
            Severity.WARN,
            f"{plural(len(dumps), 'GPU crash dump')} created in the last hour",
            Action.INVESTIGATE,
            Runbook.NODE_CRASH_DUMP,
        ),
        (
            gsp,
            Severity.WARN,
            gsp_reason(view.events.records(gsp)),
            Action.INVESTIGATE,
            Runbook.NODE_GSP_ERROR,
        ),
    ):
        if events:
            problems.append(Problem(severity, reason, action, runbook))
            shown = shown or events[-1]
    evidence: Evidence = (
        ("driver_mismatch_events", len(mismatches)),
        ("crash_dumps_last_hour", len(dumps)),
        ("gsp_messages_last_hour", view.events.records(gsp)),
        *event_evidence(shown),
    )
    ok = "no driver mismatch, crash dump or unexplained GSP error in the kernel log"
    return Outcome(ok, evidence, tuple(problems))
