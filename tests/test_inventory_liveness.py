"""Service liveness: down only after several probes in a row, flapping by systemd's
restart counter, a probe that could not be answered changing nothing, and the IMEX
daemon's own readiness judged the same way."""

from __future__ import annotations

from gpuagent.inventory.liveness import ServiceLiveness
from gpuagent.inventory.model import Service, ServiceState

FM = "nvidia-fabricmanager"
IMEX = "nvidia-imex"


def _tracker() -> ServiceLiveness:
    return ServiceLiveness(down_probes=3, restart_limit=3, restart_window_seconds=600.0)


def _probe(
    tracker: ServiceLiveness, state: ServiceState, restarts: int | None = 0, at: float = 0.0
) -> Service:
    (observed,) = tracker.observe((Service(FM, state, restarts),), at)
    return observed


def test_down_only_after_three_probes_in_a_row() -> None:
    tracker = _tracker()
    first = _probe(tracker, "failed", at=0.0)
    assert (first.down_probes, first.pending) == (1, True)
    assert _probe(tracker, "failed", at=30.0).pending
    third = _probe(tracker, "failed", at=60.0)
    assert (third.down_probes, third.pending) == (3, False)
    # Back up: the streak ends.
    assert _probe(tracker, "active", at=90.0).down_probes == 0


def test_a_stop_in_passing_never_reaches_down() -> None:
    tracker = _tracker()
    states: list[ServiceState] = ["active", "inactive", "active", "failed", "active", "failed"]
    observed = [_probe(tracker, state, at=30.0 * n) for n, state in enumerate(states)]
    assert all(o.pending or o.down_probes == 0 for o in observed)


def test_an_unanswered_probe_keeps_what_was_known() -> None:
    tracker = _tracker()
    for n in range(3):
        down = _probe(tracker, "failed", at=30.0 * n)
    unknown = _probe(tracker, "unknown", restarts=None, at=90.0)
    assert unknown == down  # a failed probe never clears a fault
    assert _probe(tracker, "failed", at=120.0).down_probes == 4


def _ask_imex(
    tracker: ServiceLiveness, readiness: str | None, at: float, state: ServiceState = "active"
) -> Service:
    (observed,) = tracker.observe((Service(IMEX, state, 0, readiness=readiness),), at)
    return observed


def test_imex_not_ready_only_after_three_answers_in_a_row() -> None:
    tracker = _tracker()
    assert not _ask_imex(tracker, "READY", 0.0).not_ready
    first = _ask_imex(tracker, "UNAVAILABLE", 30.0)
    assert (first.unready_probes, first.readiness_pending, first.not_ready) == (1, True, False)
    # No answer (the command service did not reply) neither counts nor clears.
    unanswered = _ask_imex(tracker, None, 60.0)
    assert (unanswered.readiness, unanswered.unready_probes) == ("UNAVAILABLE", 1)
    _ask_imex(tracker, "UNAVAILABLE", 90.0)
    third = _ask_imex(tracker, "UNAVAILABLE", 120.0)
    assert (third.unready_probes, third.not_ready) == (3, True)
    assert not _ask_imex(tracker, "READY", 150.0).not_ready
    # Stopped: that is the down rule's, not a readiness left over from before.
    stopped = _ask_imex(tracker, None, 180.0, "failed")
    assert (stopped.readiness, stopped.not_ready) == (None, False)


def test_restarts_within_the_window_make_it_flapping() -> None:
    tracker = _tracker()
    assert not _probe(tracker, "active", restarts=7, at=0.0).flapping  # old restarts
    assert _probe(tracker, "activating", restarts=8, at=60.0).recent_restarts == 1
    assert not _probe(tracker, "active", restarts=9, at=120.0).flapping
    flapping = _probe(tracker, "active", restarts=10, at=180.0)
    assert (flapping.recent_restarts, flapping.flapping) == (3, True)
    # Ten minutes without a restart: the window has let them go.
    calm = _probe(tracker, "active", restarts=10, at=181.0 + 600.0)
    assert (calm.recent_restarts, calm.flapping) == (0, False)


def test_a_zeroed_counter_is_a_new_start_not_lost_restarts() -> None:
    tracker = _tracker()
    _probe(tracker, "active", restarts=5, at=0.0)
    # `systemctl reset-failed` (or a start by hand) zeroed it, then two restarts came.
    assert _probe(tracker, "active", restarts=2, at=30.0).recent_restarts == 2
    assert _probe(tracker, "active", restarts=3, at=60.0).flapping


def test_without_a_restart_counter_nothing_is_counted() -> None:
    tracker = _tracker()
    for n in range(5):
        observed = _probe(tracker, "active", restarts=None, at=30.0 * n)
    assert (observed.recent_restarts, observed.flapping) == (0, False)
