"""Exit codes a scheduler can trust: `check` and `status` exit 0 OK, 1 WARN, 2 CRITICAL, and 3
for whatever kept them from judging, never 2, which drains a node; `run` keeps 2 for an
invalid configuration (systemd's RestartPreventExitStatus=2). Every path, run as an operator
(or Slurm's HealthCheckProgram) runs the CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import DaemonProcess, run_cli, start_daemon

H100 = '[node]\ngpus = {gpus}\nmodel = "NVIDIA H100 80GB HBM3"\n'
WARN_FAULT = '[[fault]]\ngpu = 1\nkind = "row_remap_pending"\n'
CRITICAL_FAULT = '[[fault]]\ngpu = 2\nkind = "ecc_dbe"\ncount = 1\n'
REAL_HOSTS = Path(__file__).parent / "data" / "real-hosts"
DBE = (
    "Jul 31 11:22:39 gpu-node-17 kernel: NVRM: Xid (PCI:0000:07:00): 48, pid=77, name=python,"
    " An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.\n"
)


@dataclass(frozen=True)
class Case:
    command: str  # the arguments, with {placeholders} for the files and sockets below
    code: int
    says: str  # in what the command printed: the verdict, or why there is none


def case(code: int, says: str, command: str, name: str) -> Any:
    return pytest.param(Case(command, code, says), id=name)


NO_SUCH_FILE = "No such file or directory"
BAD_KEY = "sources.nvml.call_timeout_seconds (line 2)"
CASES = [
    # check: the verdict, from the simulator and from real hosts' captures
    case(0, "OK", "check --simulate {ok}", "check-ok"),
    case(1, "WARN", "check --simulate {warn}", "check-warn"),
    case(2, "CRITICAL", "check --simulate {critical}", "check-critical"),
    case(3, "UNKNOWN", "check --config {slow_config} --simulate {hang}", "check-gpu-unknown"),
    case(0, "OK", "check --from-nvidia-smi {idle_capture}", "replay-ok"),
    case(1, "WARN", "check --from-nvidia-smi {capture}", "replay-warn"),
    case(2, "CRITICAL", "check --from-nvidia-smi {capture} --dmesg {dbe}", "replay-critical"),
    # check: could not judge
    case(3, "unrecognized arguments: --bogus", "check --bogus", "check-unknown-flag"),
    case(3, "unrecognized arguments: --bogus", "--bogus check", "flag-before-check"),
    case(3, "invalid choice: 'rainbow'", "check --color rainbow", "check-bad-choice"),
    case(3, "expected one argument", "check --simulate", "check-option-without-value"),
    case(
        3,
        "cannot be combined",
        "check --simulate {ok} --from-nvidia-smi {capture}",
        "check-simulate-and-capture",
    ),
    case(3, BAD_KEY, "check --config {bad_config} --simulate {ok}", "check-invalid-config"),
    case(3, NO_SUCH_FILE, "check --config {tmp}/none.toml", "check-missing-config"),
    case(3, "Is a directory", "check --config {tmp}", "check-unreadable-config"),
    case(3, NO_SUCH_FILE, "check --from-nvidia-smi {tmp}/none.txt", "check-missing-capture"),
    case(3, "Is a directory", "check --from-nvidia-smi {tmp}", "check-unreadable-capture"),
    case(3, "line 1:", "check --from-nvidia-smi {not_capture}", "check-not-a-capture"),
    case(3, NO_SUCH_FILE, "check --simulate {tmp}/none.toml", "check-missing-scenario"),
    case(3, "node.gpus", "check --simulate {bad_scenario}", "check-invalid-scenario"),
    case(3, "node.nvidia_smi", "check --simulate {lost_replay}", "check-replay-of-nothing"),
    case(3, NO_SUCH_FILE, "check --simulate {ok} --dmesg {tmp}/none.log", "check-missing-dmesg"),
    # status: the running daemon's verdict (GPU 1 WARN, GPU 2 CRITICAL)
    case(2, "CRITICAL", "status --socket {socket}", "status-node-critical"),
    case(0, "OK", "status --socket {socket} --gpu 0", "status-gpu-ok"),
    case(1, "WARN", "status --socket {socket} --gpu 1", "status-gpu-warn"),
    case(2, "CRITICAL", "status --socket {socket} --gpu 2", "status-gpu-critical"),
    case(0, "CRITICAL", "status --socket {socket} --exit-zero", "status-exit-zero"),
    # status: could not judge
    case(3, "no GPU with index 42", "status --socket {socket} --gpu 42", "status-no-such-gpu"),
    case(
        3,
        "no GPU with index 42",
        "status --watch 0.2 --socket {socket} --gpu 42",
        "status-watch-no-such-gpu",
    ),
    case(3, "is the daemon running", "status --socket {tmp}/none.sock", "status-no-daemon"),
    case(
        3,
        "is the daemon running",
        "status --exit-zero --socket {tmp}/none.sock",
        "status-exit-zero-no-daemon",
    ),
    case(
        3,
        "is the daemon running",
        "status --watch 0.2 --socket {tmp}/none.sock",
        "status-watch-no-daemon",
    ),
    case(3, "cannot talk to gpuagent", "status --socket {not_capture}", "status-not-a-socket"),
    case(3, "Traceback", "status --socket {alien}", "status-unreadable-answer"),
    case(3, BAD_KEY, "status --config {bad_config}", "status-invalid-config"),
    case(3, NO_SUCH_FILE, "status --config {tmp}/none.toml", "status-missing-config"),
    case(
        3,
        "not allowed with argument",
        "status --config {bad_config} --socket {socket}",
        "status-config-and-socket",
    ),
    case(
        3,
        "--watch and --json cannot be combined",
        "status --watch --json --socket {socket}",
        "status-watch-and-json",
    ),
    case(3, "not a positive number of seconds", "status --watch 0", "status-watch-0"),
    case(3, "unrecognized arguments: --bogus", "status --bogus", "status-unknown-flag"),
    # the daemon and the configuration check keep 2 for a configuration or usage error
    case(2, BAD_KEY, "run --config {bad_config}", "run-invalid-config"),
    case(2, "invalid choice: 'xml'", "run --log-format xml", "run-usage"),
    case(2, BAD_KEY, "config check {bad_config}", "config-check-invalid"),
]


def _answer_with_another_schema(server: socket.socket, stop: threading.Event) -> None:
    """A daemon this CLI cannot read: every answer is a status document of another schema."""
    server.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        with conn:
            conn.recv(65536)
            answer = {"ok": True, "result": {"schema": 99, "nodes": []}}
            conn.sendall(json.dumps(answer).encode() + b"\n")


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("exit-codes")
    files = {
        "ok": H100.format(gpus=3),
        "warn": H100.format(gpus=3) + WARN_FAULT,
        "critical": H100.format(gpus=3) + CRITICAL_FAULT,
        "hang": H100.format(gpus=2) + '[[fault]]\ngpu = 1\nkind = "nvml_hang"\nseconds = 3\n',
        # Long enough for a healthy call on a busy machine, short of the 3 s hang.
        "slow_config": "[sources.nvml]\ncall_timeout_seconds = 1.5\n",
        "bad_config": "[sources.nvml]\ncall_timeout_seconds = 'slow'\n",
        "bad_scenario": '[node]\ngpus = "eight"\n',
        "lost_replay": '[node]\nnvidia_smi = "missing.txt"\n',
        "not_capture": "hello\nworld\n",
        "dbe": DBE,
    }
    places = {"tmp": str(tmp)}
    for name, text in files.items():
        (tmp / name).write_text(text)
        places[name] = str(tmp / name)
    places["capture"] = str(REAL_HOSTS / "a10.535.129.03.nvidia-smi-q.txt")
    places["idle_capture"] = str(REAL_HOSTS / "h100-x1-idle.590.48.01.nvidia-smi-q.txt")
    daemon: DaemonProcess = start_daemon(tmp / "daemon", files["warn"] + CRITICAL_FAULT)
    alien = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    alien.bind(str(tmp / "alien.sock"))
    alien.listen()
    stop = threading.Event()
    server = threading.Thread(target=_answer_with_another_schema, args=(alien, stop))
    server.start()
    try:
        daemon.wait_for(lambda d: [g["health"] for g in d["gpus"]] == ["OK", "WARN", "CRITICAL"])
        places["socket"] = str(daemon.socket)
        places["alien"] = str(tmp / "alien.sock")
        yield places
    finally:
        stop.set()
        server.join()
        alien.close()
        assert daemon.stop() == 0


@pytest.mark.parametrize("expected", CASES)
def test_exit_codes(places: dict[str, str], expected: Case) -> None:
    result = run_cli(*expected.command.format(**places).split())
    said = result.stdout + result.stderr
    assert (result.returncode, expected.says in said) == (expected.code, True), said
    if expected.says != "Traceback":
        assert "Traceback" not in result.stderr


# --- the scheduler recipes of docs/operations.md ----------------------------------------

OPERATIONS = (Path(__file__).parent.parent / "docs" / "operations.md").read_text()
FAKE_NODE = "gpu-node-7"


def _recipe(first_line: str) -> str:
    """The ```sh block of docs/operations.md that holds ``first_line``, unindented."""
    blocks = [b.split("```", 1)[0] for b in OPERATIONS.split("  ```sh\n")[1:]]
    (block,) = [b for b in blocks if first_line in b]
    return "".join(line.removeprefix("  ") for line in block.splitlines(keepends=True))


def _shims(directory: Path, args: str) -> Path:
    """A PATH on which `gpuagent` is the real CLI run with ``args`` added, and scontrol,
    logger and hostname stand for the node's: the first two write their arguments down."""
    directory.mkdir()
    shims = {
        "gpuagent": f'exec {sys.executable} -m gpuagent "$@" {args}',
        "scontrol": f'echo "scontrol $*" >> {directory / "calls"}',
        "logger": f'echo "logger $*" >> {directory / "calls"}',
        "hostname": f"echo {FAKE_NODE}",
    }
    for name, body in shims.items():
        (directory / name).write_text(f"#!/bin/sh\n{body}\n")
        (directory / name).chmod(0o755)
    return directory


@pytest.mark.parametrize(
    "recipe",
    [
        ["sh", "-c", _recipe("/usr/local/sbin/gpu-healthcheck")],
        # NHC sources its checks into bash; its die() marks the node offline.
        [
            "bash",
            "-c",
            'die() { echo "die $*" >> "$CALLS"; }\n'
            + _recipe("/etc/nhc/scripts/gpuagent.nhc")
            + "check_gpuagent",
        ],
    ],
    ids=["slurm", "nhc"],
)
@pytest.mark.parametrize(
    ("args", "drains", "logged"),
    [
        ("--simulate {ok}", False, ""),
        ("--simulate {warn}", False, ""),
        ("--simulate {critical}", True, ""),
        (
            "--config {bad_config}",
            False,
            "could not judge (exit 3): gpuagent: invalid configuration",
        ),
        ("--bogus", False, "could not judge (exit 3): usage: gpuagent"),
    ],
    ids=["ok", "warn", "critical", "config-typo", "usage"],
)
def test_the_recipes_drain_on_critical_only(
    places: dict[str, str],
    tmp_path: Path,
    recipe: list[str],
    args: str,
    drains: bool,
    logged: str,
) -> None:
    bin_dir = _shims(tmp_path / "bin", args.format(**places))
    calls = bin_dir / "calls"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls)}
    result = subprocess.run(
        recipe, env=env, capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == (1 if drains and recipe[0] == "bash" else 0), result.stderr
    made = calls.read_text() if calls.exists() else ""
    drained = (
        f"scontrol update NodeName={FAKE_NODE} State=DRAIN Reason=gpuagent check: CRITICAL"
        if recipe[0] == "sh"
        else "die 1 check_gpuagent: gpuagent check: CRITICAL"
    )
    assert (drained in made) is drains, made
    if logged:
        assert made.startswith("logger -p daemon.err -t gpu-healthcheck gpuagent check "), made
        assert logged in made, made
    else:
        assert "logger" not in made, made
