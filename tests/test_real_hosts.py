"""Real hosts: every `nvidia-smi -q` capture in tests/data/real-hosts replayed and judged.

What a person reading each capture would conclude is what the agent must say: nothing on
the healthy hosts (whatever throttle bits and PCIe replay counts they carry, and whatever
their settings: persistence off, a platform's power limit), the A10's pending row remap;
and a replayed host exports only the values that host supports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest
from prometheus_client.samples import Sample

from conftest import REPO, DaemonProcess, parse_metrics, run_cli
from gpuagent.config import RemediationSection, parse_config
from gpuagent.model import Finding, NodeSnapshot, Severity
from gpuagent.remediation.planner import plan as plan_actions
from gpuagent.remediation.types import History
from gpuagent.sim import SimulatedNode, load_scenario
from gpuagent.smi import load_capture
from gpuagent.statusview import status_document
from hardware_profiles_doc import CAPTURES, REAL_HOSTS, collect, judge

# capture → (exit code, {(GPU index or None for the node, check): severity} of every
# finding that is not OK).
EXPECTED: dict[str, tuple[int, dict[tuple[int | None, str], str]]] = {
    "h100-sxm-x8.535.161.08.nvidia-smi-q.txt": (0, {}),
    "h100-sxm-x8.535.183.01.nvidia-smi-q.txt": (0, {}),
    "a10.535.129.03.nvidia-smi-q.txt": (1, {(0, "row_remap"): "WARN"}),
    # Persistence mode off is a setting, not a fault: no expectation declares it on.
    "a100-sxm4-x4-mig.535.54.03.nvidia-smi-q.xml": (0, {}),
    "a10g.nvidia-smi-q.xml": (0, {}),
    "rtx4090-x8.535.154.05.nvidia-smi-q.txt": (0, {}),
    "rtx4090-x8-busy.535.154.05.nvidia-smi-q.txt": (0, {}),
    "titan-v.560.35.03.nvidia-smi-q.txt": (0, {}),
    "h200-x1.580.159.04.nvidia-smi-q.txt": (0, {}),
    "h200-x1.580.159.04.nvidia-smi-q.xml": (0, {}),
    "h100-x1.580.159.04.nvidia-smi-q.txt": (0, {}),
    "h100-x1.580.159.04.nvidia-smi-q.xml": (0, {}),
    # Persistence mode off on every GPU, as this B200 fleet runs.
    "b200-x8.580.105.08.nvidia-smi-q.xml": (0, {}),
    "gb200-x4-arm64.580.173.02.nvidia-smi-q.xml": (0, {}),
    # PCIe x8 of x16 is how an AWS g6e is built; an idle link is not judged.
    "l40s-aws.595.91.07.nvidia-smi-q.xml": (0, {}),
    # Drivers 570+ print "Requested functionality has been deprecated" for applications
    # clocks: not available, the hosts are healthy idle and under gpu-burn.
    "h100-x1-idle.590.48.01.nvidia-smi-q.txt": (0, {}),
    "h100-x1-busy.590.48.01.nvidia-smi-q.txt": (0, {}),
    "h200-x1-idle.590.48.01.nvidia-smi-q.txt": (0, {}),
    "h200-x1-busy.590.48.01.nvidia-smi-q.txt": (0, {}),
    # Turing has no 1 s power average: the instantaneous draw is the power.
    "T4-aws.595.91.07.nvidia-smi-q.xml": (0, {}),
    # R610: the limits nested under "GPU Ceiling Power Limit"; persistence off.
    "RTX2080S-idle.610.57.04.nvidia-smi-q.txt": (0, {}),
}


DEFAULT_REMEDIATION = RemediationSection()


def test_every_capture_has_an_expectation() -> None:
    assert sorted(EXPECTED) == sorted(p.name for p in CAPTURES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_replayed_capture_gets_the_judgement_a_person_would_give(name: str) -> None:
    code, problems = EXPECTED[name]
    verdict = judge(REAL_HOSTS / name)
    assert (verdict.exit_code, verdict.problems) == (code, problems)


def _finding(snapshot: NodeSnapshot, index: int, check: str) -> Finding:
    bus_id = snapshot.gpus[index].identity.pci_bus_id
    return next(f for f in snapshot.health.for_gpu(bus_id) if f.check == check)


def test_idle_h100_throttle_bits_are_shown_but_not_a_finding() -> None:
    snapshot = collect(REAL_HOSTS / "h100-sxm-x8.535.161.08.nvidia-smi-q.txt")
    for index in range(8):
        thermal = _finding(snapshot, index, "thermal")
        assert thermal.severity is Severity.OK
        assert "hw_slowdown, hw_power_brake asserted, not costing performance" in thermal.reason
    # 67 PCIe replays since boot: a count, not a rate, so nothing to judge from one capture.
    pcie = _finding(snapshot, 0, "pcie")
    assert pcie.severity is Severity.OK
    assert pcie.evidence_dict()["replay_count"] == 67
    status = status_document(snapshot)
    assert status["gpus"][0]["clock_event_reasons"] == ["hw_slowdown", "power_brake"]


def test_a10_pending_remap_is_found_from_the_capture() -> None:
    remap = _finding(collect(REAL_HOSTS / "a10.535.129.03.nvidia-smi-q.txt"), 0, "row_remap")
    assert (remap.severity, remap.action) == (Severity.WARN, "reset_gpu")
    assert remap.evidence_dict()["remapped_rows_uncorrectable"] == 4


def test_mig_gpu_without_utilization_is_still_judged() -> None:
    snapshot = collect(REAL_HOSTS / "a100-sxm4-x4-mig.535.54.03.nvidia-smi-q.xml")
    readings = snapshot.gpus[0].readings
    assert readings is not None
    assert readings.utilization_gpu_pct is None
    assert readings.mig_mode_current is True
    assert readings.remapped_rows_correctable is None  # N/A under MIG in the capture
    assert readings.mig_instances == ("1g.20gb",) * 4
    checks = {f.check: f for f in snapshot.health.for_gpu("0000:01:00.0")}
    assert {"ecc", "thermal", "pcie", "mig", "persistence"} <= set(checks)
    assert checks["mig"].severity is Severity.OK
    # Off, and nothing expects it on: a fact in the reason.
    assert (checks["persistence"].severity, checks["persistence"].reason) == (
        Severity.OK,
        "persistence mode off",
    )


def test_host_facts_a_capture_does_not_hold_are_unknown_not_invented() -> None:
    snapshot = collect(REAL_HOSTS / "h100-sxm-x8.535.161.08.nvidia-smi-q.txt")
    assert snapshot.inventory is not None
    host = snapshot.inventory.host
    assert (host.pci, host.kernel_release, host.module_version) == (None, None, None)
    assert host.loaded_modules() is None
    node = {f.check: f for f in snapshot.health.node_findings()}
    assert {check: f.severity for check, f in node.items()} == dict.fromkeys(node, Severity.OK)


def test_dmesg_adds_a_captured_kernel_log_to_the_judgement() -> None:
    kernel_log = (
        b"[    5.123456] nvidia: loading out-of-tree module taints kernel.\n"
        b"[ 8123.000001] NVRM: Xid (PCI:0000:19:00): 79, pid=4242, name=python,"
        b" GPU has fallen off the bus.\n"
    )
    snapshot = collect(REAL_HOSTS / "h100-sxm-x8.535.161.08.nvidia-smi-q.txt", kernel_log)
    assert _finding(snapshot, 0, "xid").severity is Severity.CRITICAL
    assert "79" in _finding(snapshot, 0, "xid").reason
    assert _finding(snapshot, 1, "xid").severity is Severity.OK


def test_check_from_nvidia_smi_with_dmesg_on_the_command_line(tmp_path: Path) -> None:
    dmesg = tmp_path / "dmesg.txt"
    dmesg.write_text(
        "Jul 31 11:22:39 gpu-node-17 kernel: NVRM: Xid (PCI:0000:07:00): 48, pid=77, name=python,"
        " An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.\n"
    )
    capture = REAL_HOSTS / "a10.535.129.03.nvidia-smi-q.txt"
    result = run_cli("check", "--json", "--from-nvidia-smi", str(capture), "--dmesg", str(dmesg))
    assert "Traceback" not in result.stderr
    assert result.returncode == 2
    doc = json.loads(result.stdout)
    assert doc["node"]["simulated"] is True
    findings = {f["check"]: f["severity"] for f in doc["gpus"][0]["findings"]}
    assert findings == {"xid": "CRITICAL", "row_remap": "WARN"}


@pytest.mark.parametrize(
    ("content", "line"),
    [
        pytest.param("", 1, id="empty"),
        pytest.param("hello\nworld\n", 1, id="not-a-capture"),
        pytest.param('{"gpus": []}\n', 1, id="json"),
    ],
)
def test_a_file_that_is_not_a_capture_exits_3_naming_the_line(
    tmp_path: Path, content: str, line: int
) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(content)
    result = run_cli("check", "--from-nvidia-smi", str(path))
    assert result.returncode == 3  # UNKNOWN: no verdict, and no drain
    assert "Traceback" not in result.stderr
    assert f"line {line}:" in result.stderr


def test_a_truncated_capture_exits_3_naming_the_line(tmp_path: Path) -> None:
    text = (REAL_HOSTS / "h100-sxm-x8.535.161.08.nvidia-smi-q.txt").read_text()
    cut = "\n".join(text.splitlines()[:300]) + "\n"
    path = tmp_path / "cut.txt"
    path.write_text(cut)
    result = run_cli("check", "--from-nvidia-smi", str(path))
    assert result.returncode == 3
    assert "Traceback" not in result.stderr
    assert re.search(r"line \d+:", result.stderr)


def test_a_deprecated_value_is_quiet() -> None:
    # Drivers 570+ print "Requested functionality has been deprecated" for the four
    # applications clocks: "not available", as N/A is, and no note.
    capture = REAL_HOSTS / "h200-x1-idle.590.48.01.nvidia-smi-q.txt"
    result = run_cli("check", "--from-nvidia-smi", str(capture))
    assert result.returncode == 0
    assert result.stderr == ""
    as_json = run_cli("check", "--json", "--from-nvidia-smi", str(capture))
    assert "replay_notes" not in json.loads(as_json.stdout)


def test_a_value_not_understood_is_named_once_on_stderr_and_in_json(tmp_path: Path) -> None:
    text = (REAL_HOSTS / "h100-sxm-x8.535.161.08.nvidia-smi-q.txt").read_text()
    path = tmp_path / "odd.txt"
    path.write_text(text.replace(": P0", ": fast"))
    result = run_cli("check", "--from-nvidia-smi", str(path))
    assert "Traceback" not in result.stderr
    note = (
        "line 82: GPU 00000000:19:00.0 / Performance State: expected a performance state "
        '(P0 to P15), got "fast" (and 7 more fields)'
    )
    assert result.stderr == f"note: read as absent: {note}\n"
    as_json = run_cli("check", "--json", "--from-nvidia-smi", str(path))
    assert json.loads(as_json.stdout)["replay_notes"] == [note]


@pytest.mark.parametrize(
    ("name", "title"),
    [
        pytest.param(
            "h100-sxm-x8.535.161.08.nvidia-smi-q.txt",
            "nvidia-smi capture h100-sxm-x8.535.161.08.nvidia-smi-q.txt, taken Wed Jul 31 "
            "11:22:39 2024: OK",
            id="text",
        ),
        pytest.param(
            "a10g.nvidia-smi-q.xml",
            "nvidia-smi capture a10g.nvidia-smi-q.xml, taken Mon Apr 24 16:11:51 2023: OK",
            id="xml",
        ),
    ],
)
def test_a_replay_is_titled_by_its_capture_not_this_machine(name: str, title: str) -> None:
    result = run_cli("check", "--color", "never", "--from-nvidia-smi", str(REAL_HOSTS / name))
    first, second = result.stdout.splitlines()[:2]
    assert first == title
    assert second.startswith("Driver ")
    assert "snapshot" not in result.stdout
    assert "[simulated]" not in result.stdout
    assert not result.stdout.startswith("Node ")
    as_json = json.loads(
        run_cli("check", "--json", "--from-nvidia-smi", str(REAL_HOSTS / name)).stdout
    )
    assert (as_json["node"]["name"], as_json["node"]["hostname"]) == (None, None)
    assert as_json["replay"] == {"file": name, "timestamp": title.split(", taken ")[1][:-4]}


def test_a_capture_without_a_timestamp_says_so(tmp_path: Path) -> None:
    text = (REAL_HOSTS / "h100-sxm-x8.535.161.08.nvidia-smi-q.txt").read_text()
    stamp = "Timestamp                                 : Wed Jul 31 11:22:39 2024\n"
    assert stamp in text
    path = tmp_path / "node.txt"
    path.write_text(text.replace(stamp, ""))
    result = run_cli("check", "--color", "never", "--from-nvidia-smi", str(path))
    assert result.stdout.splitlines()[0] == "nvidia-smi capture node.txt (no Timestamp line): OK"


def test_a_replayed_gb200_reads_its_fabric_health_as_healthy() -> None:
    snapshot = collect(REAL_HOSTS / "gb200-x4-arm64.580.173.02.nvidia-smi-q.xml")
    for index in range(4):
        fabric = _finding(snapshot, index, "fabric_health")
        assert fabric.severity is Severity.OK
        assert fabric.reason.startswith("fabric healthy (bandwidth degraded, route recovery")


def test_a_fleet_that_expects_persistence_on_still_gets_its_warn_and_remediation(
    tmp_path: Path,
) -> None:
    # The B200 capture: persistence off on every GPU. A fleet that runs it on says so.
    config = tmp_path / "b200.toml"
    config.write_text(
        f'[agent]\nstate_dir = "{tmp_path}"\n[inventory.expected]\npersistence = "enabled"\n'
    )
    capture = REAL_HOSTS / "b200-x8.580.105.08.nvidia-smi-q.xml"
    result = run_cli("check", "--json", "--config", str(config), "--from-nvidia-smi", str(capture))
    assert result.returncode == 1, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    found = [[(f["check"], f["severity"], f["action"]) for f in g["findings"]] for g in doc["gpus"]]
    assert found == [[("persistence", "WARN", "enable_persistence")]] * 8
    # The default remediation rule plans to enable it on each GPU (observe mode shows it).
    snapshot = collect(capture, config=parse_config(config.read_text()))
    plan = plan_actions(snapshot, History(), 0.0, DEFAULT_REMEDIATION)
    assert sorted(a.target for a in plan if a.kind == "enable_persistence") == sorted(
        g.identity.pci_bus_id for g in snapshot.gpus
    )


def test_a_replay_without_expectations_plans_no_persistence_action() -> None:
    snapshot = collect(REAL_HOSTS / "b200-x8.580.105.08.nvidia-smi-q.xml")
    assert plan_actions(snapshot, History(), 0.0, DEFAULT_REMEDIATION) == ()


def test_simulate_and_a_capture_cannot_be_combined(tmp_path: Path) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text("[node]\ngpus = 1\n")
    capture = REAL_HOSTS / "a10.535.129.03.nvidia-smi-q.txt"
    result = run_cli("check", "--simulate", str(scenario), "--from-nvidia-smi", str(capture))
    assert result.returncode == 3
    assert "cannot be combined" in result.stderr


# --- the daemon serving a replayed host -------------------------------------------------


def _series(text: str) -> dict[str, list[Sample]]:
    found: dict[str, list[Sample]] = {}
    for family in parse_metrics(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def _gpu0(samples: list[Sample]) -> float:
    return next(s.value for s in samples if s.labels["gpu"] == "0")


def test_daemon_on_a_replayed_h100_exports_only_what_that_host_supports(
    run_daemon: Callable[..., DaemonProcess],
) -> None:
    capture = REAL_HOSTS / "h100-sxm-x8.535.161.08.nvidia-smi-q.txt"
    daemon = run_daemon(f'[node]\nnvidia_smi = "{capture}"\n')
    doc = daemon.wait_for(lambda d: len(d["gpus"]) == 8)
    assert doc["node"]["health"] == "OK"
    series = _series(daemon.metrics())
    # As captured: GPU 0 at 29 °C, 67.74 W, SM at 86 MHz, 67 replays, P0, fabric done.
    assert _gpu0(series["DCGM_FI_DEV_GPU_TEMP"]) == 29
    assert _gpu0(series["DCGM_FI_DEV_POWER_USAGE"]) == pytest.approx(67.74)
    assert _gpu0(series["DCGM_FI_DEV_SM_CLOCK"]) == 86
    assert _gpu0(series["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]) == 67
    assert _gpu0(series["DCGM_FI_DEV_MEMORY_TEMP"]) == 39
    assert _gpu0(series["gpuagent_gpu_performance_state"]) == 0
    assert len(series["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"]) == 8
    banks = {
        s.labels["availability"]: s.value
        for s in series["gpuagent_gpu_row_remap_banks"]
        if s.labels["gpu"] == "0"
    }
    assert banks == {"max": 2560, "high": 0, "partial": 0, "low": 0, "none": 0}
    # Retired pages are N/A on Hopper; NVLink and the throttle-duration counters are not
    # in a capture at all: no series, never a 0.
    absent = [name for name in series if "RETIRED" in name or "NVLINK" in name]
    absent += [name for name in series if name.endswith(("_VIOLATION", "_slowdown_seconds_total"))]
    assert absent == []
    reasons = {
        s.labels["reason"]: s.value
        for s in series["gpuagent_gpu_clock_event_reasons"]
        if s.labels["gpu"] == "0"
    }
    assert (reasons["hw_slowdown"], reasons["power_brake"], reasons["gpu_idle"]) == (1, 1, 0)


@pytest.mark.parametrize(
    ("capture", "gpus", "health", "gpu0"),
    [
        pytest.param(
            "b200-x8.580.105.08.nvidia-smi-q.xml",
            8,
            "OK",  # persistence off on every GPU, as captured: a setting, not a fault
            {
                "DCGM_FI_DEV_GPU_TEMP": 39,
                "DCGM_FI_DEV_MEMORY_TEMP": 39,
                "DCGM_FI_DEV_POWER_USAGE": 195.68,
                "DCGM_FI_DEV_SM_CLOCK": 120,
                "DCGM_FI_DEV_MEM_CLOCK": 3996,
                "DCGM_FI_DEV_FB_RESERVED": 728,
                "DCGM_FI_DEV_PCIE_LINK_GEN": 5,
                "gpuagent_gpu_power_limit_watts": 1000,
                "gpuagent_gpu_sm_clock_max_mhz": 1965,
            },
            id="b200",
        ),
        pytest.param(
            "gb200-x4-arm64.580.173.02.nvidia-smi-q.xml",
            4,
            "OK",
            {
                "DCGM_FI_DEV_GPU_TEMP": 27,
                "DCGM_FI_DEV_MEMORY_TEMP": 27,
                "DCGM_FI_DEV_POWER_USAGE": 165.93,
                "DCGM_FI_DEV_SM_CLOCK": 120,
                "DCGM_FI_DEV_MEM_CLOCK": 3996,
                "DCGM_FI_DEV_FB_RESERVED": 742,
                "DCGM_FI_DEV_PCIE_LINK_GEN": 5,
                "gpuagent_gpu_power_limit_watts": 1200,
                "gpuagent_gpu_sm_clock_max_mhz": 2062,
            },
            id="gb200",
        ),
    ],
)
def test_daemon_on_a_replayed_blackwell_host_exports_only_what_that_host_supports(
    run_daemon: Callable[..., DaemonProcess],
    capture: str,
    gpus: int,
    health: str,
    gpu0: dict[str, float],
) -> None:
    daemon = run_daemon(f'[node]\nnvidia_smi = "{REAL_HOSTS / capture}"\n')
    doc = daemon.wait_for(lambda d: len(d["gpus"]) == gpus)
    assert doc["node"]["health"] == health
    series = _series(daemon.metrics())
    assert {name: _gpu0(series[name]) for name in gpu0} == pytest.approx(gpu0)
    # HBM with ECC and row remapping: every GPU has them, the banks all at "max".
    for name in ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"):
        assert len(series[name]) == gpus, name
    histogram = load_capture(REAL_HOSTS / capture).gpus[0].remap_histogram
    assert histogram is not None  # 3840 banks on the B200, 3968 on the GB200
    maxima = [
        s.value for s in series["gpuagent_gpu_row_remap_banks"] if s.labels["availability"] == "max"
    ]
    assert maxima == [histogram[0]] * gpus
    # Retired pages are N/A on Blackwell; NVLink and the throttle-duration counters are not
    # in a capture at all: no series, never a 0.
    absent = [name for name in series if "RETIRED" in name or "NVLINK" in name]
    absent += [name for name in series if name.endswith(("_VIOLATION", "_slowdown_seconds_total"))]
    assert absent == []


def test_daemon_on_a_replayed_geforce_host_has_no_ecc_or_memory_temperature(
    run_daemon: Callable[..., DaemonProcess],
) -> None:
    capture = REAL_HOSTS / "rtx4090-x8-busy.535.154.05.nvidia-smi-q.txt"
    daemon = run_daemon(f'[node]\nnvidia_smi = "{capture}"\n')
    assert daemon.wait_for(lambda d: len(d["gpus"]) == 8)["node"]["health"] == "OK"
    series = _series(daemon.metrics())
    assert [n for n in series if "ECC" in n or n == "DCGM_FI_DEV_MEMORY_TEMP"] == []
    busy = {s.labels["gpu"]: s.value for s in series["DCGM_FI_DEV_GPU_UTIL"]}
    assert (busy["1"], busy["4"], busy["0"]) == (97, 100, 0)


def test_faults_on_top_of_a_replayed_host(run_daemon: Callable[..., DaemonProcess]) -> None:
    capture = REAL_HOSTS / "h100-sxm-x8.535.161.08.nvidia-smi-q.txt"
    daemon = run_daemon(
        f'[node]\nnvidia_smi = "{capture}"\n'
        '[[fault]]\nkind = "row_remap_pending"\ngpu = 3\nrows = 2\n'
    )
    doc = daemon.wait_for(lambda d: d["node"]["health"] == "WARN")
    assert [f["check"] for f in doc["gpus"][3]["findings"]] == ["row_remap"]
    # A job on GPU 5 ends the capture's frozen readings there: the live model takes over.
    daemon.inject("process", 5, pid=4242, name="train", used_mib=60000)
    doc = daemon.wait_for(lambda d: (d["gpus"][5]["utilization_gpu_pct"] or 0) > 50)
    assert doc["gpus"][5]["processes"][0]["name"] == "train"
    assert doc["gpus"][0]["utilization_gpu_pct"] == 0  # the others stay as captured


@pytest.mark.parametrize(
    ("scenario", "key"),
    [
        pytest.param('[node]\nnvidia_smi = "{capture}"\ngpus = 2\n', "node.gpus", id="other-key"),
        pytest.param('[node]\nnvidia_smi = "missing.txt"\n', "node.nvidia_smi", id="missing"),
        pytest.param('[node]\nnvidia_smi = "{bad}"\n', "node.nvidia_smi", id="not-a-capture"),
    ],
)
def test_a_bad_replay_scenario_exits_3_naming_the_key(
    tmp_path: Path, scenario: str, key: str
) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("not a capture\n")
    capture = REAL_HOSTS / "a10.535.129.03.nvidia-smi-q.txt"
    path = tmp_path / "replay.toml"
    path.write_text(scenario.format(capture=capture, bad=bad))
    result = run_cli("check", "--simulate", str(path))
    assert result.returncode == 3
    assert "Traceback" not in result.stderr
    assert key in result.stderr


def test_a_link_below_its_maximum_is_found_only_while_the_gpu_is_busy(
    run_daemon: Callable[..., DaemonProcess],
) -> None:
    # RTX 4090s train their link down to Gen1 at idle (both captures show it): not a fault.
    # Busy, a link held at Gen1 is one.
    daemon = run_daemon(
        '[node]\nmodel = "rtx-4090"\ngpus = 2\n'
        '[[fault]]\nkind = "pcie_degrade"\ngpu = 1\ngen = 1\n',
        config_extra="[checks.pcie]\ndegraded_hold_seconds = 1.0\n",
    )
    doc = daemon.wait_for(lambda d: all(g["sampled_at"] for g in d["gpus"]))
    # A snapshot taken past the hold time, the GPUs idle: nothing to find.
    held = doc["taken_at"] + 1.5
    doc = daemon.wait_for(lambda d: d["taken_at"] >= held, timeout=10)
    assert [g["pcie_generation"] for g in doc["gpus"]] == [1, 1]
    assert doc["node"]["health"] == "OK"
    for gpu in (0, 1):
        daemon.inject("process", gpu, pid=100 + gpu, name="train", used_mib=20000)
    doc = daemon.wait_for(lambda d: d["gpus"][1]["health"] == "WARN", timeout=15)
    assert doc["gpus"][1]["findings"][0]["check"] == "pcie"
    assert "Gen1 of Gen4" in doc["gpus"][1]["findings"][0]["reason"]
    assert (doc["gpus"][0]["pcie_generation"], doc["gpus"][0]["health"]) == (4, "OK")


def test_the_shipped_real_host_drill_starts_from_the_capture_and_fires_at_20_s() -> None:
    scenario = load_scenario(REPO / "scenarios" / "real-h100-drill.toml")
    assert scenario.capture is not None
    assert scenario.capture.gpus[0].uuid == "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa"
    clock = [0.0]
    with SimulatedNode(scenario, clock=lambda: clock[0]):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(3)
        dbe = pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL
        assert pynvml.nvmlDeviceGetFieldValues(handle, [dbe])[0].value.ullVal == 0
        clock[0] = 20.0
        assert pynvml.nvmlDeviceGetFieldValues(handle, [dbe])[0].value.ullVal == 1
        pynvml.nvmlShutdown()


def test_a_current_limit_below_the_requested_one_is_the_platforms(tmp_path: Path) -> None:
    # As on a GH200: 900 W requested (its default) while the module enforces 700 W.
    text = (REAL_HOSTS / "h100-x1.580.159.04.nvidia-smi-q.xml").read_text()
    for key, watts in (("requested", 900), ("default", 900), ("max", 900)):
        text = text.replace(
            f"<{key}_power_limit>700.00 W</{key}_power_limit>",
            f"<{key}_power_limit>{watts}.00 W</{key}_power_limit>",
            1,
        )
    capture = tmp_path / "gh200-like.xml"
    capture.write_text(text)
    snapshot = collect(capture)
    assert snapshot.health.severity is Severity.OK
    settings = _finding(snapshot, 0, "settings")
    assert settings.reason.startswith("power limit 700 W (the platform's; 900 W requested)")
    gpu = status_document(snapshot)["gpus"][0]
    assert (gpu["power_limit_w"], gpu["power_requested_limit_w"]) == (700, 900)
    # A fleet that declares 900 W is satisfied; one that declares 700 W is not.
    for watts, severity in ((900, Severity.OK), (700, Severity.WARN)):
        config = parse_config(f"[inventory.expected]\npower_limit_watts = {watts}\n")
        judged = _finding(collect(capture, config=config), 0, "settings")
        assert judged.severity is severity
