"""docs/hardware-profiles.md is generated from the profiles and the real-host captures,
so it cannot drift: `GPUAGENT_WRITE_DOCS=1` rewrites it instead of comparing."""

from __future__ import annotations

import os

from hardware_profiles_doc import DOC, render


def test_hardware_profiles_doc_is_current() -> None:
    expected = render()
    if os.environ.get("GPUAGENT_WRITE_DOCS") == "1":
        DOC.write_text(expected)
    assert DOC.read_text() == expected, (
        "docs/hardware-profiles.md is stale: run "
        "GPUAGENT_WRITE_DOCS=1 .venv/bin/pytest tests/test_hardware_profiles_doc.py"
    )
