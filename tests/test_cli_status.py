"""`gpuagent status` colours and --watch, and --gpu in every form across the commands, run
as an operator runs them against a simulated daemon."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import PATIENCE, DaemonProcess, deadline_in, run_cli
from gpuagent.render import color_enabled, fit_to_width, render_status
from test_diag_cli import install_dcgmi

SCENARIO = '[node]\ngpus = 2\nmodel = "NVIDIA H100 80GB HBM3"\n'
ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
FRAME_HEADER = re.compile(r"Every 0\.2 s: gpuagent status")
Run = Callable[..., DaemonProcess]


def nvml_form(bus_id: str) -> str:
    """``0000:2a:00.0`` as NVML, metrics and alerts print it: ``00000000:2A:00.0``."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def critical_gpu_1(run_daemon: Run) -> tuple[DaemonProcess, dict[str, Any]]:
    """A daemon whose GPU 1 is CRITICAL (a double-bit ECC error) and GPU 0 OK."""
    daemon = run_daemon(SCENARIO)
    daemon.inject("ecc_dbe", 1, count=1)
    doc = daemon.wait_for(lambda d: d["gpus"][1]["health"] == "CRITICAL")
    return daemon, doc


def _as_from_a_shell() -> None:
    # Ctrl-C must reach the CLI as it would from a shell, whatever the test runner's
    # worker (a thread pool, an embedded library) left blocked or ignored.
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def gpuagent_process(*args: str, env: dict[str, str] | None = None, **popen: Any) -> Any:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuagent", *args],
        env={**os.environ, **(env or {})},
        preexec_fn=_as_from_a_shell,  # noqa: PLW1509 - only signal calls, safe after fork
        **popen,
    )


def _signal_state(pid: int) -> str:
    """The process's blocked and ignored signal masks, for a failure message."""
    status = Path(f"/proc/{pid}/status")
    lines = status.read_text().splitlines() if status.exists() else []
    return "; ".join(line for line in lines if line.startswith(("SigBlk", "SigIgn", "State")))


def read_until(fd: int, done: Callable[[str], bool], timeout: float = 20.0) -> str:
    """What comes from ``fd`` until ``done`` holds for it, or the writer closes it (EOF or,
    on a terminal, EIO)."""
    received = b""
    deadline = deadline_in(timeout)
    while not done(received.decode(errors="replace")):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"timed out; got {received!r}"
        if not select.select([fd], [], [], remaining)[0]:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the process on the terminal has exited
            break
        if not chunk:
            break
        received += chunk
    return received.decode(errors="replace")


def on_a_terminal(*args: str, env: dict[str, str], code: int = 0) -> str:
    """`gpuagent ARGS` with stdout a terminal (a pseudo-terminal), and what it printed; it
    must exit with ``code``."""
    controller, terminal = pty.openpty()
    process = gpuagent_process(*args, env=env, stdout=terminal, stderr=subprocess.PIPE)
    os.close(terminal)
    try:
        output = read_until(controller, lambda _text: False)
    finally:
        os.close(controller)
    _out, errors = process.communicate(timeout=30)
    assert process.returncode == code, errors
    return output


# --- colour -------------------------------------------------------------------------------


class Stream(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


@pytest.mark.parametrize(
    ("choice", "terminal", "environ", "expected"),
    [
        ("auto", True, {}, True),
        ("auto", False, {}, False),
        ("auto", True, {"NO_COLOR": "1"}, False),
        ("auto", True, {"NO_COLOR": ""}, True),  # no-color.org: set and not empty
        ("auto", True, {"TERM": "dumb"}, False),
        ("always", False, {"NO_COLOR": "1"}, True),
        ("never", True, {}, False),
    ],
)
def test_color_choice(choice: Any, terminal: bool, environ: dict[str, str], expected: bool) -> None:
    assert color_enabled(choice, Stream(terminal), environ) is expected


def test_colour_marks_the_severities_and_keeps_the_columns(run_daemon: Run) -> None:
    _daemon, doc = critical_gpu_1(run_daemon)
    plain = render_status(doc, now=doc["taken_at"])
    coloured = render_status(doc, now=doc["taken_at"], color=True)
    assert "\x1b" not in plain
    assert ESCAPE.sub("", coloured) == plain  # escapes do not shift the columns
    assert "(cluster default): \x1b[31mCRITICAL\x1b[0m" in coloured
    rows = [line for line in coloured.splitlines() if line.startswith(("0 ", "1 "))]
    assert "\x1b[32mOK" in rows[0]
    assert "\x1b[31mCRITICAL" in rows[1]


def test_piped_output_has_no_escapes_and_always_has(run_daemon: Run) -> None:
    daemon, _doc = critical_gpu_1(run_daemon)
    socket = str(daemon.socket)
    piped = run_cli("status", "--socket", socket)
    assert piped.returncode == 2, piped.stderr  # CRITICAL, as `check` exits
    assert "CRITICAL" in piped.stdout
    assert "\x1b" not in piped.stdout
    always = run_cli("status", "--socket", socket, "--color", "always")
    assert always.returncode == 2, always.stderr
    assert "\x1b[31mCRITICAL\x1b[0m" in always.stdout
    never = on_a_terminal("status", "--socket", socket, "--color", "never", env={}, code=2)
    assert "CRITICAL" in never
    assert "\x1b" not in never


def test_terminal_gets_colour_unless_no_color(run_daemon: Run) -> None:
    daemon, _doc = critical_gpu_1(run_daemon)
    args = ("status", "--socket", str(daemon.socket))
    env = {"TERM": "xterm", "NO_COLOR": ""}
    assert "\x1b[31mCRITICAL\x1b[0m" in on_a_terminal(*args, env=env, code=2)
    plain = on_a_terminal(*args, env={**env, "NO_COLOR": "1"}, code=2)
    assert "CRITICAL" in plain
    assert "\x1b" not in plain


# --- --watch ------------------------------------------------------------------------------


def test_watch_redraws_until_ctrl_c(run_daemon: Run) -> None:
    daemon = run_daemon(SCENARIO)
    process = gpuagent_process(
        "status",
        "--watch",
        "0.2",
        "--socket",
        str(daemon.socket),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        output = read_until(process.stdout.fileno(), lambda t: len(FRAME_HEADER.findall(t)) >= 2)
    finally:
        state = _signal_state(process.pid)
        process.send_signal(signal.SIGINT)
        try:
            rest, errors = process.communicate(timeout=10 * PATIENCE)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail(f"Ctrl-C did not end --watch ({state})")
    assert process.returncode == 0, errors
    assert b"Traceback" not in errors
    output += rest.decode()
    assert len(FRAME_HEADER.findall(output)) >= 2
    assert output.count(f"Node {daemon.status()['node']['name']}") >= 2
    assert "\x1b" not in output  # piped: no screen clearing, no colour


def test_watch_clears_the_screen_on_a_terminal_and_fits_its_width(run_daemon: Run) -> None:
    daemon = run_daemon(SCENARIO)
    daemon.inject("ecc_dbe", 1, count=1)  # a long reason on GPU 1's row
    controller, terminal = pty.openpty()
    # A narrow terminal: 60 columns (COLUMNS empty, so the window's size is what counts).
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 60, 0, 0))
    process = gpuagent_process(
        "status",
        "--watch",
        "0.2",
        "--socket",
        str(daemon.socket),
        env={"TERM": "xterm", "NO_COLOR": "", "COLUMNS": ""},
        stdout=terminal,
        stderr=subprocess.PIPE,
    )
    os.close(terminal)
    try:
        output = read_until(controller, lambda t: t.count("\x1b[H\x1b[2J") >= 2)
    finally:
        state = _signal_state(process.pid)
        process.send_signal(signal.SIGINT)
        try:
            _out, errors = process.communicate(timeout=10 * PATIENCE)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail(f"Ctrl-C did not end --watch ({state})")
        finally:
            os.close(controller)
    assert process.returncode == 0, errors
    assert "\x1b[32mOK\x1b[0m" in output
    # 60 columns: the table keeps GPU, HEALTH and REASON (less needed columns left out),
    # and no line is longer, so none wraps.
    assert "\x1b[31mCRITICAL\x1b[0m" in output
    lines = ESCAPE.sub("", output.replace("\x1b[H\x1b[2J", "")).splitlines()
    assert max(len(line) for line in lines) <= 60
    header = next(line for line in lines if line.startswith("GPU "))
    assert "HEALTH" in header
    assert "REASON" in header
    assert "MODEL" not in header


def test_watch_refuses_json_and_a_bad_interval(tmp_path: Any) -> None:
    # 3 (UNKNOWN), as every `status` that cannot judge: its 2 is CRITICAL.
    socket = str(tmp_path / "none.sock")
    both = run_cli("status", "--watch", "--json", "--socket", socket)
    assert both.returncode == 3
    assert "--watch and --json cannot be combined" in both.stderr
    zero = run_cli("status", "--watch", "0", "--socket", socket)
    assert zero.returncode == 3
    assert "not a positive number of seconds: '0'" in zero.stderr
    # No daemon: told at once, not watched.
    gone = run_cli("status", "--watch", "0.2", "--socket", socket)
    assert gone.returncode == 3
    assert gone.stderr.startswith("gpuagent: ")


# --- --gpu --------------------------------------------------------------------------------


def test_status_gpu_takes_every_form(run_daemon: Run) -> None:
    daemon, doc = critical_gpu_1(run_daemon)
    socket = str(daemon.socket)
    gpu_1 = doc["gpus"][1]
    forms = [
        "1",
        gpu_1["pci_bus_id"],
        nvml_form(gpu_1["pci_bus_id"]),
        gpu_1["pci_bus_id"].split(":", 1)[1],
        gpu_1["uuid"],
    ]
    for form in forms:
        result = run_cli("status", "--socket", socket, "--json", "--gpu", form)
        assert result.returncode == 2, (form, result.stderr)  # GPU 1 is CRITICAL
        assert [g["index"] for g in json.loads(result.stdout)["gpus"]] == [1], form
    both = run_cli("status", "--socket", socket, "--json", "--gpu", "0", gpu_1["uuid"])
    assert [g["index"] for g in json.loads(both.stdout)["gpus"]] == [0, 1]
    # The exit code is the named GPUs' worst: GPU 0 alone is OK.
    assert run_cli("status", "--socket", socket, "--gpu", "0").returncode == 0
    assert run_cli("status", "--socket", socket, "--exit-zero").returncode == 0
    table = run_cli("status", "--socket", socket, "--gpu", nvml_form(gpu_1["pci_bus_id"]))
    rows = [line.split()[0] for line in table.stdout.splitlines() if line[:1].isdigit()]
    assert rows == ["1"]


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (("status",), 3),  # UNKNOWN: no verdict on a GPU that is not there
        (("events",), 2),
        (("inject", "clear"), 2),
        (("inject", "xid", "48"), 2),
        (("diag",), 2),
    ],
)
def test_an_unknown_gpu_is_a_usage_error_naming_it_and_the_known_ones(
    run_daemon: Run, command: tuple[str, ...], code: int
) -> None:
    daemon = run_daemon(SCENARIO)
    bus_ids = [g["pci_bus_id"] for g in daemon.status()["gpus"]]
    result = run_cli(*command, "--socket", str(daemon.socket), "--gpu", "00000000:EE:00.0")
    assert result.returncode == code, result.stderr
    assert result.stdout == ""
    assert "no GPU with PCI bus id 00000000:EE:00.0; the daemon knows:" in result.stderr
    assert all(f"  {i}  {bus}  GPU-" in result.stderr for i, bus in enumerate(bus_ids))


def test_inject_and_events_resolve_every_form(run_daemon: Run) -> None:
    daemon = run_daemon(SCENARIO)
    socket = str(daemon.socket)
    gpu_1 = daemon.status()["gpus"][1]
    short = gpu_1["pci_bus_id"].split(":", 1)[1]  # 2a:00.0

    injected = run_cli("inject", "--socket", socket, "ecc_dbe", "--gpu", gpu_1["uuid"], "count=1")
    assert injected.returncode == 0, injected.stderr
    assert injected.stdout.startswith("injected ecc_dbe into GPU 1 ")
    daemon.wait_for(lambda d: d["gpus"][1]["health"] == "CRITICAL")

    drill = run_cli("inject", "--socket", socket, "xid", "48", "--gpu", short)
    assert drill.returncode == 0, drill.stderr
    daemon.wait_for(lambda _d: daemon.call("events", {"gpu": gpu_1["pci_bus_id"]})["events"])

    for form in ("1", nvml_form(gpu_1["pci_bus_id"]), short, gpu_1["uuid"]):
        result = run_cli("events", "--socket", socket, "--json", "--gpu", form)
        assert result.returncode == 0, (form, result.stderr)
        events = json.loads(result.stdout)
        assert [(e["gpu"], e["code"]) for e in events] == [(gpu_1["pci_bus_id"], 48)], form
    other = run_cli("events", "--socket", socket, "--json", "--gpu", "0")
    assert json.loads(other.stdout) == []
    # The API itself takes any bus-id form too.
    for form in (nvml_form(gpu_1["pci_bus_id"]), short):
        assert [e["code"] for e in daemon.call("events", {"gpu": form})["events"]] == [48]


def test_diag_resolves_every_form_to_indices(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, run_daemon: Run
) -> None:
    calls = install_dcgmi(tmp_path, monkeypatch)
    daemon = run_daemon(SCENARIO)
    gpu_0 = daemon.status()["gpus"][0]
    result = run_cli(
        "diag", "--socket", str(daemon.socket), "--json", "--gpu", nvml_form(gpu_0["pci_bus_id"])
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["gpus"] == [0]
    assert calls.read_text().splitlines() == ["diag -r 1 -j -i 0"]


@pytest.mark.parametrize(
    ("line", "width", "fitted"),
    [
        ("short", 10, "short"),
        ("exactly10!", 10, "exactly10!"),
        ("eleven char", 10, "eleven ch…"),
        # Colour escapes take no column, and a colour cut off is ended.
        ("0 \x1b[31mCRITICAL\x1b[0m", 10, "0 \x1b[31mCRITICAL\x1b[0m"),
        ("0 \x1b[31mCRITICAL\x1b[0m x", 8, "0 \x1b[31mCRITI\x1b[0m…"),
    ],
)
def test_fit_to_width(line: str, width: int, fitted: str) -> None:
    assert fit_to_width(line, width) == fitted
    assert fit_to_width(f"{line}\n{line}", width) == f"{fitted}\n{fitted}"
