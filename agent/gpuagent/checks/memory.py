"""The small memory checks keep between polls: counter samples for rates, hold timers.

Everything is immutable; each poll builds the next memory from the previous one. It stays
bounded: samples leave once they fall out of their window (and a hard cap backs that up
for very short poll intervals), and GPUs that are no longer present are forgotten.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# With the default 5 s poll a one-hour window holds 720 samples; the cap only matters when
# someone polls far faster, where it shortens the window instead of growing without end.
MAX_SAMPLES = 4096

Sample = tuple[float, int]  # (monotonic seconds, counter value)


@dataclass(frozen=True, slots=True)
class Rate:
    """How much a counter grew between the first and last sample of its series."""

    increase: int
    span_seconds: float
    samples: int

    @property
    def per_second(self) -> float:
        return self.increase / self.span_seconds


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
        # them keeps the series strictly increasing in time.
        kept = tuple(s for s in self.samples if now - window <= s[0] < now)
        if value is None:
            return CounterSeries(self.source, kept)
        # A counter that went down was reset (GPU reset, driver reload): measuring across
        # the reset would give a negative or meaningless rate, so the series starts over.
        if source != self.source or (kept and value < kept[-1][1]):
            kept = ()
        return CounterSeries(source, (*kept, (now, value))[-MAX_SAMPLES:])

    def rate(self) -> Rate | None:
        """Growth over the series, or None until two samples span some time."""
        if len(self.samples) < 2:
            return None
        (first_t, first_v), (last_t, last_v) = self.samples[0], self.samples[-1]
        span = last_t - first_t
        if span <= 0:
            return None
        return Rate(increase=last_v - first_v, span_seconds=span, samples=len(self.samples))


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """What the rate and hold-time checks remember about one GPU."""

    sbe: CounterSeries = field(default_factory=CounterSeries)
    pcie_replay: CounterSeries = field(default_factory=CounterSeries)
    # When the PCIe link was first seen degraded in the current unbroken run of degraded
    # polls; None while the link looks fine (or the GPU could not be read).
    pcie_degraded_since: float | None = None


@dataclass(frozen=True)
class HealthMemory:
    """Per-GPU memory keyed by PCI bus id. ``HealthMemory()`` is the empty start state."""

    gpus: tuple[tuple[str, GpuMemory], ...] = ()

    def for_gpu(self, pci_bus_id: str) -> GpuMemory:
        return next((m for bus_id, m in self.gpus if bus_id == pci_bus_id), GpuMemory())
