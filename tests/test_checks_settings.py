"""Settings: facts to show, findings only against what is declared or learned (or ours)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuagent.checks import HealthMemory, InventoryView, evaluate
from gpuagent.checks.settings import check_ecc_mode, check_settings, persistence_wanted
from gpuagent.config import ChecksSection
from gpuagent.inventory.baseline import Baseline, LearnedSettings
from gpuagent.model import GpuIdentity, GpuReadings, GpuState, NvmlStatus, Severity
from gpuagent.render import render_status
from test_checks_inventory import BUSES, CHECKS, expect, gpu, node, on, verdict

LEARNED = Baseline(
    {},
    settings=(
        LearnedSettings(
            0, persistence=True, power_limit_w=600.0, applications_clock_mhz=1755,
            compute_mode="exclusive_process",
        ),
    ),
)  # fmt: skip


def learned() -> InventoryView:
    return InventoryView(node(), expect(), LEARNED)


@pytest.mark.parametrize(
    ("current", "pending", "severity", "reason"),
    [
        (True, True, Severity.OK, "ECC mode on, nothing pending"),
        (None, None, Severity.OK, "ECC mode not supported, nothing pending"),
        (True, False, Severity.WARN, "ECC mode off is pending; reset required to apply ECC mode"),
        (False, True, Severity.WARN, "ECC mode on is pending; reset required to apply ECC mode"),
    ],
)
def test_ecc_mode(
    current: bool | None, pending: bool | None, severity: Severity, reason: str
) -> None:
    outcome = check_ecc_mode(gpu(0, ecc_current=current, ecc_pending=pending), on(expect()), CHECKS)
    runbook = "gpu-ecc-pending" if severity is Severity.WARN else ""
    assert verdict(outcome) == (severity, runbook, reason)


@pytest.mark.parametrize(
    ("changes", "view", "runbook", "reason"),
    [
        pytest.param({}, on(expect()), "", "power limit 700 W", id="default"),
        # A limit someone set on purpose: a fact without an expectation (an RTX 3090 at 200 W
        # of 350 W; an RTX 3080 at 336 W of 320 W).
        pytest.param(
            {"power_limit_w": 450.0}, on(expect()), "", "power limit 450 W, default 700 W",
            id="set-without-expectation",
        ),
        pytest.param(
            {"power_limit_w": 700.4}, on(expect(power_limit_watts=700)), "", "power limit 700.4 W",
            id="within-a-watt",
        ),
        pytest.param(
            {}, on(expect(power_limit_watts=600)), "gpu-power-limit-changed",
            "power limit 700 W requested, expected 600 W", id="declared-less",
        ),
        pytest.param(
            {}, learned(), "gpu-power-limit-changed", "power limit 700 W requested, baseline 600 W",
            id="learned-less",
        ),
        # A GH200: requested 900 W, its default, while the module enforces 700 W.
        pytest.param(
            {"power_limit_w": 700.0, "power_requested_limit_w": 900.0,
             "power_default_limit_w": 900.0},
            on(expect(power_limit_watts=900)), "",
            "power limit 700 W (the platform's; 900 W requested)", id="platform-limit",
        ),
        pytest.param(
            {"power_limit_w": 700.0, "power_requested_limit_w": 900.0,
             "power_default_limit_w": 900.0},
            on(expect()), "", "power limit 700 W (the platform's; 900 W requested)",
            id="platform-limit-without-expectation",
        ),
        # Our own thermal cap, left behind: a finding whatever is expected.
        pytest.param(
            {"power_limit_w": 490.0},
            InventoryView(node(), expect(), power_capped=((BUSES[0], 700.0),)),
            "gpu-power-limit-changed", "power limit 490 W is gpuagent's thermal cap (was 700 W)",
            id="our-cap",
        ),
        pytest.param(
            {"applications_clock_mhz": 1410, "clocks_set_by_user": True}, on(expect()), "",
            "applications clock 1410 MHz, default 1980; clocks set by a user",
            id="app-clocks-without-expectation",
        ),
        pytest.param(
            {"applications_clock_mhz": 1410}, on(expect(applications_clocks="default")),
            "gpu-clocks-set", "applications clock 1410 MHz, default 1980 MHz",
            id="app-clocks-declared-default",
        ),
        pytest.param(
            {"clocks_set_by_user": True}, on(expect(applications_clocks="default")),
            "gpu-clocks-set", "GPU clocks locked by a user setting", id="locked-declared-default",
        ),
        pytest.param(
            {"power_limit_w": 600.0, "compute_mode": "exclusive_process"}, learned(),
            "gpu-clocks-set", "applications clock 1980 MHz, baseline 1755 MHz",
            id="app-clocks-learned",
        ),
        pytest.param(
            {"compute_mode": "default"}, on(expect()), "", "compute mode default",
            id="compute-mode-fact",
        ),
        pytest.param(
            {"compute_mode": "default"}, on(expect(compute_mode="exclusive_process")),
            "gpu-compute-mode", "compute mode default, expected exclusive_process",
            id="compute-mode-declared",
        ),
        pytest.param(
            {"compute_mode": "default", "power_limit_w": 600.0, "applications_clock_mhz": 1755},
            learned(), "gpu-compute-mode", "compute mode default, baseline exclusive_process",
            id="compute-mode-learned",
        ),
        pytest.param(
            {"power_limit_w": None, "applications_clock_mhz": None, "clocks_set_by_user": None},
            on(expect(power_limit_watts=600, applications_clocks="default")), "",
            "power limit not reported", id="not-reported",
        ),
    ],
)  # fmt: skip
def test_settings(changes: dict[str, Any], view: InventoryView, runbook: str, reason: str) -> None:
    found, runbooks, text = verdict(check_settings(gpu(0, **changes), view, CHECKS))
    assert (found, runbooks) == (Severity.WARN if runbook else Severity.OK, runbook)
    assert reason in text


def test_settings_names_every_difference_together() -> None:
    outcome = check_settings(
        gpu(0, applications_clock_mhz=1410, compute_mode="prohibited"),
        on(expect(power_limit_watts=600, applications_clocks="default", compute_mode="default")),
        CHECKS,
    )
    assert len(outcome.problems) == 3


@pytest.mark.parametrize(
    ("declared", "baseline", "wanted"),
    [
        pytest.param("any", None, None, id="nothing"),
        pytest.param("enabled", None, (True, "expected"), id="declared"),
        pytest.param("any", LEARNED, (True, "baseline"), id="learned"),
        pytest.param("disabled", LEARNED, (False, "expected"), id="declared-wins"),
    ],
)
def test_the_expected_persistence_mode_is_declared_else_learned(
    declared: Any, baseline: Baseline | None, wanted: tuple[bool, str] | None
) -> None:
    view = InventoryView(node(), expect(persistence=declared), baseline)
    assert persistence_wanted(0, view) == wanted
    assert persistence_wanted(3, view) == (wanted if declared != "any" else None)


def test_the_engine_judges_persistence_against_the_learned_baseline() -> None:
    identity = GpuIdentity(index=0, pci_bus_id=BUSES[0], uuid="GPU-0", name="H100")
    state = GpuState(identity, "ok", GpuReadings(persistence_mode=False))
    for view, severity in ((on(expect()), Severity.OK), (learned(), Severity.WARN)):
        health, _ = evaluate(
            (state,), NvmlStatus(ok=True), ChecksSection(), HealthMemory(), 0.0, inventory=view
        )
        found = next(f for f in health.for_gpu(BUSES[0]) if f.check == "persistence")
        assert found.severity is severity


# --- shown: gpuagent status and its JSON ------------------------------------------------------


def test_status_shows_the_settings_of_gpus_that_share_them_once() -> None:
    gpu = {"persistence_mode": False, "ecc_enabled": True, "power_limit_w": 700.0}
    other = gpu | {"power_limit_w": 700.0, "power_requested_limit_w": 900.0, "mig_mode": True}
    same = [gpu | {"index": i} for i in range(4)]
    assert _settings(same) == ["Settings: persistence off, ECC on, power limit 700 W"]
    mixed = [*same[:2], other | {"index": 2}, other | {"index": 3, "compute_mode": "prohibited"}]
    assert _settings(mixed) == [
        "Settings of GPU 0,1: persistence off, ECC on, power limit 700 W",
        "Settings of GPU 2: persistence off, ECC on, power limit 700 W of 900 W asked, MIG on",
        (
            "Settings of GPU 3: persistence off, ECC on, power limit 700 W of 900 W asked, "
            "compute mode prohibited, MIG on"
        ),
    ]


def _settings(gpus: list[dict[str, Any]]) -> list[str]:
    doc = {"node": {"name": "n", "cluster": "c", "health": "OK"}, "taken_at": 0.0, "gpus": []}
    text = render_status(doc | {"gpus": [g | _ROW for g in gpus]}, now=0.0)
    return [line for line in text.splitlines() if line.startswith("Settings")]


_ROW = {"pci_bus_id": "0000:18:00.0", "status": "ok", "health": "OK", "findings": []}
