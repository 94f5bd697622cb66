"""Log formats: journald priority prefixes under systemd, JSON lines for shippers."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
from pathlib import Path

import pytest

from conftest import run_cli, start_daemon
from gpuagent import logs


def _record(level: int, message: str = "hello %s", **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("gpuagent.test", level, __file__, 1, message, ("world",), None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


@pytest.mark.parametrize(
    ("level", "priority"),
    [
        (logging.CRITICAL, 3),
        (logging.ERROR, 3),
        (logging.WARNING, 4),
        (logging.INFO, 6),
        (logging.DEBUG, 7),
        (5, 7),
    ],
)
def test_syslog_priority(level: int, priority: int) -> None:
    assert logs.syslog_priority(level) == priority


@pytest.mark.parametrize(
    ("log_format", "under_journal", "level", "pattern"),
    [
        ("text", True, logging.ERROR, r"<3>ERROR gpuagent\.test: hello world"),
        ("text", True, logging.WARNING, r"<4>WARNING gpuagent\.test: hello world"),
        ("text", True, logging.INFO, r"<6>INFO gpuagent\.test: hello world"),
        ("text", True, logging.DEBUG, r"<7>DEBUG gpuagent\.test: hello world"),
        (
            "text",
            False,
            logging.INFO,
            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO gpuagent\.test: hello world",
        ),
    ],
)
def test_text_formats(log_format: str, under_journal: bool, level: int, pattern: str) -> None:
    formatter = logs.make_formatter(log_format, under_journal=under_journal)
    assert re.fullmatch(pattern, formatter.format(_record(level)))


def test_journal_prefixes_every_line_of_a_traceback() -> None:
    formatter = logs.make_formatter("text", under_journal=True)
    try:
        raise ValueError("boom")  # noqa: TRY301
    except ValueError:
        record = _record(logging.ERROR)
        record.exc_info = sys.exc_info()
    lines = formatter.format(record).split("\n")
    assert len(lines) > 2
    assert all(line.startswith("<3>") for line in lines)


@pytest.mark.parametrize("under_journal", [True, False])
def test_json_format(under_journal: bool) -> None:
    formatter = logs.make_formatter("json", under_journal=under_journal)
    doc = json.loads(formatter.format(_record(logging.WARNING, gpu=3, path=Path("/x"))))
    assert doc["level"] == "warning"
    assert doc["logger"] == "gpuagent.test"
    assert doc["message"] == "hello world"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", doc["time"])
    assert doc["gpu"] == 3
    assert doc["path"] == "/x"
    assert set(doc) == {"time", "level", "logger", "message", "gpu", "path"}


def test_json_format_carries_the_exception() -> None:
    formatter = logs.make_formatter("json", under_journal=False)
    try:
        raise ValueError("boom")  # noqa: TRY301
    except ValueError:
        record = _record(logging.ERROR)
        record.exc_info = sys.exc_info()
    doc = json.loads(formatter.format(record))
    assert "ValueError: boom" in doc["exception"]


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="xml"):
        logs.make_formatter("xml", under_journal=False)


def _journal_stream(monkeypatch: pytest.MonkeyPatch, fd: int) -> None:
    """$JOURNAL_STREAM as systemd sets it for a stream connected to journald: that stream's
    device and inode."""
    stat = os.fstat(fd)
    monkeypatch.setenv("JOURNAL_STREAM", f"{stat.st_dev}:{stat.st_ino}")


def test_under_journal_only_for_the_stream_journal_stream_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (tmp_path / "journal").open("w") as journal, (tmp_path / "file").open("w") as other:
        monkeypatch.delenv("JOURNAL_STREAM", raising=False)
        assert not logs.under_journal(journal)
        _journal_stream(monkeypatch, journal.fileno())
        assert logs.under_journal(journal)
        # A child of a unit whose stderr was redirected inherits the variable.
        assert not logs.under_journal(other)
        assert not logs.under_journal(io.StringIO())  # no file descriptor
        for garbage in ("", "8", "x:y", "8:"):
            monkeypatch.setenv("JOURNAL_STREAM", garbage)
            assert not logs.under_journal(journal)


def test_setup_writes_to_the_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    path = tmp_path / "stderr"
    with path.open("w") as stream:
        _journal_stream(monkeypatch, stream.fileno())
        logs.setup("info", "text", stream)
        logging.getLogger("gpuagent.test").info("started")
        logging.getLogger("gpuagent.test").debug("hidden")
    assert path.read_text() == "<6>INFO gpuagent.test: started\n"


def test_setup_with_journal_stream_of_another_file_keeps_timestamps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    path = tmp_path / "stderr"
    with (tmp_path / "journal").open("w") as journal, path.open("w") as stream:
        _journal_stream(monkeypatch, journal.fileno())
        logs.setup("info", "text", stream)
        logging.getLogger("gpuagent.test").info("started")
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO gpuagent\.test: started\n", path.read_text()
    )


def test_run_rejects_an_unknown_format() -> None:
    result = run_cli("run", "--log-format", "xml")
    assert result.returncode == 2
    assert "--log-format" in result.stderr


SCENARIO = '[node]\ngpus = 2\nmodel = "NVIDIA H100 80GB HBM3"\n'


def test_daemon_under_journald_prefixes_priorities(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # start_daemon opens daemon.log with "w": truncated, same inode.
    log = tmp_path / "daemon.log"
    log.touch()
    stat = log.stat()
    monkeypatch.setenv("JOURNAL_STREAM", f"{stat.st_dev}:{stat.st_ino}")
    daemon = start_daemon(tmp_path, SCENARIO)
    daemon.stop()
    lines = (tmp_path / "daemon.log").read_text().splitlines()
    assert any(line.startswith("<6>INFO gpuagent") for line in lines), lines
    assert all(re.match(r"<[3467]>[A-Z]+ ", line) for line in lines), lines


def test_under_journald_with_bindings_extra_fields_become_journal_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[tuple[str, dict[str, str]]] = []
    _journal_stream(monkeypatch, sys.stderr.fileno())
    logs.setup(
        "info", "text", journal_send=lambda message, **fields: sent.append((message, fields))
    )
    try:
        logging.getLogger("gpuagent.daemon").warning(
            "GPU %s critical",
            "0000:3b:00.0",
            extra={"gpu_bus_id": "0000:3b:00.0", "check": "ecc", "xid": None},
        )
    finally:
        logging.getLogger().handlers.clear()
    assert sent == [
        (
            "gpuagent.daemon: GPU 0000:3b:00.0 critical",
            {
                "PRIORITY": "4",
                "SYSLOG_IDENTIFIER": "gpuagent",
                "LOGGER": "gpuagent.daemon",
                "GPUAGENT_GPU_BUS_ID": "0000:3b:00.0",
                "GPUAGENT_CHECK": "ecc",
            },
        )
    ]


def test_without_bindings_journald_gets_prefixed_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "journal_sender", lambda: None)
    path = tmp_path / "stderr"
    with path.open("w") as stream:
        _journal_stream(monkeypatch, stream.fileno())
        logs.setup("info", "text", stream)
        try:
            logging.getLogger("x").error("boom", extra={"check": "ecc"})
        finally:
            logging.getLogger().handlers.clear()
    assert path.read_text() == "<3>ERROR x: boom\n"
