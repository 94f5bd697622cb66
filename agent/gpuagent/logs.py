"""Log formats for the daemon's stderr.

- ``text`` on a terminal: ``2024-05-01 12:00:00,000 INFO gpuagent.daemon: message``.
- ``text`` under systemd (``$JOURNAL_STREAM`` set): no timestamp, which journald adds, and
  an sd-daemon(3) priority prefix such as ``<4>`` so that journald records the level
  (``journalctl -p warning`` works).
- ``json``: one object a line with time, level, logger, message and any ``extra=`` fields,
  for log shippers.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, Final, TextIO

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
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and key not in document:
                document[key] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return json.dumps(document, default=str)


def make_formatter(log_format: str, *, under_journal: bool) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    if log_format != "text":
        raise ValueError(f"unknown log format {log_format!r}; expected one of {FORMATS}")
    if under_journal:
        return JournalFormatter()
    return logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def setup(level: str, log_format: str = "text", stream: TextIO | None = None) -> None:
    """Configure the root logger to write ``log_format`` to ``stream`` (stderr)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(make_formatter(log_format, under_journal=under_journal()))
    logging.basicConfig(level=level.upper(), handlers=[handler])


def under_journal() -> bool:
    """Whether stderr is connected to journald (systemd sets ``$JOURNAL_STREAM``)."""
    return bool(os.environ.get("JOURNAL_STREAM"))
