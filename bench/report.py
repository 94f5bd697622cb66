"""What every benchmark prints and keeps: a table of rows, and bench/results/<name>.json;
and the small helpers they share."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(samples: list[float], pct: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


@dataclass
class Row:
    name: str
    value: float
    unit: str
    target: str = ""
    ok: bool | None = None
    reference: str = ""


def report(rows: list[Row], name: str, *, digits: int = 3, **context: Any) -> int:
    """Print the table, write the JSON (with ``context``); 1 if a row missed its target."""
    width = max(len(r.name) for r in rows)
    print(f"{'benchmark':<{width}}  {'value':>10}  {'unit':<12} {'target':<7} {'ok':<4} reference")
    for r in rows:
        ok = "" if r.ok is None else ("yes" if r.ok else "NO")
        print(
            f"{r.name:<{width}}  {r.value:>10.{digits}f}  {r.unit:<12} {r.target:<7} {ok:<4} "
            f"{r.reference}".rstrip()
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    document = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        **context,
        "rows": [r.__dict__ for r in rows],
    }
    (RESULTS / f"{name}.json").write_text(json.dumps(document, indent=2))
    return 0 if all(r.ok is not False for r in rows) else 1
