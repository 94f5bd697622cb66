"""`gpuagent diag` end to end: a simulated daemon with a fake `dcgmi` on PATH (it prints
the stand-in reports of tests/data/dcgmi/), the CLI starting the diagnostic and polling for
its result, the exit codes, the audit trail (`gpuagent actions`), the snapshot's metrics,
and a node with neither DCGM nor dcgmi."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import TEST_DATA, DaemonProcess, run_cli
from gpuagent.client import ClientError, call

SCENARIO = '[node]\ngpus = 2\nmodel = "NVIDIA H100 80GB HBM3"\n'
REPORTS = TEST_DATA / "dcgmi"


def install_dcgmi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `dcgmi` that passes on GPU 0 alone and fails GPU 1's memory test otherwise; level 2
    takes a few seconds, so the CLI has to ask for the result more than once."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "dcgmi"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {bin_dir}/calls.txt\n'
        'case "$*" in *"-r 2"*) sleep 3;; esac\n'
        f'case "$*" in *"-i 0") cat {REPORTS / "v4_level1_pass.json"};;\n'
        f"  *) cat {REPORTS / 'v4_level3_fail.json'}; exit 226;;\nesac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir / "calls.txt"


def diag(daemon: DaemonProcess, *args: str) -> tuple[int, str, str]:
    result = run_cli("diag", "--socket", str(daemon.socket), *args)
    return result.returncode, result.stdout, result.stderr


def test_diag_through_the_daemon(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_daemon: Callable[..., DaemonProcess],
) -> None:
    calls = install_dcgmi(tmp_path, monkeypatch)
    daemon = run_daemon(SCENARIO)

    code, out, err = diag(daemon, "--gpu", "0", "--json")
    assert code == 0, err
    job = json.loads(out)
    assert job["state"] == "done"
    result = job["result"]
    assert (result["level"], result["gpus"], result["via"], result["passed"]) == (
        1,
        [0],
        "dcgmi",
        True,
    )
    assert calls.read_text().splitlines() == ["diag -r 1 -j -i 0"]

    code, out, err = diag(daemon, "--level", "2")
    assert code == 1, err
    lines = out.splitlines()
    assert lines[0] == "DCGM diagnostic level 2 via dcgmi: FAILED"
    assert lines[1].split() == ["test", "GPU", "0", "GPU", "1"]
    assert lines[4].split() == ["memory", "pass", "fail"]
    assert "fail: memory on GPU 1: A memory mismatch was detected on GPU 1" in out
    assert calls.read_text().splitlines()[-1] == "diag -r 2 -j"

    # Both runs are in the audit trail.
    actions = json.loads(run_cli("actions", "--json", "--socket", str(daemon.socket)).stdout)
    diags = [a for a in actions["actions"] if a["action"] == "diag"]
    assert [(a["result"], a["evidence"]["level"], a["evidence"]["gpus"]) for a in diags] == [
        ("failed", 2, "all"),
        ("succeeded", 1, "0"),
    ]
    assert diags[0]["evidence"]["failed_tests"] == "memory (GPU 1)"
    assert diags[0]["detail"] == "failed: memory (GPU 1)"
    text = run_cli("actions", "--socket", str(daemon.socket)).stdout
    assert "failed    diag" in text

    # The latest result of each level, in the snapshot's metrics.
    daemon.wait_for(lambda _doc: daemon.metric("gpuagent_diag_passed", level="2") == 0.0)
    assert daemon.metric("gpuagent_diag_passed", level="1") == 1.0
    assert daemon.metric("gpuagent_diag_result", level="2", gpu="1", test="memory") == 0.0
    assert daemon.metric("gpuagent_diag_result", level="2", gpu="0", test="pcie") == 2.0
    assert daemon.metric("gpuagent_diag_last_run_timestamp_seconds", level="2") > 0


def test_one_diagnostic_at_a_time_and_bad_requests(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_daemon: Callable[..., DaemonProcess],
) -> None:
    install_dcgmi(tmp_path, monkeypatch)
    daemon = run_daemon(SCENARIO)
    job = call(daemon.socket, "diag", {"level": 2})
    assert job["state"] == "running"
    with pytest.raises(ClientError, match="still running"):
        call(daemon.socket, "diag", {"level": 1})
    with pytest.raises(ClientError, match="no GPU with index 9"):
        call(daemon.socket, "diag", {"level": 1, "gpus": [9]})
    with pytest.raises(ClientError, match='"level" must be 1, 2 or 3'):
        call(daemon.socket, "diag", {"level": 4})
    with pytest.raises(ClientError, match="no diagnostic 99"):
        call(daemon.socket, "diag_result", {"id": 99})
    assert call(daemon.socket, "diag_result", {"id": job["id"]})["state"] == "running"

    code, _out, err = diag(daemon, "--gpu", "9")
    assert code == 2
    assert "no GPU with index 9" in err
    assert run_cli("diag", "--level", "4", "--socket", str(daemon.socket)).returncode == 2


def test_a_node_without_dcgm_or_dcgmi(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_daemon: Callable[..., DaemonProcess],
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    daemon = run_daemon(SCENARIO)
    code, out, err = diag(daemon, "--json")
    assert code == 2
    job = json.loads(out)
    assert job["state"] == "unavailable"
    assert "dcgmi is not installed" in job["error"]
    code, _out, err = diag(daemon)
    assert code == 2
    assert "diagnostic unavailable" in err
    actions = json.loads(run_cli("actions", "--json", "--socket", str(daemon.socket)).stdout)
    assert [a["result"] for a in actions["actions"] if a["action"] == "diag"] == [
        "skipped",
        "skipped",
    ]


def test_no_daemon_is_exit_2(tmp_path: Path) -> None:
    result = run_cli("diag", "--socket", str(tmp_path / "none.sock"))
    assert result.returncode == 2
    assert "is the daemon running" in result.stderr
