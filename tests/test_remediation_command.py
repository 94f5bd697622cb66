"""The command cordon backend, running small real programs that record what they got."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
import time
from pathlib import Path

import pytest

from gpuagent.remediation.backend import BackendConfigError
from gpuagent.remediation.command import CommandBackend, CommandBackendError
from gpuagent.remediation.types import CordonRequest

REQUEST = CordonRequest(
    node="gpu-node-1",
    cluster="train-a",
    reason="GPU 0000:3b:00.0: 1 uncorrectable ECC error (ecc)",
    request_id="gpu-node-1:1700000000000",
    gpus=("0000:3b:00.0",),
    findings=(
        ("0000:3b:00.0", "ecc", "1 uncorrectable ECC error"),
        ("", "kernel", "kernel log: NVRM: GPU has fallen off the bus"),
    ),
)

# Records its stdin next to itself, prints what ANSWER holds, exits with EXIT.
RECORDER = """\
import sys
from pathlib import Path

here = Path(sys.argv[1])
(here / "stdin.json").write_text(sys.stdin.read())
(here / "argv.json").write_text(repr(sys.argv[2:]))
answer = here / "answer"
if answer.exists():
    sys.stdout.write(answer.read_text())
sys.stderr.write("a line on stderr\\n")
sys.exit(int((here / "exit").read_text()) if (here / "exit").exists() else 0)
"""


class Site:
    """A recording program in a directory; what it answers is set per test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "recorder.py").write_text(RECORDER)

    def command(self, *extra: str) -> str:
        argv = [sys.executable, str(self.root / "recorder.py"), str(self.root), *extra]
        return shlex.join(argv)

    def backend(self, *extra: str, timeout: float = 10.0) -> CommandBackend:
        return CommandBackend(self.command(*extra), timeout=timeout, node="gpu-node-1")

    def answer(self, text: str, exit_status: int = 0) -> None:
        (self.root / "answer").write_text(text)
        (self.root / "exit").write_text(str(exit_status))

    def stdin(self) -> object:
        return json.loads((self.root / "stdin.json").read_text())


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site(tmp_path)


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path


def gone(pid: int) -> bool:
    """Not running: no such process, or a zombie nobody reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


# --- the request document and the answer --------------------------------------------------


async def test_the_program_gets_the_request_as_json_on_stdin(site: Site) -> None:
    site.answer('{"changed": true, "detail": "node drained in the site scheduler"}')

    result = await site.backend("--site", "a b").cordon(REQUEST)

    assert result.ok
    assert result.changed
    assert result.detail == "node drained in the site scheduler"
    assert site.stdin() == {
        "version": 1,
        "action": "cordon",
        "node": "gpu-node-1",
        "cluster": "train-a",
        "reason": REQUEST.reason,
        "request_id": "gpu-node-1:1700000000000",
        "gpus": ["0000:3b:00.0"],
        "findings": [
            {"gpu": "0000:3b:00.0", "check": "ecc", "reason": "1 uncorrectable ECC error"},
            {
                "gpu": "",
                "check": "kernel",
                "reason": "kernel log: NVRM: GPU has fallen off the bus",
            },
        ],
    }
    # argv is split like a shell would, without one: the quoted argument stays whole.
    assert (site.root / "argv.json").read_text() == "['--site', 'a b']"


async def test_uncordon_says_so_in_the_document(site: Site) -> None:
    site.answer('{"changed": false, "detail": "it was not ours"}')

    result = await site.backend().uncordon(REQUEST)

    assert result.ok
    assert not result.changed
    assert result.detail == "it was not ours"
    document = site.stdin()
    assert isinstance(document, dict)
    assert document["action"] == "uncordon"


@pytest.mark.parametrize(
    ("stdout", "changed", "detail"),
    [
        ("", True, ""),
        ("cordoned via the site tool\n", True, "cordoned via the site tool"),
        ("line one\nline two\n", True, "line one; line two"),
        ('starting\n{"changed": false, "detail": "already"}\n', False, "already"),
        ('{"changed": "yes", "detail": 7}', True, ""),
        ("[1, 2]", True, "[1, 2]"),
        ("{not json", True, "{not json"),
    ],
)
async def test_the_answer_is_read_leniently(
    site: Site, stdout: str, changed: bool, detail: str
) -> None:
    site.answer(stdout)

    result = await site.backend().cordon(REQUEST)

    assert result.ok
    assert result.changed is changed
    assert result.detail == detail


async def test_a_long_answer_is_clipped(site: Site) -> None:
    site.answer("x" * 2000)

    result = await site.backend().cordon(REQUEST)

    assert len(result.detail) == 500
    assert result.detail.endswith("…")


# --- failures -----------------------------------------------------------------------------


async def test_a_non_zero_exit_fails_with_stderr(site: Site) -> None:
    site.answer("", exit_status=3)

    result = await site.backend().cordon(REQUEST)

    assert not result.ok
    assert not result.changed
    assert result.detail == f"{sys.executable} exited with status 3: a line on stderr"


async def test_a_non_zero_exit_fails_with_the_programs_own_words(site: Site) -> None:
    site.answer('{"detail": "scheduler refused: node is reserved"}', exit_status=1)

    result = await site.backend().cordon(REQUEST)

    assert not result.ok
    assert result.detail.endswith("exited with status 1: scheduler refused: node is reserved")


async def test_a_program_killed_by_a_signal(tmp_path: Path) -> None:
    program = script(tmp_path, "suicide", "kill -TERM $$\n")

    result = await CommandBackend(str(program)).cordon(REQUEST)

    assert not result.ok
    assert result.detail == f"{program} was killed by SIGTERM"


async def test_a_program_that_ignores_stdin_still_works(tmp_path: Path) -> None:
    program = script(tmp_path, "quiet", "exit 0\n")

    result = await CommandBackend(str(program)).cordon(REQUEST)

    assert result.ok


async def test_a_program_that_runs_too_long_is_killed_with_its_children(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "child.pid"
    program = script(tmp_path, "slow", f"sleep 30 &\necho $! > {pidfile}\nwait\n")
    backend = CommandBackend(str(program), timeout=0.5)

    started = time.monotonic()
    result = await backend.cordon(REQUEST)

    assert time.monotonic() - started < 5
    assert not result.ok
    assert result.detail == f"{program} did not finish within 0.5 s; killed"
    assert gone(int(pidfile.read_text()))


async def test_a_cancelled_request_leaves_no_program_running(tmp_path: Path) -> None:
    pidfile = tmp_path / "self.pid"
    program = script(tmp_path, "slow", f"echo $$ > {pidfile}\nsleep 30\n")
    task = asyncio.create_task(CommandBackend(str(program), timeout=60).cordon(REQUEST))
    for _ in range(200):
        if pidfile.exists() and pidfile.read_text().strip():
            break
        await asyncio.sleep(0.02)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert gone(int(pidfile.read_text()))


async def test_a_missing_program_fails(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-program"

    result = await CommandBackend(f"{missing} --flag").cordon(REQUEST)

    assert not result.ok
    assert result.detail == f"cannot run {missing}: No such file or directory"


async def test_a_program_that_is_not_executable_fails(tmp_path: Path) -> None:
    program = tmp_path / "not-executable"
    program.write_text("#!/bin/bash\nexit 0\n")

    result = await CommandBackend(str(program)).uncordon(REQUEST)

    assert not result.ok
    assert result.detail == f"cannot run {program}: Permission denied"


@pytest.mark.parametrize("program", ["", "   ", "tool 'unbalanced"])
def test_an_unusable_command_line_is_a_configuration_error(program: str) -> None:
    with pytest.raises(BackendConfigError, match=r"remediation\.cordon\.command"):
        CommandBackend(program)


# --- state --------------------------------------------------------------------------------


async def test_state_asks_the_program(site: Site) -> None:
    site.answer(
        '{"cordoned": true, "owned": true, "reason": "gpuagent: GPU lost",'
        ' "since": "2024-05-01T10:00:00Z", "jobs": 0}'
    )

    state = await site.backend().state()

    assert state.cordoned
    assert state.owned
    assert state.reason == "gpuagent: GPU lost"
    assert dict(state.extra) == {"since": "2024-05-01T10:00:00Z", "jobs": "0"}
    document = site.stdin()
    assert isinstance(document, dict)
    assert document["action"] == "state"
    assert document["node"] == "gpu-node-1"


async def test_state_without_an_answer_raises(site: Site) -> None:
    site.answer("I do not know\n")
    with pytest.raises(CommandBackendError, match=r"boolean 'cordoned'.*I do not know"):
        await site.backend().state()


async def test_state_of_a_failing_program_raises(site: Site) -> None:
    site.answer("", exit_status=2)
    with pytest.raises(CommandBackendError, match="exited with status 2"):
        await site.backend().state()


async def test_requests_run_one_at_a_time(tmp_path: Path) -> None:
    log = tmp_path / "log"
    program = script(tmp_path, "slowish", f"echo start >> {log}\nsleep 0.2\necho end >> {log}\n")
    backend = CommandBackend(str(program))

    results = await asyncio.gather(backend.cordon(REQUEST), backend.uncordon(REQUEST))

    assert all(r.ok for r in results)
    assert log.read_text().split() == ["start", "end", "start", "end"]
