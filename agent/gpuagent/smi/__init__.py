"""`nvidia-smi -q` captures, text or XML, read into typed records.

``load_capture`` and ``parse_capture`` read what `nvidia-smi -q` and `nvidia-smi -q -x`
print; anything else, and a capture cut short, is a CaptureError naming the line. The
records are in model.py; what each format must contain is in the docstrings of text.py
and xml.py.
"""

from __future__ import annotations

from pathlib import Path

from gpuagent.smi.model import (
    Capture,
    CapturedGpu,
    CapturedMigDevice,
    CapturedProcess,
    CaptureError,
    ClockEventReasons,
    TemperatureThresholds,
)
from gpuagent.smi.text import parse_text

__all__ = [
    "Capture",
    "CaptureError",
    "CapturedGpu",
    "CapturedMigDevice",
    "CapturedProcess",
    "ClockEventReasons",
    "TemperatureThresholds",
    "load_capture",
    "parse_capture",
]

_XML_STARTS = ("<?xml", "<nvidia_smi_log", "<!DOCTYPE nvidia_smi_log")


def parse_capture(text: str) -> Capture:
    """The capture in ``text``: XML when it starts like an XML document, text otherwise."""
    text = text.removeprefix("\ufeff")
    if text.lstrip().startswith(_XML_STARTS):
        # The XML parser (ElementTree, expat) only for XML captures: it costs RSS.
        from gpuagent.smi.xml import parse_xml  # noqa: PLC0415

        return parse_xml(text)
    return parse_text(text)


def load_capture(path: Path) -> Capture:
    """The capture in the file at ``path``."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CaptureError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CaptureError(
            f"not an nvidia-smi -q capture: byte 0x{data[exc.start]:02x} is not UTF-8 text",
            data.count(b"\n", 0, exc.start) + 1,
        ) from exc
    return parse_capture(text)
