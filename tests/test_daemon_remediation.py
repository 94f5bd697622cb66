"""Integration: guarded remediation in the real daemon on a simulated node, with a real
cordon backend (the `command` backend running a recording program)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import DaemonProcess, kernel_record, run_cli, start_daemon, wait_until

pytestmark = pytest.mark.integration

# GPU 1 has a DBE and a job running on it from the start.
SCENARIO = """
[node]
gpus = 4
[[fault]]
gpu = 1
kind = "process"
pid = 4242
name = "train.py"
used_mib = 2048
[[fault]]
gpu = 1
kind = "ecc_dbe"
count = 1
"""

# A cordon program that records every request and keeps the node's state in a file.
RECORDER = """
import json, pathlib, sys
here = pathlib.Path(sys.argv[1])
request = json.load(sys.stdin)
with (here / "requests.jsonl").open("a") as log:
    log.write(json.dumps(request) + "\\n")
state = here / "cordoned"
action = request["action"]
if action == "cordon":
    changed = not state.exists()
    state.write_text(request["reason"])
    print(json.dumps({"changed": changed, "detail": "drained" if changed else "already"}))
elif action == "uncordon":
    changed = state.exists()
    state.unlink(missing_ok=True)
    print(json.dumps({"changed": changed, "detail": "resumed"}))
else:
    print(json.dumps({"cordoned": state.exists(), "owned": state.exists()}))
"""


def _config(workdir: Path, mode: str) -> str:
    recorder = workdir / "recorder.py"
    recorder.write_text(RECORDER)
    return (
        f'[remediation]\nmode = "{mode}"\nkill_switch = "{workdir / "paused"}"\n'
        "[remediation.budgets]\ncooldown_seconds = 0.2\n"
        "[remediation.reset]\nverify_polls = 2\n"
        f'[remediation.cordon]\nbackends = ["command"]\n'
        f'command = "{sys.executable} {recorder} {workdir}"\n'
        # The persistence rule acts where persistence is expected on.
        '[inventory.expected]\npersistence = "enabled"\n'
    )


def _requests(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "requests.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _actions(daemon: DaemonProcess) -> list[dict[str, Any]]:
    result: dict[str, Any] = daemon.call("actions", {"limit": 1000})
    return list(reversed(result["actions"]))  # oldest first


def _steps(daemon: DaemonProcess, action: str) -> list[str]:
    return [a["result"] for a in _actions(daemon) if a["action"] == action]


def _plan(daemon: DaemonProcess) -> list[tuple[str, str]]:
    return [(p["action"], p["result"]) for p in daemon.status()["remediation"]["plan"]]


def _seen(daemon: DaemonProcess, action: str, result: str) -> int:
    """How often ``action`` came to ``result``: a repeat is counted on its row."""
    return sum(
        a["count"] for a in _actions(daemon) if (a["action"], a["result"]) == (action, result)
    )


def test_cordon_once_reset_when_idle_verify_and_survive_crashes(tmp_path: Path) -> None:
    workdir = tmp_path / "node"
    workdir.mkdir()
    extra = _config(workdir, "enforce")
    daemon = start_daemon(workdir, SCENARIO, config_extra=extra)
    try:
        # The DBE asks for a cordon (done once) and a reset (refused: a job runs there).
        wait_until(lambda: "succeeded" in _steps(daemon, "cordon"))
        wait_until(lambda: "refused" in _steps(daemon, "reset_gpu"))
        refused = next(a for a in _actions(daemon) if a["result"] == "refused")
        assert "train.py (4242)" in refused["detail"]
        assert [r["action"] for r in _requests(workdir)] == ["cordon"]
        assert "0000:2a:00.0" in _requests(workdir)[0]["reason"]

        # Crash and restart three times with the fault still there: still one cordon.
        for _ in range(3):
            refusals = _seen(daemon, "reset_gpu", "refused")
            daemon.kill()
            daemon = start_daemon(workdir, SCENARIO, config_extra=extra)
            # The restarted daemon saw the fault again (a new refusal, counted on the row
            # of the same refusal before) and did not re-cordon.
            restarted = daemon
            wait_until(lambda d=restarted, n=refusals: _seen(d, "reset_gpu", "refused") > n)
        assert _steps(daemon, "reset_gpu").count("refused") == 1
        assert [r["action"] for r in _requests(workdir)] == ["cordon"]
        assert "started" not in _steps(daemon, "reset_gpu")

        # The job ends: the GPU is reset, comes back healthy, and the audit shows it all.
        daemon.inject("process_exit", 1, pid=4242)
        wait_until(lambda: "verified" in _steps(daemon, "reset_gpu"))
        steps = _steps(daemon, "reset_gpu")
        assert steps[-3:] == ["started", "succeeded", "verified"]
        status = daemon.status()
        assert next(g for g in status["gpus"] if g["index"] == 1)["health"] == "OK"

        # A crash after the reset: the fault is back (the simulator restarts with it), but
        # the per-GPU reset budget, kept on disk, allows no second reset.
        daemon.kill()
        daemon = start_daemon(workdir, SCENARIO, config_extra=extra)
        daemon.inject("process_exit", 1, pid=4242)
        wait_until(lambda: "skipped" in _steps(daemon, "reset_gpu"))
        skipped = [a for a in _actions(daemon) if a["result"] == "skipped"]
        assert "budget exhausted" in skipped[-1]["detail"]
        assert _steps(daemon, "reset_gpu").count("started") == 1
        assert [r["action"] for r in _requests(workdir)] == ["cordon"]

        listing = run_cli("actions", "--socket", str(daemon.socket))
        assert listing.returncode == 0, listing.stderr
        assert "reset_gpu" in listing.stdout
        metrics = daemon.metrics()
        assert 'gpuagent_actions_total{action="reset_gpu",result="skipped"}' in metrics
        assert "gpuagent_remediation_cordoned 1.0" in metrics
    finally:
        daemon.stop()


def test_observe_mode_does_nothing_and_audits_everything(tmp_path: Path) -> None:
    workdir = tmp_path / "node"
    workdir.mkdir()
    daemon = start_daemon(workdir, SCENARIO, config_extra=_config(workdir, "observe"))
    try:
        daemon.inject("process_exit", 1, pid=4242)
        wait_until(lambda: "planned" in _steps(daemon, "reset_gpu"))
        wait_until(lambda: "planned" in _steps(daemon, "cordon"))
        # Before the job ended, the reset would have been refused, as enforce refuses it.
        for action in _actions(daemon):
            if action["result"] != "planned":
                assert action["action"] == "reset_gpu"
                assert action["detail"].startswith("reset: would be refused, the GPU is busy")
        # The status shows the plan as of its snapshot's remediation round.
        want = [("cordon", "planned"), ("reset_gpu", "planned")]
        wait_until(lambda: _plan(daemon) == want)
        assert _requests(workdir) == []
        gpu = next(g for g in daemon.status()["gpus"] if g["index"] == 1)
        assert gpu["ecc_dbe_volatile"] == 1  # not reset
        assert "gpuagent_remediation_enforcing 0.0" in daemon.metrics()
    finally:
        daemon.stop()


def test_observe_mode_names_the_cordon_a_lost_gpu_would_request(tmp_path: Path) -> None:
    """No cordon backend: the cordon a lost GPU asks for is refused, and says so, in the
    audit trail (one row, counted on while it repeats) and in the status."""
    workdir = tmp_path / "node"
    workdir.mkdir()
    scenario = '[node]\ngpus = 2\n[[fault]]\ngpu = 1\nkind = "gpu_lost"\n'
    extra = (
        f'[remediation]\nmode = "observe"\nkill_switch = "{workdir / "paused"}"\n'
        "[remediation.budgets]\ncooldown_seconds = 0.2\n"
    )
    daemon = start_daemon(workdir, scenario, config_extra=extra)
    try:
        wait_until(lambda: _seen(daemon, "cordon", "refused") >= 3)
        (row,) = [a for a in _actions(daemon) if a["action"] == "cordon"]
        assert (row["result"], row["detail"]) == ("refused", "cordon: no backend configured")
        assert row["target"] == daemon.status()["node"]["name"]
        assert row["reason"].startswith("GPU ")  # the GPU, as far as a lost one is known
        assert "is lost" in row["reason"]
        assert row["last_seen"] > row["time"]
        wait_until(lambda: _plan(daemon) == [("cordon", "refused")])
        (step,) = daemon.status()["remediation"]["plan"]
        assert (step["detail"], step["target"]) == ("cordon: no backend configured", row["target"])
        status = run_cli("remediation", "status", "--config", str(daemon.config))
        assert "refused" in status.stdout
        assert "cordon: no backend configured" in status.stdout
        listing = run_cli("actions", "--socket", str(daemon.socket))
        assert "times, last" in listing.stdout
    finally:
        daemon.stop()


def test_the_kill_switch_pauses_every_action(tmp_path: Path) -> None:
    workdir = tmp_path / "node"
    workdir.mkdir()
    daemon = start_daemon(workdir, SCENARIO, config_extra=_config(workdir, "enforce"))
    try:
        paused = run_cli("remediation", "pause", "--config", str(daemon.config))
        assert paused.returncode == 0, paused.stderr
        assert (workdir / "paused").exists()
        daemon.inject("persistence_off", 0)
        wait_until(lambda: "skipped" in _steps(daemon, "enable_persistence"))
        assert "started" not in _steps(daemon, "enable_persistence")
        status = run_cli("remediation", "status", "--config", str(daemon.config))
        assert "paused: yes" in status.stdout
        resumed = run_cli("remediation", "resume", "--config", str(daemon.config))
        assert resumed.returncode == 0
        wait_until(lambda: "succeeded" in _steps(daemon, "enable_persistence"))
        daemon.wait_for(
            lambda d: next(g for g in d["gpus"] if g["index"] == 0)["persistence_mode"] is True
        )
    finally:
        daemon.stop()


def test_a_row_remap_failure_leaves_an_rma_bundle_named_in_the_actions(tmp_path: Path) -> None:
    workdir = tmp_path / "node"
    report = workdir / "nvidia-bug-report.sh"
    workdir.mkdir()
    report.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "open(sys.argv[sys.argv.index('--output-file') + 1], 'w').write('report\\n')\n"
    )
    report.chmod(0o755)
    scenario = '[node]\ngpus = 2\n[[fault]]\ngpu = 1\nkind = "row_remap_failure"\n'
    extra = f'[remediation.evidence]\nbug_report_command = "{report}"\n'
    daemon = start_daemon(workdir, scenario, config_extra=extra)
    try:
        # Observe mode (the default) collects it too: it changes nothing on the node.
        wait_until(lambda: "succeeded" in _steps(daemon, "evidence"))
        record = next(a for a in _actions(daemon) if a["action"] == "evidence")
        assert record["target"] == "0000:2a:00.0"
        bundles = list((workdir / "state" / "evidence").glob("*.tar.gz"))
        assert len(bundles) == 1
        done = next(a for a in _actions(daemon) if a["result"] == "succeeded")
        assert str(bundles[0]) in done["detail"]
        assert "nvidia-bug-report: included" in done["detail"]
        listing = run_cli("actions", "--socket", str(daemon.socket))
        assert listing.returncode == 0, listing.stderr
        assert "evidence" in listing.stdout
        assert bundles[0].name in listing.stdout
    finally:
        daemon.stop()


# --- one fault, one cordon: a storm of consequence XIDs -------------------------------------

EIGHT_GPUS = '[node]\ngpus = 8\nmodel = "NVIDIA H100 80GB HBM3"\n'


def _xid(bus: str, rest: str, seq: int) -> str:
    return kernel_record(seq, f"NVRM: Xid (PCI:{bus.rsplit('.', 1)[0]}): {rest}")


def _xid_finding(daemon: DaemonProcess, index: int) -> dict[str, Any]:
    """The GPU's xid finding, {} while it has none (status lists problems only)."""
    gpu = next(g for g in daemon.status()["gpus"] if g["index"] == index)
    finding: dict[str, Any] = next((f for f in gpu["findings"] if f["check"] == "xid"), {})
    return finding


def test_a_consequence_whose_root_is_elsewhere_never_cordons(tmp_path: Path) -> None:
    workdir = tmp_path / "node"
    workdir.mkdir()
    daemon = start_daemon(workdir, EIGHT_GPUS, config_extra=_config(workdir, "enforce"))
    try:
        bus = daemon.status()["gpus"][3]["pci_bus_id"]
        line = "45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149"
        daemon.write_kernel_log(_xid(bus, line, 1))
        wait_until(lambda: _xid_finding(daemon, 3).get("severity") == "WARN")
        assert "consequence of a fault elsewhere" in _xid_finding(daemon, 3)["reason"]
        # Several judgements and remediation rounds later: still no cordon.
        seen = daemon.status()["sequence"]
        wait_until(lambda: daemon.status()["sequence"] >= seen + 5)
        assert daemon.status()["node"]["health"] == "WARN"
        assert _requests(workdir) == []
    finally:
        daemon.stop()


def test_one_fault_in_a_storm_of_its_consequences_is_one_critical_gpu(tmp_path: Path) -> None:
    """Xid 149 (fatal) on GPU 2, then 20,000 channel teardowns naming it over all eight
    GPUs: GPU 2 is CRITICAL with its own XID, the others only warn, the node is cordoned
    once, and the log has a line per incident, not per record."""
    workdir = tmp_path / "node"
    workdir.mkdir()
    daemon = start_daemon(workdir, EIGHT_GPUS, config_extra=_config(workdir, "enforce"))
    try:
        buses = [g["pci_bus_id"] for g in daemon.status()["gpus"]]
        storm = [_xid(buses[2], "149, pid=900, name=python3, NETIR_LINK_EVT Fatal XC0 Link 03", 1)]
        storm += [
            _xid(
                buses[n % 8],
                f"45, pid={1000 + n % 7}, name=python3, Ch {n:08x} caused by previous Xid 149",
                n + 2,
            )
            for n in range(20_000)
        ]
        log_from = len(daemon.log())
        daemon.write_kernel_log(*storm)
        daemon.wait_for(lambda d: d["kmsg"]["records_read"] == 20_001, timeout=60)
        wait_until(lambda: "succeeded" in _steps(daemon, "cordon"))
        root = _xid_finding(daemon, 2)
        assert (root["severity"], root["action"]) == ("CRITICAL", "reset_gpu")
        assert root["reason"].startswith("Xid 149 (NVLINK_NETIR_ERROR) fatal: reset required")
        others = [_xid_finding(daemon, i) for i in range(8) if i != 2]
        assert {f["severity"] for f in others} == {"WARN"}
        assert all("consequence of a fault elsewhere" in f["reason"] for f in others)
        # Every record is counted: the GPU's own teardowns on it, and each other GPU's.
        assert root["evidence"]["consequences"] == 2_500
        assert sum(f["evidence"]["count"] for f in others) == 17_500
        assert [r["action"] for r in _requests(workdir)] == ["cordon"]
        lines = daemon.log()[log_from:].splitlines()
        assert len([line for line in lines if "kmsg event xid" in line]) <= 8 * 7 + 1
        assert len(lines) < 1_000
    finally:
        daemon.stop()
