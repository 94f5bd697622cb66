"""``processes``: GPU memory held with no process, processes gone from /proc, hung jobs.

Three ways a GPU is taken without doing work, each WARN and never acted on by the agent
(the remedy, ending a job or resetting a GPU someone may still use, is a person's call):

- memory held with no process: framebuffer use above ``leak_threshold_mib`` while NVML
  lists no process at all, for ``leak_seconds``. A driver's own share is reported apart
  (reserved) and idle GPUs use at most a few hundred MiB beyond it, so this is memory a
  context kept after its process ended: a leaked context, or a zombie NVML cannot name.
- processes gone: PIDs NVML lists that have had no /proc entry for ``gone_seconds``. The
  process has exited but the driver still holds its context (and memory). Judged only
  where procfs was consulted: readings replayed from `nvidia-smi` carry no such facts.
- hung: processes on a GPU whose utilization stayed at or below
  ``hung_utilization_pct`` for ``hung_seconds`` without a break, each named with its
  owner. Never judged where the GPU reports no utilization (MIG mode).

The hold timers live in GpuMemory (`remember_processes`), so one poll, such as a capture,
can never fire any of them (unless a hold time is configured as 0).
"""

from __future__ import annotations

from gpuagent.checks.common import Evidence, GpuView, Outcome, Problem, fmt, plural
from gpuagent.checks.memory import GpuMemory, MemoryChanges
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.config import ProcessesCheck
from gpuagent.model import GpuProcess, GpuReadings, Severity


def memory_held_without_process(readings: GpuReadings, config: ProcessesCheck) -> bool:
    """Framebuffer above the threshold while NVML lists no compute or graphics process."""
    used = readings.fb_used_mib
    if used is None or readings.processes or readings.graphics_processes:
        return False
    return used > config.leak_threshold_mib


def idle_with_processes(readings: GpuReadings, config: ProcessesCheck) -> bool:
    util = readings.utilization_gpu_pct
    return bool(readings.processes) and util is not None and util <= config.hung_utilization_pct


def unattributed_mib(readings: GpuReadings) -> float | None:
    """Framebuffer in use beyond what the listed processes hold (never below 0); None
    where memory use is not reported."""
    used = readings.fb_used_mib
    if used is None:
        return None
    held = readings.processes + readings.graphics_processes
    return max(used - sum(p.used_mib or 0.0 for p in held), 0.0)


def gone_pids(readings: GpuReadings) -> tuple[int, ...]:
    """PIDs NVML lists that procfs says do not exist (unknown is not gone)."""
    return tuple(p.pid for p in readings.processes if p.alive is False)


def remember_processes(
    memory: GpuMemory, readings: GpuReadings | None, config: ProcessesCheck, now: float
) -> MemoryChanges:
    """Start, keep or end each hold timer. An unread poll ends them all: nothing says the
    condition held through it."""
    if readings is None:
        return MemoryChanges(
            memory_held_since=None, pids_gone_since=(), idle_since=None, idle_pids=()
        )
    held_since = memory.memory_held_since if memory.memory_held_since is not None else now
    previous_gone = dict(memory.pids_gone_since)
    pids = tuple(sorted(p.pid for p in readings.processes))
    idle_since = memory.idle_since
    # A process the window did not start with is a new job: its window starts now.
    if idle_since is None or not set(pids) <= set(memory.idle_pids):
        idle_since = now
    idle = idle_with_processes(readings, config)
    return MemoryChanges(
        memory_held_since=held_since if memory_held_without_process(readings, config) else None,
        pids_gone_since=tuple((pid, previous_gone.get(pid, now)) for pid in gone_pids(readings)),
        idle_since=idle_since if idle else None,
        idle_pids=pids if idle else (),
    )


def describe(process: GpuProcess) -> str:
    """ "4242 python (alice, 2048 MiB)": what an operator needs to find the job. A process
    nobody could name ("pid 4242") is just its PID."""
    details = [process.user or "owner unknown"]
    if process.used_mib is not None:
        details.append(f"{fmt(process.used_mib)} MiB")
    named = "" if process.name == f"pid {process.pid}" else f" {process.name}"
    return f"{process.pid}{named} ({', '.join(details)})"


def _memory_held(view: GpuView) -> Problem | None:
    since, config = view.memory.memory_held_since, view.config.processes
    used = view.readings.fb_used_mib
    if since is None or used is None or view.now - since < config.leak_seconds:
        return None
    return Problem(
        Severity.WARN,
        f"{fmt(used)} MiB of GPU memory held with no process for {fmt(view.now - since)} s "
        "(a leaked context or a zombie process)",
        Action.INVESTIGATE,
        Runbook.GPU_MEMORY_HELD,
    )


def _gone(view: GpuView) -> Problem | None:
    since = dict(view.memory.pids_gone_since)
    limit = view.config.processes.gone_seconds
    gone = [
        p for p in view.readings.processes if p.pid in since and view.now - since[p.pid] >= limit
    ]
    if not gone:
        return None
    names = "; ".join(describe(p) for p in gone)
    return Problem(
        Severity.WARN,
        f"{plural(len(gone), 'process')} NVML lists no longer in /proc: {names}",
        Action.INVESTIGATE,
        Runbook.GPU_PROCESS_GONE,
    )


def _hung(view: GpuView) -> Problem | None:
    since, config = view.memory.idle_since, view.config.processes
    if since is None or view.now - since < config.hung_seconds:
        return None
    names = "; ".join(describe(p) for p in view.readings.processes)
    return Problem(
        Severity.WARN,
        f"utilization at or below {fmt(config.hung_utilization_pct)}% for "
        f"{fmt(view.now - since)} s with {plural(len(view.readings.processes), 'process')} "
        f"on the GPU (hung?): {names}",
        Action.RESTART_APP,
        Runbook.GPU_PROCESS_HUNG,
    )


def _ok_reason(readings: GpuReadings) -> str:
    if not readings.processes:
        return "no process on the GPU, no memory held"
    return f"{plural(len(readings.processes), 'process')} on the GPU"


def check_processes(view: GpuView) -> Outcome:
    readings, memory, now = view.readings, view.memory, view.now
    everyone = readings.processes + readings.graphics_processes
    evidence: Evidence = (
        ("processes", len(readings.processes)),
        ("graphics_processes", len(readings.graphics_processes)),
        ("process_list", "; ".join(describe(p) for p in everyone) or None),
        ("fb_used_mib", readings.fb_used_mib),
        ("fb_reserved_mib", readings.fb_reserved_mib),
        ("unattributed_mib", unattributed_mib(readings)),
        ("gone_pids", ", ".join(str(pid) for pid in gone_pids(readings)) or None),
        ("utilization_gpu_pct", readings.utilization_gpu_pct),
        (
            "memory_held_seconds",
            None if memory.memory_held_since is None else now - memory.memory_held_since,
        ),
        ("idle_seconds", None if memory.idle_since is None else now - memory.idle_since),
    )
    found = (_memory_held(view), _gone(view), _hung(view))
    problems = tuple(p for p in found if p is not None)
    return Outcome(_ok_reason(readings), evidence, problems)
