"""Learn mode: the first healthy inventory's fingerprint, kept across restarts.

Stored as JSON in `agent.state_dir`, written to a temporary file and renamed over the old
one, so a crash mid-write leaves either the old baseline or the new one, never half.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

BASELINE_FILE = "inventory-baseline.json"


def load_baseline(path: Path) -> dict[str, str] | None:
    """The stored fingerprint; None when there is none yet (or it is unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        # A damaged baseline is relearned rather than trusted.
        log.warning("ignoring inventory baseline %s: %s", path, exc)
        return None
    fingerprint = data.get("fingerprint") if isinstance(data, dict) else None
    if not isinstance(fingerprint, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in fingerprint.items()
    ):
        log.warning("ignoring inventory baseline %s: no fingerprint in it", path)
        return None
    return dict(fingerprint)


def save_baseline(path: Path, fingerprint: dict[str, str], learned_at: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    document = {"learned_at": learned_at, "fingerprint": fingerprint}
    with temporary.open("w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(path)
