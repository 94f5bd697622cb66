"""The ``recovery`` check: the driver's recovery action, repairs pending, unrepairable
memory; and, end to end, a GPU that asks for a reset is CRITICAL in the first snapshot a
freshly started agent takes, live (simulated beneath pynvml) and replayed from a capture."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from conftest import DaemonProcess, FakeClock, MakeNode, run_cli
from gpuagent.model import Severity
from test_checks_support import check_once, check_series

# (NVML code, severity, action, reason fragment), from nvmlDeviceGpuRecoveryAction_t.
ACTIONS = [
    (pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET, "reset_gpu", "GPU reset required"),
    (pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT, "drain_and_reboot", "node reboot required"),
    (pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P, "drain_and_reset", "drained"),
    (pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET, "drain_and_reset", "drain and GPU reset"),
    (pynvml.NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN, "investigate", "IMEX domain"),
    (pynvml.NVML_GPU_RECOVERY_ACTION_BUS_RESET, "reset_gpu", "PCIe bus reset"),
    (pynvml.NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT, "drain_and_reboot", "system reboot"),
    (42, "investigate", "unknown (42)"),  # a newer driver's action: still not healthy
]


@pytest.mark.parametrize(("code", "action", "reason"), ACTIONS)
def test_a_pending_recovery_action_is_critical_with_its_action(
    code: int, action: str, reason: str
) -> None:
    found = check_once("recovery", recovery_action=code)
    assert (found.severity, found.action, found.runbook) == (
        Severity.CRITICAL,
        action,
        "gpu-recovery-action",
    )
    assert reason in found.reason


def test_no_action_no_repair_is_ok_and_names_what_it_read() -> None:
    found = check_once(
        "recovery",
        recovery_action=0,
        channel_repair_pending=False,
        tpc_repair_pending=False,
        unrepairable_memory=False,
    )
    assert found.severity is Severity.OK
    assert found.evidence_dict()["recovery_action"] == "none"


def test_a_driver_without_the_fields_is_not_a_finding() -> None:
    found = check_once("recovery")
    assert found.severity is Severity.OK
    assert found.reason == "recovery state not reported by this driver"


def test_unrepairable_memory_is_critical_and_repairs_pending_warn() -> None:
    unrepairable = check_once("recovery", recovery_action=0, unrepairable_memory=True)
    assert (unrepairable.severity, unrepairable.action) == (Severity.CRITICAL, "reseat_or_replace")
    assert unrepairable.runbook == "gpu-unrepairable-memory"
    pending = check_once(
        "recovery", recovery_action=0, channel_repair_pending=True, tpc_repair_pending=True
    )
    assert (pending.severity, pending.action, pending.runbook) == (
        Severity.WARN,
        "reset_gpu",
        "gpu-repair-pending",
    )
    assert pending.reason == "channel and TPC repair pending; takes effect at the next reset"


def test_the_finding_stays_until_nvml_says_none() -> None:
    reset = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    steps = [(0.0, {"recovery_action": reset}), (600.0, {"recovery_action": reset})]
    steps.append((601.0, {"recovery_action": 0}))
    severities = [f.severity for f in check_series("recovery", steps)]
    assert severities == [Severity.CRITICAL, Severity.CRITICAL, Severity.OK]


# --- the simulator: the fault kinds, and what a reset does ------------------------------


def _field(handle: object, field_id: int) -> tuple[int, int]:
    (value,) = pynvml.nvmlDeviceGetFieldValues(handle, [field_id])
    return value.nvmlReturn, value.value.uiVal


def test_the_simulated_gpu_reports_and_a_reset_completes_reset_actions(
    make_node: MakeNode,
) -> None:
    node = make_node("[node]\ngpus = 2\n", clock=FakeClock())
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    field = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    assert _field(handle, field) == (pynvml.NVML_SUCCESS, 0)
    assert pynvml.nvmlDeviceGetRepairStatus(handle) == [0, 0]
    assert pynvml.nvmlDeviceGetUnrepairableMemoryFlag_v1(handle) == 0
    node.inject("recovery_action", 0, {"action": "drain_and_reset"})
    node.inject("repair_pending", 0, {"unit": "tpc"})
    assert _field(handle, field) == (pynvml.NVML_SUCCESS, 4)
    assert pynvml.nvmlDeviceGetRepairStatus(handle) == [0, 1]
    node.reset_gpu(0)
    assert _field(handle, field) == (pynvml.NVML_SUCCESS, 0)
    assert pynvml.nvmlDeviceGetRepairStatus(handle) == [0, 0]
    # A reboot is not done by a GPU reset; `clear` stands for the reboot.
    node.inject("recovery_action", 0, {"action": "reboot"})
    node.inject("unrepairable_memory", 0, {})
    node.reset_gpu(0)
    assert _field(handle, field) == (pynvml.NVML_SUCCESS, 2)
    assert pynvml.nvmlDeviceGetUnrepairableMemoryFlag_v1(handle) == 1
    node.inject("clear", 0, {})
    assert _field(handle, field) == (pynvml.NVML_SUCCESS, 0)
    assert pynvml.nvmlDeviceGetUnrepairableMemoryFlag_v1(handle) == 0


# --- end to end: the first snapshot of a freshly started agent ---------------------------


def _recovery(tmp_path: Path, *scenario: str) -> tuple[int, list[dict[str, object]]]:
    """`gpuagent check` on ``scenario``: its exit code and GPU 0's recovery findings (the
    status document lists the findings that are not OK)."""
    path = tmp_path / "scenario.toml"
    path.write_text("\n".join(scenario) + "\n")
    result = run_cli("check", "--json", "--simulate", str(path))
    assert "Traceback" not in result.stderr, result.stderr
    doc = json.loads(result.stdout)
    findings = doc["gpus"][0]["findings"]
    return result.returncode, [f for f in findings if f["check"] == "recovery"]


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ('kind = "recovery_action"\naction = "reset"', [("CRITICAL", "reset_gpu")]),
        ('kind = "unrepairable_memory"', [("CRITICAL", "reseat_or_replace")]),
        ('kind = "repair_pending"\nunit = "channel"', [("WARN", "reset_gpu")]),
    ],
    ids=["recovery_action", "unrepairable_memory", "repair_pending"],
)
def test_what_the_driver_asks_for_is_in_the_first_snapshot(
    tmp_path: Path, fault: str, expected: list[tuple[str, str]]
) -> None:
    # The Xid that set it is long gone from the kernel log: only NVML still says so.
    code, found = _recovery(tmp_path, "[node]\ngpus = 1", f"[[fault]]\ngpu = 0\n{fault}")
    assert code == {"CRITICAL": 2, "WARN": 1}[expected[0][0]]
    assert [(f["severity"], f["action"]) for f in found] == expected


def test_a_replayed_capture_carries_its_recovery_action(tmp_path: Path) -> None:
    capture = Path(__file__).parent / "data" / "real-hosts" / "h200-x1.580.159.04.nvidia-smi-q.txt"
    text = capture.read_text()
    assert _recovery(tmp_path, f'[node]\nnvidia_smi = "{capture}"') == (0, [])
    line = "    GPU Recovery Action                                : None"
    assert line in text
    broken = tmp_path / "broken.txt"
    broken.write_text(text.replace(line, line.replace("None", "Drain and Reset")))
    code, found = _recovery(tmp_path, f'[node]\nnvidia_smi = "{broken}"')
    assert code == 2
    assert [(f["severity"], f["action"]) for f in found] == [("CRITICAL", "drain_and_reset")]


def test_the_driver_event_has_the_daemon_read_a_new_action_at_once(
    run_daemon: Callable[..., DaemonProcess],
) -> None:
    """Recovery state is read on the slow cadence (an hour here); NVML's recovery-action
    event makes the daemon read it at the next poll instead."""
    daemon = run_daemon("[node]\ngpus = 2\n", interval=0.5, slow_interval=3600)
    daemon.wait_for(lambda d: d["node"]["health"] == "OK" and len(d["gpus"]) == 2)
    daemon.inject("recovery_action", 1, action="reboot")
    doc = daemon.wait_for(
        lambda d: any(f["check"] == "recovery" for f in d["gpus"][1]["findings"]), timeout=10
    )
    (found,) = (f for f in doc["gpus"][1]["findings"] if f["check"] == "recovery")
    assert (found["severity"], found["action"]) == ("CRITICAL", "drain_and_reboot")
    assert "recovery action changed" in (daemon.workdir / "daemon.log").read_text()
