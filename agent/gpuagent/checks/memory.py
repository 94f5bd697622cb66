"""The small memory checks keep between polls: counter samples for rates, hold timers.

Everything is immutable; each poll builds the next memory from the previous one. It stays
bounded: samples leave once they fall out of their window (and a hard cap backs that up
for very short poll intervals), and GPUs that are no longer present are forgotten.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import TypedDict

# Thinning (SAMPLES_PER_WINDOW) keeps a series near 60 samples at any poll interval; the
# cap is a backstop so a series can never grow without end.
MAX_SAMPLES = 4096
SAMPLES_PER_WINDOW = 60

Sample = tuple[float, int]  # (monotonic seconds, counter value)


@dataclass(frozen=True, slots=True)
class Rate:
    """How much a counter grew between the first and last sample of its series."""

    increase: int
    span_seconds: float
    samples: int
    window_seconds: float

    @property
    def per_second(self) -> float:
        # Until the series covers a whole window, divide by the window, not the span:
        # "N errors in the last window" rather than extrapolating one early error into a
        # huge rate, which would alarm on the first corrected error after a restart.
        return self.increase / max(self.span_seconds, self.window_seconds)


@dataclass(frozen=True, slots=True)
class CounterSeries:
    """Recent samples of one monotonically increasing counter.

    ``source`` names which counter was sampled (the ECC check falls back from the
    aggregate to the volatile counter); samples of different counters never mix.
    """

    source: str = ""
    samples: tuple[Sample, ...] = ()

    def observe(self, now: float, value: int | None, source: str, window: float) -> CounterSeries:
        """The series after sampling ``value`` at ``now``, keeping ``window`` seconds."""
        # Samples at or after ``now`` can only come from a clock that went backwards; dropping
        # them keeps the series strictly increasing in time, so the window is found by
        # bisection (a GPU observes several series every poll).
        samples = self.samples
        end = len(samples) if not samples or samples[-1][0] < now else bisect_left(samples, (now,))
        kept = samples[bisect_left(samples, (now - window,), 0, end) : end]
        if value is None:
            return CounterSeries(self.source, kept)
        # A counter that went down was reset (GPU reset, driver reload): measuring across
        # the reset would give a negative or meaningless rate, so the series starts over.
        if source != self.source or (kept and value < kept[-1][1]):
            kept = ()
        # Thin the series to about one sample per 1/60 of the window (the newest one always
        # kept): rates stay accurate and the memory stays small at any poll interval.
        if len(kept) >= 2 and now - kept[-2][0] < window / SAMPLES_PER_WINDOW:
            kept = kept[:-1]
        return CounterSeries(source, (*kept, (now, value))[-MAX_SAMPLES:])

    def rate(self, window: float) -> Rate | None:
        """Growth over the series, or None until two samples span some time."""
        if len(self.samples) < 2:
            return None
        (first_t, first_v), (last_t, last_v) = self.samples[0], self.samples[-1]
        span = last_t - first_t
        if span <= 0:
            return None
        return Rate(
            increase=last_v - first_v,
            span_seconds=span,
            samples=len(self.samples),
            window_seconds=window,
        )


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """What the rate and hold-time checks remember about one GPU."""

    sbe: CounterSeries = field(default_factory=CounterSeries)
    pcie_replay: CounterSeries = field(default_factory=CounterSeries)
    # When the PCIe link was first seen degraded in the current unbroken run of degraded
    # polls; None while the link looks fine (or the GPU could not be read).
    pcie_degraded_since: float | None = None
    # The same for each bridge above the GPU whose link is degraded now: (bus id, since).
    bridge_degraded_since: tuple[tuple[str, float], ...] = ()
    # Corrected AER errors summed over the GPU and its bridges (sysfs totals); the source
    # names the functions summed, so a function appearing or vanishing starts a new series.
    aer_corrected: CounterSeries = field(default_factory=CounterSeries)
    # NVML's throttle-duration counters for heat and the power brake (ns, summed), sampled
    # only while the GPU is busy: an idle poll ends the series, so only busy time counts.
    throttle: CounterSeries = field(default_factory=CounterSeries)
    # When the fabric's route or access-timeout recovery was first seen in the current
    # unbroken run of polls reporting it; None while none is in progress.
    fabric_recovery_since: float | None = None
    # Uncorrectable (non-fatal + fatal) AER totals per function when first seen, or after
    # the counter went down: anything above this was seen while the agent watched.
    aer_uncorrectable_baseline: tuple[tuple[str, int], ...] = ()
    # NVLink error totals summed over the GPU's links. The CRC series sums the flit and data
    # counters (its source names which of the two the GPU reports, so a counter appearing
    # or vanishing starts a new series); replays and recoveries are judged on their own.
    nvlink_crc: CounterSeries = field(default_factory=CounterSeries)
    nvlink_replay: CounterSeries = field(default_factory=CounterSeries)
    nvlink_recovery: CounterSeries = field(default_factory=CounterSeries)
    c2c_errors: CounterSeries = field(default_factory=CounterSeries)  # CRC + replay + B2B
    # The processes check's hold timers (checks/processes.py): since when memory has been
    # held with no process; since when each listed PID has been missing from procfs; since
    # when the GPU has done nothing with the processes in ``idle_pids`` on it.
    memory_held_since: float | None = None
    pids_gone_since: tuple[tuple[int, float], ...] = ()
    idle_since: float | None = None
    idle_pids: tuple[int, ...] = ()


class MemoryChanges(TypedDict, total=False):
    """The fields of a GpuMemory one check's ``remember_*`` changes: the engine applies all
    checks' changes in one copy (a copy per check was a fifth of judging a poll)."""

    sbe: CounterSeries
    pcie_replay: CounterSeries
    pcie_degraded_since: float | None
    bridge_degraded_since: tuple[tuple[str, float], ...]
    aer_corrected: CounterSeries
    throttle: CounterSeries
    fabric_recovery_since: float | None
    aer_uncorrectable_baseline: tuple[tuple[str, int], ...]
    nvlink_crc: CounterSeries
    nvlink_replay: CounterSeries
    nvlink_recovery: CounterSeries
    c2c_errors: CounterSeries
    memory_held_since: float | None
    pids_gone_since: tuple[tuple[int, float], ...]
    idle_since: float | None
    idle_pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class IbMemory:
    """What the infiniband check remembers about the node's RDMA ports ("mlx5_0/1")."""

    # Physical-layer errors summed over the port's counters, and its link_downed counter.
    errors: tuple[tuple[str, CounterSeries], ...] = ()
    downed: tuple[tuple[str, CounterSeries], ...] = ()
    # Ports seen ACTIVE while the agent ran (a port never up is most likely unused).
    seen_active: frozenset[str] = frozenset()


@dataclass(frozen=True)
class HealthMemory:
    """Per-GPU memory keyed by PCI bus id, and the node's RDMA ports. ``HealthMemory()``
    is the empty start state."""

    gpus: tuple[tuple[str, GpuMemory], ...] = ()
    infiniband: IbMemory = field(default_factory=IbMemory)

    def for_gpu(self, pci_bus_id: str) -> GpuMemory:
        return next((m for bus_id, m in self.gpus if bus_id == pci_bus_id), GpuMemory())
