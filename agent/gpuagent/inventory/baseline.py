"""Learn mode: what the first healthy inventory was, kept across restarts.

Stored as JSON in `agent.state_dir`, written to a temporary file and renamed over the old
one, so a crash mid-write leaves either the old baseline or the new one, never half.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuagent.inventory.model import GpuInventory, NodeInventory, fingerprint, joined

log = logging.getLogger(__name__)

BASELINE_FILE = "inventory-baseline.json"


@dataclass(frozen=True, slots=True)
class LearnedSettings:
    """One GPU's settings when the baseline was learned: what it is expected to keep."""

    index: int
    persistence: bool | None = None
    power_limit_w: float | None = None  # the requested limit (else the current one)
    applications_clock_mhz: int | None = None
    compute_mode: str | None = None


@dataclass(frozen=True, slots=True)
class Baseline:
    """The learned node. A field is None when it was not known at learning time, or the
    file was written before the field existed: it is then not compared."""

    fingerprint: dict[str, str]
    gpus: int | None = None  # `NodeInventory.gpus_seen`: on the PCI bus, whatever the driver
    nvswitches: int | None = None  # on the PCI bus
    models: str | None = None  # the GPUs' model names, sorted, comma-separated
    modules: tuple[str, ...] | None = None  # the NVIDIA kernel modules loaded, sorted
    settings: tuple[LearnedSettings, ...] = ()  # by GPU index

    def settings_of(self, index: int) -> LearnedSettings | None:
        return next((s for s in self.settings if s.index == index), None)


def _settings(gpu: GpuInventory) -> LearnedSettings:
    requested = gpu.power_requested_limit_w
    return LearnedSettings(
        index=gpu.index,
        persistence=gpu.persistence,
        power_limit_w=requested if requested is not None else gpu.power_limit_w,
        applications_clock_mhz=gpu.applications_clock_mhz,
        compute_mode=gpu.compute_mode,
    )


def learn(inventory: NodeInventory) -> Baseline:
    return Baseline(
        fingerprint=fingerprint(inventory),
        gpus=inventory.gpus_seen,
        nvswitches=inventory.nvswitches_seen,
        models=joined([g.model for g in inventory.gpus]) or None,
        modules=inventory.host.loaded_modules(),
        settings=tuple(_settings(g) for g in inventory.gpus),
    )


def _typed(value: Any, kind: type | tuple[type, ...]) -> Any:
    """``value`` if it is of ``kind`` (a bool is no number here), else None."""
    if isinstance(value, bool) and kind is not bool:
        return None
    return value if isinstance(value, kind) else None


def _load_settings(value: Any) -> tuple[LearnedSettings, ...]:
    """The learned settings of a stored baseline; a file from before they were learned, or
    an entry that is not one, gives none (nothing is then compared)."""
    if not isinstance(value, list):
        return ()
    found = []
    for entry in value:
        index = _count(entry.get("index")) if isinstance(entry, dict) else None
        if index is None:
            continue
        limit = _typed(entry.get("power_limit_w"), (int, float))
        found.append(
            LearnedSettings(
                index=index,
                persistence=_typed(entry.get("persistence"), bool),
                power_limit_w=None if limit is None else float(limit),
                applications_clock_mhz=_typed(entry.get("applications_clock_mhz"), int),
                compute_mode=_typed(entry.get("compute_mode"), str),
            )
        )
    return tuple(found)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def load_baseline(path: Path) -> Baseline | None:
    """The stored baseline; None when there is none yet (or it is unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        # A damaged baseline is relearned rather than trusted.
        log.warning("ignoring inventory baseline %s: %s", path, exc)
        return None
    print_ = data.get("fingerprint") if isinstance(data, dict) else None
    if not isinstance(print_, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in print_.items()
    ):
        log.warning("ignoring inventory baseline %s: no fingerprint in it", path)
        return None
    models, modules = data.get("models"), data.get("modules")
    return Baseline(
        fingerprint=dict(print_),
        gpus=_count(data.get("gpus")),
        nvswitches=_count(data.get("nvswitches")),
        models=models if isinstance(models, str) and models else None,
        modules=tuple(modules)
        if isinstance(modules, list) and all(isinstance(m, str) for m in modules)
        else None,
        settings=_load_settings(data.get("settings")),
    )


def save_baseline(path: Path, baseline: Baseline, learned_at: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    document = {
        "learned_at": learned_at,
        "fingerprint": baseline.fingerprint,
        "gpus": baseline.gpus,
        "nvswitches": baseline.nvswitches,
        "models": baseline.models,
        "modules": None if baseline.modules is None else list(baseline.modules),
        "settings": [dataclasses.asdict(s) for s in baseline.settings],
    }
    with temporary.open("w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(path)
