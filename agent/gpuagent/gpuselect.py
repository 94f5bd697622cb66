"""Which GPU a `--gpu` argument names: an index (``3``), a PCI bus id in any form
(``0000:ba:00.0``, NVML's ``00000000:BA:00.0`` as metrics and alerts print it, or
``ba:00.0``), or a UUID (``GPU-...``). Resolved against the GPUs the daemon knows (its
status document), so a typo is an error that lists them, never an empty answer."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuagent.kernel.parse import canonical_pci


@dataclass(frozen=True, slots=True)
class KnownGpu:
    index: int
    pci_bus_id: str  # as the status document gives it
    uuid: str | None


class NoSuchGpuError(ValueError):
    """The argument names no GPU the daemon knows; the message lists those it does."""


def known_gpus(status: dict[str, Any]) -> list[KnownGpu]:
    """The GPUs of a status document (``gpuagent status --json``), by index."""
    gpus = [KnownGpu(g["index"], g["pci_bus_id"], g.get("uuid")) for g in status["gpus"]]
    return sorted(gpus, key=lambda gpu: gpu.index)


def resolve_gpu(selector: str, gpus: Sequence[KnownGpu]) -> KnownGpu:
    """The GPU ``selector`` names; NoSuchGpuError when it names none of ``gpus``."""
    text = selector.strip()
    if text.isdigit():
        what = f"index {int(text)}"
        found = [g for g in gpus if g.index == int(text)]
    elif text[:4].upper() == "GPU-":
        what = f"UUID {text}"
        found = [g for g in gpus if g.uuid is not None and g.uuid.lower() == text.lower()]
    elif (bus_id := canonical_pci(text)) is not None:
        what = f"PCI bus id {text}"
        found = [g for g in gpus if canonical_pci(g.pci_bus_id) == bus_id]
    else:
        raise NoSuchGpuError(
            f"--gpu {selector!r} is not a GPU index, a PCI bus id (0000:ba:00.0) or a UUID "
            f"(GPU-...); {_listing(gpus)}"
        )
    if not found:
        raise NoSuchGpuError(f"no GPU with {what}; {_listing(gpus)}")
    return found[0]


def resolve_gpus(selectors: Iterable[str], gpus: Sequence[KnownGpu]) -> list[KnownGpu]:
    """Every GPU the selectors name, each once, by index."""
    chosen = {gpu.index: gpu for gpu in (resolve_gpu(s, gpus) for s in selectors)}
    return [chosen[index] for index in sorted(chosen)]


def _listing(gpus: Sequence[KnownGpu]) -> str:
    if not gpus:
        return "the daemon knows no GPU"
    rows = (f"  {g.index}  {g.pci_bus_id}  {g.uuid or '-'}" for g in gpus)
    return "the daemon knows:\n" + "\n".join(rows)
