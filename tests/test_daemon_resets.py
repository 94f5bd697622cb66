"""Integration: GPU resets recorded by the daemon on a simulated node, and the
reset-required findings they clear."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import DaemonProcess, kernel_record, start_daemon, wait_until

pytestmark = pytest.mark.integration

SCENARIO = "[node]\ngpus = 2\n"
WAIT = 20.0  # seconds (times PATIENCE) for a condition to hold


def _findings(daemon: DaemonProcess, index: int) -> dict[str, dict[str, Any]]:
    """GPU ``index``'s findings by check (status lists problems only)."""
    gpu = next(g for g in daemon.status()["gpus"] if g["index"] == index)
    return {f["check"]: f for f in gpu["findings"]}


def _inject(daemon: DaemonProcess, kind: str, gpu: int, **values: Any) -> None:
    daemon.call("inject", {"kind": kind, "gpu": gpu, "values": values})


def test_the_simulators_reset_clears_a_reset_required_xid_48(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path / "node", SCENARIO)
    try:
        bus = daemon.status()["gpus"][1]["pci_bus_id"]
        # The driver's verdict on the DBE, and its kernel line.
        _inject(daemon, "recovery_action", 1, action="drain_and_reset")
        line = f"NVRM: Xid (PCI:{bus.rsplit('.', 1)[0]}): 48, pid=4242, name=python3, An "
        daemon.write_kernel_log(kernel_record(1, line + "uncorrectable double bit error"))
        wait_until(lambda: _findings(daemon, 1).get("xid", {}).get("severity") == "CRITICAL", WAIT)
        assert "drain and reset required" in _findings(daemon, 1)["xid"]["reason"]
        assert _findings(daemon, 0) == {}
        # `gpuagent inject clear` resets the simulated GPU: NVML's recovery action goes
        # back to none, which the agent records as a reset, long before the retention.
        _inject(daemon, "clear", 1)
        wait_until(lambda: _findings(daemon, 1) == {}, WAIT)
        events = daemon.call("events", {"gpu": bus})["events"]
        resets = [e for e in events if e["kind"] == "gpu_reset"]
        assert len(resets) == 1
        assert "recovery action back to none from drain_and_reset" in resets[0]["line"]
        assert not any(e["kind"] == "xid" and e["code"] == 48 for e in events)
        # A new fault after the reset is a new finding.
        daemon.write_kernel_log(kernel_record(2, line + "uncorrectable double bit error"))
        wait_until(lambda: _findings(daemon, 1).get("xid", {}).get("severity") == "CRITICAL", WAIT)
    finally:
        daemon.stop()


def test_ack_holds_a_finding_until_its_fault_comes_again(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path / "node", SCENARIO)
    try:
        bus = daemon.status()["gpus"][0]["pci_bus_id"]
        line = f"NVRM: Xid (PCI:{bus.rsplit('.', 1)[0]}): 48, pid=4242, name=python3, An "
        daemon.write_kernel_log(kernel_record(1, line + "uncorrectable double bit error"))
        wait_until(lambda: _findings(daemon, 0).get("xid", {}).get("severity") == "CRITICAL", WAIT)
        wait_until(lambda: daemon.metric("gpuagent_gpu_health", gpu="0", check="xid") == 2, WAIT)
        # Nothing to acknowledge on the other GPU; no reason, no acknowledgement.
        refused = daemon.cli(
            "ack", "--socket", str(daemon.socket), "--gpu", "1", "--reason", "reseated"
        )
        assert refused.returncode == 1
        assert "has no finding that is not OK to acknowledge" in refused.stderr
        assert (
            daemon.cli(
                "ack", "--socket", str(daemon.socket), "--gpu", "0", "--reason", " "
            ).returncode
            == 2
        )
        done = daemon.cli(
            "ack",
            "--socket",
            str(daemon.socket),
            "--gpu",
            "0",
            "--check",
            "xid",
            "--reason",
            "reseated",
        )
        assert done.returncode == 0, done.stderr
        assert "acknowledged xid (CRITICAL), until the fault comes again" in done.stdout
        wait_until(lambda: _findings(daemon, 0) == {}, WAIT)
        actions = daemon.call("actions", {"limit": 10})["actions"]
        [record] = [a for a in actions if a["action"] == "acknowledge"]
        assert (record["target"], record["check"], record["reason"]) == (bus, "xid", "reseated")
        assert record["evidence"]["finding"].startswith("Xid 48")
        wait_until(lambda: daemon.metric("gpuagent_gpu_health", gpu="0", check="xid") == 0, WAIT)
        # The fault coming again ends it.
        daemon.write_kernel_log(kernel_record(3, line + "uncorrectable double bit error"))
        wait_until(lambda: _findings(daemon, 0).get("xid", {}).get("severity") == "CRITICAL", WAIT)
    finally:
        daemon.stop()
