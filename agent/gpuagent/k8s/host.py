"""Reading the node's side of the Kubernetes GPU stack: kubelet's device plugin
directory, CDI specs and the NVIDIA container runtime. Blocking file I/O: the daemon
calls `read_host` in a worker thread. The parsers are pure and tested with real files.
"""

from __future__ import annotations

import fnmatch
import json
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuagent.k8s.model import CdiSpec, DevicePlugin, Toolkit

CHECKPOINT = "kubelet_internal_checkpoint"
CDI_SUFFIXES = (".yaml", ".yml", ".json")
# A runtime named "nvidia" in containerd's CRI config (v1 and v2 plugin ids, quoted or
# not): [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
_CONTAINERD_NVIDIA = re.compile(r"""^\s*\[[^\]]*\.runtimes\.["']?nvidia["']?\]""", re.MULTILINE)
# A CDI spec is a few kB; a file far larger is not one, and is not read whole.
_MAX_SPEC_BYTES = 4 * 1024 * 1024


class FormatError(ValueError):
    """A file that is not what its name says it is."""


def parse_checkpoint(text: str, resource: str) -> tuple[str, ...]:
    """The device ids kubelet's checkpoint registers for ``resource`` (empty: none).

    The file is ``{"Data": {"PodDeviceEntries": [...], "RegisteredDevices": {resource:
    [ids]}}, "Checksum": n}``; ValueError when it is not that.
    """
    document = json.loads(text)
    data = document.get("Data") if isinstance(document, dict) else None
    if not isinstance(data, dict):
        raise FormatError("no Data object")
    registered = data.get("RegisteredDevices")
    if registered is None:  # kubelet writes null when nothing is registered
        return ()
    if not isinstance(registered, dict):
        raise FormatError("RegisteredDevices is not an object")
    ids = registered.get(resource, [])
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise FormatError(f"RegisteredDevices[{resource!r}] is not a list of ids")
    return tuple(ids)


def parse_cdi_spec(text: str, path: str) -> CdiSpec:
    """One CDI spec (YAML, or JSON, which YAML reads too); ValueError if it is not one."""
    import yaml  # noqa: PLC0415 - only Kubernetes nodes read a CDI spec; it costs RSS

    try:
        document: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FormatError(f"not YAML: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("kind"), str):
        raise FormatError("no kind")
    devices = document.get("devices")
    if devices is None:  # a spec with no devices, only edits
        devices = []
    if not isinstance(devices, list):
        raise FormatError("devices is not a list")
    names = tuple(
        str(d["name"]) for d in devices if isinstance(d, dict) and d.get("name") is not None
    )
    return CdiSpec(path, document["kind"], names)


def find_socket(directory: Path, patterns: Sequence[str]) -> str | None:
    """The first unix socket in ``directory`` whose name matches one of ``patterns``;
    OSError when the directory cannot be listed (a missing one has no socket)."""
    try:
        entries = sorted(directory.iterdir())
    except FileNotFoundError:
        return None
    for entry in entries:
        if not any(fnmatch.fnmatchcase(entry.name, p) for p in patterns):
            continue
        try:
            if stat.S_ISSOCK(entry.lstat().st_mode):
                return entry.name
        except FileNotFoundError:  # gone between the listing and the look
            continue
    return None


def read_device_plugin(directory: Path, patterns: Sequence[str], resource: str) -> DevicePlugin:
    try:
        socket = find_socket(directory, patterns)
    except OSError as exc:
        return DevicePlugin(None, None, f"{directory}: {exc.strerror or exc}")
    try:
        text = (directory / CHECKPOINT).read_text(encoding="utf-8")
    except FileNotFoundError:
        return DevicePlugin(socket)
    except (OSError, UnicodeDecodeError) as exc:
        return DevicePlugin(socket, None, f"{CHECKPOINT}: {exc}")
    try:
        return DevicePlugin(socket, parse_checkpoint(text, resource))
    except ValueError as exc:
        return DevicePlugin(socket, None, f"{CHECKPOINT}: {exc}")


def read_cdi_specs(
    directories: Sequence[Path],
) -> tuple[tuple[CdiSpec, ...], tuple[tuple[str, str], ...]]:
    """Every CDI spec in ``directories`` (missing ones are empty), and those that did not
    parse with why."""
    specs: list[CdiSpec] = []
    unreadable: list[tuple[str, str]] = []
    for directory in directories:
        try:
            paths = sorted(p for p in directory.iterdir() if p.suffix in CDI_SUFFIXES)
        except FileNotFoundError:
            continue
        except OSError as exc:
            unreadable.append((str(directory), exc.strerror or str(exc)))
            continue
        for path in paths:
            try:
                specs.append(_read_spec(path))
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                unreadable.append((str(path), str(exc)))
    return tuple(specs), tuple(unreadable)


def _read_spec(path: Path) -> CdiSpec:
    with path.open("rb") as file:
        raw = file.read(_MAX_SPEC_BYTES + 1)
    if len(raw) > _MAX_SPEC_BYTES:
        raise FormatError("too large for a CDI spec")
    return parse_cdi_spec(raw.decode("utf-8"), str(path))


def find_runtime(paths: Sequence[Path], containerd_configs: Sequence[Path]) -> str | None:
    """Where the NVIDIA container runtime is: an existing runtime binary, else a
    containerd config naming a runtime "nvidia"; "" when nothing is configured to look at."""
    if not paths and not containerd_configs:
        return ""
    for path in paths:
        if path.is_file():
            return str(path)
    for config in containerd_configs:
        try:
            text = config.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if _CONTAINERD_NVIDIA.search(text):
            return str(config)
    return None


def read_toolkit(
    cdi_dirs: Sequence[Path], runtime_paths: Sequence[Path], containerd_configs: Sequence[Path]
) -> Toolkit:
    specs, unreadable = read_cdi_specs(cdi_dirs)
    return Toolkit(specs, unreadable, find_runtime(runtime_paths, containerd_configs))
