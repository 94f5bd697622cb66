"""Files the simulator serves for the agent to read as it reads procfs and sysfs."""

from __future__ import annotations

from pathlib import Path


def replace_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` unless it holds it already."""
    # Replaced whole, never truncated in place: the agent may be reading it right now.
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return
    partial = path.with_name(f".{path.name}.new")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)
