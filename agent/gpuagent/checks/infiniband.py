"""``infiniband``: the node's RDMA ports (InfiniBand, or RoCE on Ethernet) carry NCCL's
inter-node traffic. A port down, slow or erring hangs or slows every multi-node job with
no XID on any GPU, and without nvidia_peermem GPUDirect RDMA silently falls back to
staging through host memory.

Which ports are judged: every port of the HCAs in ``inventory.expected.hcas`` and, with
no such list, every port seen ACTIVE while the agent ran (a port that never came up is
most likely unused: a second port without a cable). The error counters count since the
driver loaded, so only their growth while the agent watches is judged, as for NVLink; a
counter going down (a reset) starts a new series.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from gpuagent.checks.common import Evidence, Outcome, Problem, fmt, plural
from gpuagent.checks.memory import CounterSeries, IbMemory
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.config import InfinibandCheck
from gpuagent.model import IbDevice, IbPort, Severity

# Port counters that only move on a bad link (cable, transceiver, port): the InfiniBand
# specification's PortCounters errors. Transmit discards and waits are left out: they rise
# with congestion on a healthy fabric. link_downed is judged on its own (a flap).
ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
LINK_DOWNED = "link_downed"
PEERMEM = "nvidia_peermem"


@dataclass(frozen=True, slots=True)
class IbExpected:
    """The node's RDMA expectations ([inventory.expected]); empty means none."""

    hcas: tuple[str, ...] = ()
    rate_gbps: float = 0.0  # 0: the most common rate of the node's active ports
    gpudirect: bool = False

    @property
    def any(self) -> bool:
        return bool(self.hcas) or self.rate_gbps > 0 or self.gpudirect


@dataclass(frozen=True, slots=True)
class IbInput:
    """What the engine is given for this check each poll."""

    devices: tuple[IbDevice, ...] | None  # None: /sys/class/infiniband cannot be listed
    expected: IbExpected = IbExpected()
    peermem_loaded: bool | None = None  # None: the loaded modules are not known


@dataclass(frozen=True, slots=True)
class IbView:
    """Everything the check looks at; ``memory`` already holds this poll's samples."""

    devices: tuple[IbDevice, ...] | None
    memory: IbMemory
    config: InfinibandCheck
    expected: IbExpected = IbExpected()
    peermem_loaded: bool | None = None


def applies(view: IbView) -> bool:
    """Whether the node has anything to judge: RDMA devices now, ports seen before, or
    an expectation. A node with none of them gets no ``infiniband`` finding at all."""
    return bool(view.devices) or bool(view.memory.seen_active) or view.expected.any


def _error_total(port: IbPort) -> int | None:
    known = [v for v in (port.counter(name) for name in ERROR_COUNTERS) if v is not None]
    return sum(known) if known else None


def remember_infiniband(
    memory: IbMemory, devices: tuple[IbDevice, ...] | None, config: InfinibandCheck, now: float
) -> IbMemory:
    """Add this poll's samples. Ports seen ACTIVE stay remembered after they vanish, so an
    HCA that drops out of sysfs is still judged."""
    if devices is None:
        return memory
    window = config.rate_window_seconds
    ports = [port for device in devices for port in device.ports]
    errors, downed = dict(memory.errors), dict(memory.downed)

    def error_series(p: IbPort) -> CounterSeries:
        return errors.get(p.key, CounterSeries()).observe(now, _error_total(p), "errors", window)

    def downed_series(p: IbPort) -> CounterSeries:
        previous = downed.get(p.key, CounterSeries())
        return previous.observe(now, p.counter(LINK_DOWNED), LINK_DOWNED, window)

    # Ports no longer present drop their series: a port that comes back starts afresh.
    return IbMemory(
        errors=tuple((p.key, error_series(p)) for p in ports),
        downed=tuple((p.key, downed_series(p)) for p in ports),
        seen_active=memory.seen_active | {p.key for p in ports if p.active},
    )


def check_infiniband(view: IbView) -> Outcome:
    devices, expected = view.devices, view.expected
    if devices is None:
        return Outcome("RDMA devices cannot be read (/sys/class/infiniband)")
    names = {d.name for d in devices}
    judged = [p for d in devices for p in d.ports if _judged(p, view.memory, expected)]
    rates = _expected_rates(judged, expected.rate_gbps)
    evidence: Evidence = (
        ("hcas", ",".join(sorted(names)) or None),
        ("ports_active", sum(p.active for d in devices for p in d.ports)),
        ("ports_judged", len(judged)),
        ("expected_rate_gbps", ",".join(fmt(r) for r in sorted(set(rates.values()))) or None),
        ("nvidia_peermem", view.peermem_loaded),
    )
    problems = [
        *_missing_problems(devices, view.memory, expected),
        *_down_problems(judged),
        *_rate_problems(judged, rates),
        *_error_problems(judged, view),
        *_peermem_problems(expected, view.peermem_loaded),
    ]
    if judged:
        ok = f"{plural(len(judged), 'RDMA port')} active at full rate, no link errors"
    elif names:
        ok = f"{plural(len(names), 'RDMA device')}, no port in use"
    else:
        ok = "no RDMA device"
    return Outcome(ok, evidence, tuple(problems))


def _judged(port: IbPort, memory: IbMemory, expected: IbExpected) -> bool:
    if expected.hcas:
        return port.device in expected.hcas
    return port.key in memory.seen_active


def _missing_problems(
    devices: tuple[IbDevice, ...], memory: IbMemory, expected: IbExpected
) -> list[Problem]:
    present = {d.name for d in devices}
    # With a list, exactly the listed HCAs matter (an unlisted front-end NIC may come and
    # go); without one, every HCA whose port was seen ACTIVE.
    wanted = set(expected.hcas) or {key.split("/", 1)[0] for key in memory.seen_active}
    missing = sorted(wanted - present)
    if not missing:
        return []
    noun = "HCAs" if len(missing) > 1 else "HCA"
    return [
        Problem(
            Severity.CRITICAL,
            f"RDMA {noun} missing from /sys/class/infiniband: {', '.join(missing)}",
            Action.INVESTIGATE,
            Runbook.NODE_IB_HCA_MISSING,
        )
    ]


def _down_problems(ports: list[IbPort]) -> list[Problem]:
    down = [p for p in ports if not p.active]
    if not down:
        return []
    listed = ", ".join(f"{p.key} {p.state or '?'}/{p.phys_state or '?'}" for p in down)
    noun = "ports" if len(down) > 1 else "port"
    return [
        Problem(
            Severity.CRITICAL,
            f"RDMA {noun} not ACTIVE/LinkUp: {listed}",
            Action.INVESTIGATE,
            Runbook.NODE_IB_PORT_DOWN,
        )
    ]


def _expected_rates(ports: list[IbPort], configured: float) -> dict[str, float]:
    """The rate each link layer's ports should run at: the configured one, else the most
    common among the active ports of that layer (an Ethernet NIC is not held to the
    InfiniBand rate)."""
    by_layer: dict[str, Counter[float]] = {}
    for port in ports:
        if port.active and port.rate_gbps is not None:
            by_layer.setdefault(port.link_layer, Counter())[port.rate_gbps] += 1
    if configured > 0:
        return dict.fromkeys({p.link_layer for p in ports}, configured)
    # Ties go to the faster rate: two ports at 400 and two at 200 make the 200s slow.
    return {
        layer: max(counts.items(), key=lambda item: (item[1], item[0]))[0]
        for layer, counts in by_layer.items()
    }


def _rate_problems(ports: list[IbPort], rates: dict[str, float]) -> list[Problem]:
    slow = [
        (p, rates[p.link_layer])
        for p in ports
        if p.active
        and p.rate_gbps is not None
        and p.link_layer in rates
        and p.rate_gbps < rates[p.link_layer]
    ]
    if not slow:
        return []
    listed = ", ".join(f"{p.key} {fmt(p.rate_gbps or 0)} Gb/s (want {fmt(r)})" for p, r in slow)
    noun = "links" if len(slow) > 1 else "link"
    return [
        Problem(
            Severity.WARN,
            f"RDMA {noun} below the expected rate: {listed}",
            Action.RESEAT_OR_REPLACE,
            Runbook.NODE_IB_RATE,
        )
    ]


def _error_problems(ports: list[IbPort], view: IbView) -> list[Problem]:
    config = view.config
    errors, downed = dict(view.memory.errors), dict(view.memory.downed)
    erring: list[str] = []
    flapping: list[str] = []
    for port in ports:
        rate = errors.get(port.key, CounterSeries()).rate(config.rate_window_seconds)
        if rate is not None and rate.per_second * 60 > config.link_errors_per_minute:
            erring.append(f"{port.key} {rate.increase} in {fmt(rate.span_seconds)} s")
        flaps = downed.get(port.key, CounterSeries()).rate(config.rate_window_seconds)
        if flaps is not None and flaps.increase > 0:
            times = "time" if flaps.increase == 1 else "times"
            flapping.append(f"{port.key} {flaps.increase} {times} in {fmt(flaps.span_seconds)} s")
    problems = []
    if erring:
        problems.append(
            Problem(
                Severity.WARN,
                f"RDMA link errors above {fmt(config.link_errors_per_minute)}/min: "
                + ", ".join(erring),
                Action.RESEAT_OR_REPLACE,
                Runbook.NODE_IB_ERRORS,
            )
        )
    if flapping:
        problems.append(
            Problem(
                Severity.WARN,
                "RDMA link went down and retrained: " + ", ".join(flapping),
                Action.RESEAT_OR_REPLACE,
                Runbook.NODE_IB_ERRORS,
            )
        )
    return problems


def _peermem_problems(expected: IbExpected, loaded: bool | None) -> list[Problem]:
    if not expected.gpudirect or loaded is not False:
        return []
    return [
        Problem(
            Severity.WARN,
            f"GPUDirect RDMA expected but {PEERMEM} is not loaded: "
            "RDMA traffic is staged through host memory",
            Action.LOAD_DRIVER,
            Runbook.NODE_IB_PEERMEM,
        )
    ]
