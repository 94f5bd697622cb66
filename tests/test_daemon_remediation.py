"""Integration: guarded remediation in the real daemon on a simulated node, with a real
cordon backend (the `command` backend running a recording program)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import DaemonProcess, deadline_in, run_cli, start_daemon

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
    )


def _requests(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "requests.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _actions(daemon: DaemonProcess) -> list[dict[str, Any]]:
    result: dict[str, Any] = daemon.call("actions", {"limit": 1000})
    return list(reversed(result["actions"]))  # oldest first


def _wait(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = deadline_in(timeout)
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.1)


def _steps(daemon: DaemonProcess, action: str) -> list[str]:
    return [a["result"] for a in _actions(daemon) if a["action"] == action]


def test_cordon_once_reset_when_idle_verify_and_survive_crashes(tmp_path: Path) -> None:
    workdir = tmp_path / "node"
    workdir.mkdir()
    extra = _config(workdir, "enforce")
    daemon = start_daemon(workdir, SCENARIO, config_extra=extra)
    try:
        # The DBE asks for a cordon (done once) and a reset (refused: a job runs there).
        _wait(lambda: "succeeded" in _steps(daemon, "cordon"))
        _wait(lambda: "refused" in _steps(daemon, "reset_gpu"))
        refused = next(a for a in _actions(daemon) if a["result"] == "refused")
        assert "train.py (4242)" in refused["detail"]
        assert [r["action"] for r in _requests(workdir)] == ["cordon"]
        assert "0000:2a:00.0" in _requests(workdir)[0]["reason"]

        # Crash and restart three times with the fault still there: still one cordon.
        for _ in range(3):
            refusals = _steps(daemon, "reset_gpu").count("refused")
            daemon.kill()
            daemon = start_daemon(workdir, SCENARIO, config_extra=extra)
            # The restarted daemon saw the fault again (a new refusal) and did not re-cordon.
            restarted = daemon
            _wait(lambda d=restarted, n=refusals: _steps(d, "reset_gpu").count("refused") > n)
        assert [r["action"] for r in _requests(workdir)] == ["cordon"]
        assert "started" not in _steps(daemon, "reset_gpu")

        # The job ends: the GPU is reset, comes back healthy, and the audit shows it all.
        daemon.inject("process_exit", 1, pid=4242)
        _wait(lambda: "verified" in _steps(daemon, "reset_gpu"))
        steps = _steps(daemon, "reset_gpu")
        assert steps[-3:] == ["started", "succeeded", "verified"]
        status = daemon.status()
        assert next(g for g in status["gpus"] if g["index"] == 1)["health"] == "OK"

        # A crash after the reset: the fault is back (the simulator restarts with it), but
        # the per-GPU reset budget, kept on disk, allows no second reset.
        daemon.kill()
        daemon = start_daemon(workdir, SCENARIO, config_extra=extra)
        daemon.inject("process_exit", 1, pid=4242)
        _wait(lambda: "skipped" in _steps(daemon, "reset_gpu"))
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
        _wait(lambda: "planned" in _steps(daemon, "reset_gpu"))
        _wait(lambda: "planned" in _steps(daemon, "cordon"))
        results = {a["result"] for a in _actions(daemon)}
        assert results == {"planned"}
        assert _requests(workdir) == []
        gpu = next(g for g in daemon.status()["gpus"] if g["index"] == 1)
        assert gpu["ecc_dbe_volatile"] == 1  # not reset
        assert "gpuagent_remediation_enforcing 0.0" in daemon.metrics()
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
        _wait(lambda: "skipped" in _steps(daemon, "enable_persistence"))
        assert "started" not in _steps(daemon, "enable_persistence")
        status = run_cli("remediation", "status", "--config", str(daemon.config))
        assert "paused: yes" in status.stdout
        resumed = run_cli("remediation", "resume", "--config", str(daemon.config))
        assert resumed.returncode == 0
        _wait(lambda: "succeeded" in _steps(daemon, "enable_persistence"))
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
        _wait(lambda: "succeeded" in _steps(daemon, "evidence"))
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
