"""Log formats for the daemon's stderr.

- ``text`` on a terminal: ``2024-05-01 12:00:00,000 INFO gpuagent.daemon: message``.
- ``text`` under systemd (stderr is the stream ``$JOURNAL_STREAM`` names): no timestamp,
  which journald adds, and an sd-daemon(3) priority prefix such as ``<4>`` so that journald
  records the level (``journalctl -p warning`` works).
- ``json``: one object a line with time, level, logger, message and any ``extra=`` fields,
  for log shippers.
- Under systemd with the systemd Python bindings installed, ``text`` goes to the journal
  natively instead: the same priority, plus the ``extra=`` fields (GPU bus id and UUID,
  check, XID, ...) as journal fields (``GPUAGENT_GPU_BUS_ID=...``), so
  ``journalctl GPUAGENT_CHECK=ecc`` finds them.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final, TextIO

JournalSend = Callable[..., None]

FORMATS: Final = ("text", "json")

# syslog priorities, as sd-daemon(3) prefixes carry them
_PRIORITIES: Final = ((logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))
_DEBUG_PRIORITY: Final = 7

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS: Final = frozenset(
    {*vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)), "message", "asctime"}
)


def syslog_priority(levelno: int) -> int:
    """CRITICAL and ERROR → 3 (err), WARNING → 4, INFO → 6, DEBUG and below → 7."""
    for threshold, priority in _PRIORITIES:
        if levelno >= threshold:
            return priority
    return _DEBUG_PRIORITY


class JournalFormatter(logging.Formatter):
    """``<P>LEVEL logger: message``; every line of a multi-line message (a traceback) gets
    the prefix, since journald reads each line as its own entry."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in extra_fields(record).items():
            if key not in document:
                document[key] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return json.dumps(document, default=str)


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """What a log call passed in ``extra=``."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}


_FIELD_RE = re.compile(r"[^A-Z0-9_]")


class JournalFieldsHandler(logging.Handler):
    """Writes records to the journal with their ``extra=`` fields as journal fields
    (upper-cased, prefixed GPUAGENT_; None values left out)."""

    def __init__(self, send: JournalSend) -> None:
        super().__init__()
        self._send = send
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = {
                "GPUAGENT_" + _FIELD_RE.sub("_", key.upper()): str(value)
                for key, value in extra_fields(record).items()
                if value is not None
            }
            self._send(
                self.format(record),
                PRIORITY=str(syslog_priority(record.levelno)),
                SYSLOG_IDENTIFIER="gpuagent",
                LOGGER=record.name,
                **fields,
            )
        except Exception:  # noqa: BLE001 - logging must never raise into the daemon
            self.handleError(record)


def journal_sender() -> JournalSend | None:
    """systemd.journal.send when the systemd bindings are installed."""
    try:
        journal = importlib.import_module("systemd.journal")  # optional dependency
    except ImportError:
        return None
    send: JournalSend = journal.send
    return send


def make_formatter(log_format: str, *, under_journal: bool) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    if log_format != "text":
        raise ValueError(f"unknown log format {log_format!r}; expected one of {FORMATS}")
    if under_journal:
        return JournalFormatter()
    return logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def setup(
    level: str,
    log_format: str = "text",
    stream: TextIO | None = None,
    *,
    journal_send: JournalSend | None = None,
) -> None:
    """Configure the root logger: ``log_format`` to ``stream`` (stderr), or, under
    journald with the systemd bindings (``journal_send``), text to the journal natively."""
    target = stream if stream is not None else sys.stderr
    journal = under_journal(target)
    send = journal_send or (journal_sender() if journal and stream is None else None)
    handler: logging.Handler
    if journal and log_format == "text" and send is not None:
        handler = JournalFieldsHandler(send)
    else:
        handler = logging.StreamHandler(target)
        handler.setFormatter(make_formatter(log_format, under_journal=journal))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def under_journal(stream: TextIO) -> bool:
    """Whether ``stream`` is connected to journald. systemd sets ``$JOURNAL_STREAM`` to the
    ``device:inode`` of the stream it connected (systemd.exec(5)); the variable is inherited
    by children whose stderr was redirected (``gpuagent check > file`` from a unit), so it
    counts only when it names this very stream."""
    device, sep, inode = os.environ.get("JOURNAL_STREAM", "").partition(":")
    if not sep:
        return False
    try:
        stat = os.fstat(stream.fileno())
        return (stat.st_dev, stat.st_ino) == (int(device), int(inode))
    except (OSError, ValueError):  # no file descriptor (io.UnsupportedOperation), or garbage
        return False
