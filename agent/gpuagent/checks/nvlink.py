"""``nvlink``: every NVLink the GPU has should be up, and its links should not be erring.

A down link halves (or worse) the bandwidth of collective operations and usually hangs
multi-GPU jobs that expect the full fabric.

The error counters (summed over the GPU's links) count since the driver loaded, so a
healthy node may carry old errors: only growth while the agent watches is judged, never
the totals, and an agent restart starts from fresh samples. As in DCGM's health watch,
any replay or recovery error is a problem (a replay retransmits a flit the receiver
rejected, a recovery retrains the link), while CRC errors only are one when they come
faster than ``crc_rate_per_second``: a few are absorbed by replays. Each link's own
bit-error rate (measured by the link, not a counter) is judged as read: effective BER
above ``effective_ber_limit`` (DCGM's 1e-12), symbol BER above ``symbol_ber_limit`` when
one is set.

Right after a boot the links are still training: for ``boot_grace_seconds`` after the
node booted a link down is shown, not judged (the error counters and rates are judged as
ever). A kernel-log XID about a link is the ``xid`` check's, and is never held back.
"""

from __future__ import annotations

from gpuagent.checks.common import (
    Evidence,
    GpuView,
    Outcome,
    Problem,
    boot_evidence,
    fmt,
    in_boot_grace,
    plural,
)
from gpuagent.checks.memory import CounterSeries, GpuMemory, MemoryChanges, Rate
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.config import NvlinkCheck
from gpuagent.model import GpuReadings, Severity


def _crc_sample(readings: GpuReadings) -> tuple[int | None, str]:
    """The flit and data CRC totals summed, and which of the two the GPU reports."""
    counters = (
        ("flit", readings.nvlink_crc_flit_errors),
        ("data", readings.nvlink_crc_data_errors),
    )
    reported = [(name, value) for name, value in counters if value is not None]
    if not reported:
        return None, ""
    return sum(value for _, value in reported), "+".join(name for name, _ in reported)


def remember_nvlink(
    memory: GpuMemory, readings: GpuReadings | None, config: NvlinkCheck, now: float
) -> MemoryChanges:
    """Add this poll's error samples; an unread GPU (``readings`` None) only ages old ones."""
    window = config.rate_window_seconds
    if readings is None:
        # A missing value never starts a new series, whatever source it is given.
        crc, source, replay, recovery, c2c = None, "", None, None, None
    else:
        crc, source = _crc_sample(readings)
        replay, recovery = readings.nvlink_replay_errors, readings.nvlink_recovery_errors
        c2c = _c2c_sample(readings)
    return MemoryChanges(
        nvlink_crc=memory.nvlink_crc.observe(now, crc, source, window),
        nvlink_replay=memory.nvlink_replay.observe(now, replay, "replay", window),
        nvlink_recovery=memory.nvlink_recovery.observe(now, recovery, "recovery", window),
        c2c_errors=memory.c2c_errors.observe(now, c2c, "c2c", window),
    )


def _c2c_sample(readings: GpuReadings) -> int | None:
    """The C2C error counters summed; None unless the GPU reports all three."""
    counters = [value for _, value in readings.c2c_errors if value is not None]
    return sum(counters) if len(counters) == len(readings.c2c_errors) else None


def _per_second(value: float) -> str:
    # fmt's one decimal would turn a single error in a minute into "0 per second".
    return fmt(value) if value >= 1 else f"{value:.2g}"


def _crc_problem(series: CounterSeries, rate: Rate | None, limit: float) -> Problem | None:
    if rate is None or rate.per_second <= limit:
        return None
    reason = (
        f"{_per_second(rate.per_second)} NVLink CRC errors ({series.source}) per second "
        f"({rate.increase} in {fmt(rate.span_seconds)} s), above {fmt(limit)}"
    )
    return Problem(Severity.WARN, reason, Action.INVESTIGATE, Runbook.GPU_NVLINK_ERRORS)


def _growth_problem(kind: str, rate: Rate | None) -> Problem | None:
    """Any replay or recovery error between samples, however few."""
    if rate is None or rate.increase <= 0:
        return None
    reason = (
        f"{plural(rate.increase, f'new NVLink {kind} error')} in {fmt(rate.span_seconds)} s "
        f"({_per_second(rate.per_second)} per second)"
    )
    return Problem(Severity.WARN, reason, Action.INVESTIGATE, Runbook.GPU_NVLINK_ERRORS)


def _ids(indices: list[int]) -> str:
    return ", ".join(str(i) for i in indices)


def _down_problem(links: tuple[bool | None, ...], down: list[int]) -> Problem | None:
    if not down:
        return None
    noun = "NVLink" if len(down) == 1 else "NVLinks"
    return Problem(
        Severity.CRITICAL,
        f"{noun} {_ids(down)} down ({len(down)} of {len(links)})",
        Action.DRAIN_AND_REBOOT,
        Runbook.GPU_NVLINK_DOWN,
    )


def _ber_problems(kind: str, rates: tuple[float | None, ...], limit: float) -> list[Problem]:
    """One problem per link whose bit-error rate is above ``limit`` (0: not judged)."""
    if limit <= 0:
        return []
    return [
        Problem(
            Severity.WARN,
            f"NVLink {link} {kind} bit-error rate {ber:.1g}, above {limit:g}",
            Action.INVESTIGATE,
            Runbook.GPU_NVLINK_BER,
            f"NVLink {link} {kind} BER",
        )
        for link, ber in enumerate(rates)
        if ber is not None and ber > limit
    ]


def _worst(rates: tuple[float | None, ...]) -> float | None:
    known = [ber for ber in rates if ber is not None]
    return max(known) if known else None


def _c2c_problems(links: tuple[bool | None, ...], rate: Rate | None) -> list[Problem]:
    """NVLink-C2C, the GPU's link to the CPU on Grace-Blackwell: a link down cuts the
    GPU's coherent path to host memory; errors between samples are its signal failing."""
    problems = []
    down = [str(index) for index, up in enumerate(links) if up is False]
    if down:
        problems.append(
            Problem(
                Severity.CRITICAL,
                f"C2C link {', '.join(down)} to the CPU down ({len(down)} of {len(links)})",
                Action.DRAIN_AND_REBOOT,
                Runbook.GPU_C2C_ERRORS,
                "C2C link down",
            )
        )
    if rate is not None and rate.increase > 0:
        problems.append(
            Problem(
                Severity.WARN,
                f"{plural(rate.increase, 'new C2C link error')} in {fmt(rate.span_seconds)} s "
                "(CRC, replay and back-to-back replay)",
                Action.INVESTIGATE,
                Runbook.GPU_C2C_ERRORS,
                "C2C link errors",
            )
        )
    return problems


def _per_second_or_none(rate: Rate | None) -> float | None:
    return None if rate is None else rate.per_second


def check_nvlink(view: GpuView) -> Outcome:
    readings, config, memory = view.readings, view.config.nvlink, view.memory
    window = config.rate_window_seconds
    links = readings.nvlink_up
    down = [index for index, up in enumerate(links) if up is False]
    up_count = sum(1 for up in links if up is True)
    training = bool(down) and in_boot_grace(view.boot)
    crc = memory.nvlink_crc.rate(window)
    replay = memory.nvlink_replay.rate(window)
    recovery = memory.nvlink_recovery.rate(window)
    c2c = memory.c2c_errors.rate(window)
    evidence: Evidence = (
        ("links", len(links)),
        ("links_up", up_count),
        ("links_down", ",".join(str(i) for i in down)),
        ("crc_flit_errors", readings.nvlink_crc_flit_errors),
        ("crc_data_errors", readings.nvlink_crc_data_errors),
        ("replay_errors", readings.nvlink_replay_errors),
        ("recovery_errors", readings.nvlink_recovery_errors),
        ("crc_errors_in_window", None if crc is None else crc.increase),
        ("crc_rate_per_second", _per_second_or_none(crc)),
        ("crc_rate_limit_per_second", config.crc_rate_per_second),
        ("replay_errors_in_window", None if replay is None else replay.increase),
        ("replay_rate_per_second", _per_second_or_none(replay)),
        ("recovery_errors_in_window", None if recovery is None else recovery.increase),
        ("recovery_rate_per_second", _per_second_or_none(recovery)),
        ("rate_window_seconds", window),
        ("effective_ber_max", _worst(readings.nvlink_effective_ber)),
        ("symbol_ber_max", _worst(readings.nvlink_symbol_ber)),
        ("c2c_links", len(readings.c2c_up)),
        ("c2c_crc_errors", readings.c2c_crc_errors),
        ("c2c_replay_errors", readings.c2c_replay_errors),
        ("c2c_replay_b2b_errors", readings.c2c_replay_b2b_errors),
        ("c2c_errors_in_window", None if c2c is None else c2c.increase),
        ("links_training", ",".join(str(i) for i in down) if training else ""),
        *boot_evidence(view.boot, config.boot_grace_seconds),
    )
    found = (
        None if training else _down_problem(links, down),
        _crc_problem(memory.nvlink_crc, crc, config.crc_rate_per_second),
        _growth_problem("replay", replay),
        _growth_problem("recovery", recovery),
    )
    problems = (
        *(p for p in found if p is not None),
        *_ber_problems("effective", readings.nvlink_effective_ber, config.effective_ber_limit),
        *_ber_problems("symbol", readings.nvlink_symbol_ber, config.symbol_ber_limit),
        *_c2c_problems(readings.c2c_up, c2c),
    )
    if not links:
        return Outcome("no NVLink", evidence, problems)
    if training and view.boot is not None:
        noun = "NVLink" if len(down) == 1 else "NVLinks"
        ok = (
            f"{up_count} of {len(links)} NVLinks up; {noun} {_ids(down)} down, training "
            f"{view.boot.words()}"
        )
        return Outcome(ok, evidence, problems)
    return Outcome(f"{up_count} of {len(links)} NVLinks up, none down", evidence, problems)
