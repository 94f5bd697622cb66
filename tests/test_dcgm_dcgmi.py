"""`dcgmi diag -j`: the parser over both documented layouts (stand-in reports in
tests/data/dcgmi/), the subprocess (a fake dcgmi script: argv, exit codes, timeout), and
the runner's choice between DCGM's bindings, dcgmi and "unavailable"."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from conftest import TEST_DATA
from gpuagent.dcgm import dcgmi
from gpuagent.dcgm.control import DiagUnavailableError
from gpuagent.dcgm.runner import DiagRunner, describe, failed_tests, result_json
from gpuagent.model import DiagResult, DiagTest

REPORTS = TEST_DATA / "dcgmi"


def parse_file(name: str, level: int = 1, gpus: tuple[int, ...] = ()) -> DiagResult:
    return dcgmi.parse((REPORTS / name).read_text(), level, gpus, 1.0, 2.0)


def outcomes(result: DiagResult) -> dict[tuple[str, int | None], str]:
    return {(t.name, t.gpu): t.outcome for t in result.tests}


# --- the parser ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "passed", "failed", "count"),
    [
        ("v4_level1_pass.json", True, [], 2),
        ("v4_level3_fail.json", False, ["memory (GPU 1)"], 8),
        ("v3_level1_pass.json", True, [], 9),
        ("v3_level2_fail.json", False, ["GPU Memory (GPU 1)"], 6),
    ],
)
def test_reports_of_both_layouts(name: str, passed: bool, failed: list[str], count: int) -> None:
    result = parse_file(name)
    assert result.error == ""
    assert result.via == "dcgmi"
    assert result.passed is passed
    assert failed_tests(result) == failed
    assert len(result.tests) == count


def test_dcgm_4_results_per_test_and_gpu() -> None:
    result = parse_file("v4_level3_fail.json", 3, (0, 1))
    assert outcomes(result) == {
        ("software", 0): "pass",
        ("software", 1): "pass",
        ("pcie", 0): "warn",
        ("pcie", 1): "pass",
        ("memory", 0): "pass",
        ("memory", 1): "fail",
        ("targeted_power", 0): "skip",
        ("targeted_power", 1): "skip",
    }  # the CPU's result is not about a GPU: left out
    by_key = {(t.name, t.gpu): t for t in result.tests}
    assert by_key[("memory", 1)].info.startswith("A memory mismatch was detected on GPU 1")
    assert by_key[("pcie", 0)].info == "GPU 0: PCIe link width is x8, expected x16"
    assert by_key[("pcie", 1)].info == "GPU 1 host to device bandwidth: 24.5 GB/s"
    assert result.failures(1) == (by_key[("memory", 1)],)
    assert result.failures(0) == ()
    assert (result.level, result.gpus, result.started, result.finished) == (3, (0, 1), 1.0, 2.0)


def test_dcgm_3_results_name_their_gpus_in_gpu_ids() -> None:
    result = parse_file("v3_level2_fail.json", 2)
    assert outcomes(result) == {
        ("Denylist", None): "pass",
        ("Persistence Mode", None): "pass",
        ("PCIe", 0): "pass",
        ("PCIe", 1): "pass",
        ("GPU Memory", 0): "pass",
        ("GPU Memory", 1): "fail",
    }
    memory = result.failures(1)[0]
    assert memory.info == "Error using CUDA API cudaMalloc on GPU 1"
    assert outcomes(parse_file("v3_level1_pass.json"))[("Inforom", None)] == "skip"


def test_a_diagnostic_that_could_not_run_is_an_error() -> None:
    result = parse_file("v4_runtime_error.json")
    assert not result.passed
    assert result.tests == ()
    assert "Unable to connect to the host engine" in result.error


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("Error: unable to connect to host engine", "printed no JSON"),
        ("[1, 2]", "without a diagnostic report"),
        ('{"DCGM Diagnostic": {"test_categories": []}}', "no test"),
        (
            (
                '{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "m", "results":'
                ' [{"entity_group": "GPU", "entity_id": "x", "status": "Pass"}]}]}]}}'
            ),
            "cannot read",
        ),
    ],
)
def test_unreadable_reports_never_pass(text: str, error: str) -> None:
    result = dcgmi.parse(text, 1, (), 0.0, 0.0)
    assert not result.passed
    assert error in result.error


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        ("Pass", "pass"),
        ("FAIL", "fail"),
        ("Warn", "warn"),
        ("Skip", "skip"),
        ("Not Run", "notrun"),
        ("Bogus", "fail"),
        (None, "fail"),
    ],
)
def test_statuses(status: str | None, outcome: str) -> None:
    entry: dict[str, object] = {"gpu_ids": "0"}
    if status is not None:
        entry["status"] = status
    doc = {
        "DCGM GPU Diagnostic": {"test_categories": [{"tests": [{"name": "t", "results": [entry]}]}]}
    }
    result = dcgmi.parse(json.dumps(doc), 1, (), 0.0, 0.0)
    assert result.tests == (DiagTest("t", outcome, 0, ""),)  # type: ignore[arg-type]


def test_a_test_failed_as_a_whole_fails_though_no_gpu_did() -> None:
    doc = {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "tests": [
                        {
                            "name": "diagnostic",
                            "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"}],
                            "test_summary": {
                                "status": "Fail",
                                "warnings": [{"warning": "plugin crashed"}],
                            },
                        }
                    ]
                }
            ]
        }
    }
    result = dcgmi.parse(json.dumps(doc), 3, (), 0.0, 0.0)
    assert not result.passed
    assert result.failures() == (DiagTest("diagnostic", "fail", None, "plugin crashed"),)


# --- the subprocess --------------------------------------------------------------------------


def fake_dcgmi(tmp_path: Path, body: str) -> Path:
    """An executable `dcgmi` shell script; its argv goes to args.txt beside it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "dcgmi"
    script.write_text(f'#!/bin/sh\necho "$@" > {bin_dir}/args.txt\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_the_command_line() -> None:
    assert dcgmi.command("dcgmi", 3, ()) == ["dcgmi", "diag", "-r", "3", "-j"]
    assert dcgmi.command("/usr/bin/dcgmi", 1, (2, 0, 2)) == [
        "/usr/bin/dcgmi",
        "diag",
        "-r",
        "1",
        "-j",
        "-i",
        "0,2",
    ]


async def test_runs_dcgmi_and_parses_its_report(tmp_path: Path) -> None:
    report = REPORTS / "v4_level3_fail.json"
    # dcgmi exits non-zero when a test failed; the report still says what failed.
    script = fake_dcgmi(tmp_path, f"cat {report}\nexit 226")
    before = time.time()
    result = await dcgmi.run(str(script), 3, (1, 0), 10.0)
    assert (script.parent / "args.txt").read_text().split() == [
        "diag",
        "-r",
        "3",
        "-j",
        "-i",
        "0,1",
    ]
    assert result.gpus == (0, 1)
    assert failed_tests(result) == ["memory (GPU 1)"]
    assert before <= result.started <= result.finished <= time.time()


async def test_a_failing_dcgmi_without_a_report_is_an_error(tmp_path: Path) -> None:
    script = fake_dcgmi(tmp_path, "echo 'Error: host engine not running' >&2\nexit 255")
    result = await dcgmi.run(str(script), 1, (), 10.0)
    assert not result.passed
    assert "printed no JSON" in result.error


async def test_a_dcgmi_that_hangs_is_killed(tmp_path: Path) -> None:
    script = fake_dcgmi(tmp_path, "exec sleep 30")
    started = time.monotonic()
    result = await dcgmi.run(str(script), 2, (), 0.5)
    assert time.monotonic() - started < 10
    assert not result.passed
    assert "did not finish within 0.5 s (killed)" in result.error


async def test_a_dcgmi_that_cannot_be_started(tmp_path: Path) -> None:
    result = await dcgmi.run(str(tmp_path / "nowhere" / "dcgmi"), 1, (), 5.0)
    assert "cannot run" in result.error


# --- choosing how the diagnostic runs --------------------------------------------------------


class Control:
    def __init__(self, *, unavailable: bool = False, delay: float = 0.0) -> None:
        self.unavailable = unavailable
        self.delay = delay
        self.calls: list[tuple[int, tuple[int, ...]]] = []
        self.timeouts: list[float] = []

    async def run_diag(
        self, level: int, gpu_ids: tuple[int, ...], limit_seconds: float
    ) -> DiagResult:
        import asyncio  # noqa: PLC0415

        self.calls.append((level, gpu_ids))
        self.timeouts.append(limit_seconds)
        if self.unavailable:
            raise DiagUnavailableError("host engine down")
        await asyncio.sleep(self.delay)
        return DiagResult(level, gpu_ids, 1.0, 2.0, "bindings", (DiagTest("software", "pass", 0),))

    async def detach_driver(self) -> bool:
        return False

    async def attach_driver(self) -> bool:
        return False


async def test_the_bindings_are_used_while_dcgm_is_up(tmp_path: Path) -> None:
    control = Control()
    script = fake_dcgmi(tmp_path, "exit 1")
    diag = DiagRunner(dcgm=lambda: control, which=lambda _n: str(script))
    assert diag.available() == "bindings"
    result = await diag.run(1, (0,))
    assert result.via == "bindings"
    assert control.calls == [(1, (0,))]
    assert control.timeouts == [300.0]  # the level's one limit
    assert not (script.parent / "args.txt").exists()


async def test_dcgmi_when_dcgm_is_down_or_absent(tmp_path: Path) -> None:
    script = fake_dcgmi(tmp_path, f"cat {REPORTS / 'v4_level1_pass.json'}")
    for control in (None, Control(unavailable=True)):
        diag = DiagRunner(dcgm=lambda c=control: c, which=lambda _n: str(script))  # type: ignore[misc]
        result = await diag.run(1)
        assert (result.via, result.passed) == ("dcgmi", True)


async def test_neither_is_unavailable() -> None:
    diag = DiagRunner(which=lambda _n: None)
    assert diag.available() is None
    with pytest.raises(DiagUnavailableError, match="dcgmi is not installed"):
        await diag.run(1)
    with pytest.raises(DiagUnavailableError, match="host engine down"):
        await DiagRunner(dcgm=lambda: Control(unavailable=True), which=lambda _n: None).run(1)
    assert diag.latest() == ()


async def test_dcgmi_is_found_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = fake_dcgmi(tmp_path, f"cat {REPORTS / 'v4_level1_pass.json'}")
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    assert DiagRunner().available() == "dcgmi"
    assert (await DiagRunner().run(1)).via == "dcgmi"


async def test_a_hung_dcgm_diagnostic_is_a_failure_not_a_fallback(tmp_path: Path) -> None:
    script = fake_dcgmi(tmp_path, f"cat {REPORTS / 'v4_level1_pass.json'}")
    diag = DiagRunner(
        dcgm=lambda: Control(delay=5.0), timeout=lambda _l: 0.2, which=lambda _n: str(script)
    )
    result = await diag.run(2)
    assert (result.via, result.passed) == ("bindings", False)
    assert "did not finish within 0.2 s" in result.error


async def test_the_latest_result_of_each_level_is_kept() -> None:
    control = Control()
    diag = DiagRunner(dcgm=lambda: control)
    await diag.run(1, (0,))
    await diag.run(3, (1,))
    await diag.run(1, (1,))
    assert [(r.level, r.gpus) for r in diag.latest()] == [(3, (1,)), (1, (1,))]
    with pytest.raises(ValueError, match="1, 2 or 3"):
        await diag.run(4)


async def test_one_diagnostic_at_a_time() -> None:
    import asyncio  # noqa: PLC0415

    control = Control(delay=0.2)
    diag = DiagRunner(dcgm=lambda: control)
    first = asyncio.create_task(diag.run(1))
    await asyncio.sleep(0.05)
    assert diag.running
    second = asyncio.create_task(diag.run(2))
    await asyncio.sleep(0.05)
    assert control.calls == [(1, ())]  # the second waits for the first
    await asyncio.gather(first, second)
    assert control.calls == [(1, ()), (2, ())]


def test_descriptions_and_json() -> None:
    result = parse_file("v4_level3_fail.json", 3, (0, 1))
    assert describe(result) == "failed: memory (GPU 1)"
    assert describe(parse_file("v4_runtime_error.json")).startswith("could not run: ")
    assert describe(parse_file("v4_level1_pass.json")) == "passed"
    doc = result_json(result)
    assert json.loads(json.dumps(doc)) == doc
    assert (doc["passed"], doc["failed"], doc["gpus"]) == (False, ["memory (GPU 1)"], [0, 1])
    assert {"name": "memory", "gpu": 1, "outcome": "fail"}.items() <= doc["tests"][5].items()  # type: ignore[index]
