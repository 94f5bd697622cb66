"""Reading the host's side of the inventory: sysfs, procfs and os-release.

Plain blocking file reads; the daemon runs `collect_host` in a thread under a timeout.
Every root comes from the configuration, so tests point them at fixture trees. A file
that is missing or unreadable gives None: the checks then say "not reported" rather
than guess.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

from gpuagent.inventory.kernels import read_kernel_modules
from gpuagent.inventory.model import (
    KNOWN_MODULES,
    UNKNOWN_DRIVER,
    HostFacts,
    PciFunction,
    Service,
)
from gpuagent.sources.pcie import canonical_bus_id, read_hex, read_stripped, role_of


def _entries(directory: Path) -> Iterator[Path]:
    try:
        yield from sorted(directory.iterdir())
    except OSError:
        return


def _driver(function: Path) -> str | None:
    """The bound driver's name; None when none is bound, UNKNOWN_DRIVER when the link
    cannot be followed (a symlink loop raises RuntimeError before Python 3.13)."""
    link = function / "driver"
    try:
        return link.resolve().name if link.is_symlink() else None
    except (OSError, RuntimeError):
        return UNKNOWN_DRIVER


def _is_virtual_function(function: Path) -> bool:
    """An SR-IOV virtual function has a physfn link to the GPU it is a slice of."""
    try:
        return (function / "physfn").is_symlink()
    except OSError:
        return False


def read_pci_functions(sys_root: Path) -> tuple[PciFunction, ...] | None:
    """NVIDIA GPUs and NVSwitches under ``sys_root``, driver bound or not.

    SR-IOV virtual functions are left out: each is a slice of a GPU listed already, not a
    GPU of its own. None when there is no PCI devices directory at all (a wrong root or
    no sysfs), so "could not look" is never mistaken for "no GPUs".
    """
    devices = sys_root / "bus" / "pci" / "devices"
    if not devices.is_dir():
        return None
    functions = []
    for entry in _entries(devices):
        address = canonical_bus_id(entry.name)
        role = role_of(read_hex(entry / "vendor"), read_hex(entry / "class"))
        if address is None or role is None or role == "bridge" or _is_virtual_function(entry):
            continue
        functions.append(PciFunction(address, role, read_hex(entry / "device"), _driver(entry)))
    return tuple(sorted(functions, key=lambda f: f.address))


def read_modules(sys_root: Path, required: tuple[str, ...]) -> tuple[tuple[str, bool | None], ...]:
    """(module, loaded) for the NVIDIA modules: /sys/module/NAME exists while it is loaded.

    Loaded is None for every module when /sys/module itself cannot be listed (a wrong
    root, sysfs not mounted): "could not look" is never taken for "not loaded".
    """
    names = (*KNOWN_MODULES, *(m for m in required if m not in KNOWN_MODULES))
    try:
        present = {entry.name for entry in (sys_root / "module").iterdir()}
    except OSError:
        return tuple((name, None) for name in names)
    return tuple((name, name in present) for name in names)


# libnvidia-ml.so.1 links to the library file named after the driver version.
_NVML_LIBRARY = "libnvidia-ml.so.1"
_VERSIONED_LIBRARY_RE = re.compile(r"^libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$")


def read_library_version(library_dirs: tuple[Path, ...]) -> str | None:
    """The driver version of the installed NVML library, from the file libnvidia-ml.so.1
    links to (libnvidia-ml.so.550.54.15) in the first of ``library_dirs`` that has one.

    Read without NVML, so it is known even when nvmlInit fails (a library that does not
    match the kernel module); None when no such link is found.
    """
    for directory in library_dirs:
        try:
            # strict: a link to a file that is gone is no installed library.
            target = (directory / _NVML_LIBRARY).resolve(strict=True)
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop, before Python 3.13
            continue
        match = _VERSIONED_LIBRARY_RE.match(target.name)
        if match:
            return match.group(1)
    return None


def read_os_release(path: Path) -> str | None:
    """PRETTY_NAME (or NAME and VERSION) from an os-release file."""
    text = read_stripped(path)
    if text is None:
        return None
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if not sep or key.strip().startswith("#"):
            continue
        try:
            words = shlex.split(raw)
        except ValueError:
            continue
        values[key.strip()] = " ".join(words)
    pretty = values.get("PRETTY_NAME")
    if pretty:
        return pretty
    name = " ".join(v for v in (values.get("NAME"), values.get("VERSION")) if v)
    return name or None


def collect_host(
    sys_root: Path,
    proc_root: Path,
    os_release: Path,
    required_modules: tuple[str, ...],
    *,
    services: tuple[Service, ...] = (),
    library_dirs: tuple[Path, ...] = (),
    modules_root: Path | None = None,
    dkms_root: Path = Path("/var/lib/dkms"),
) -> HostFacts:
    """``modules_root``: where installed kernels keep their modules (/lib/modules); None:
    installed kernels are not looked at."""
    kernel_release = read_stripped(proc_root / "sys" / "kernel" / "osrelease") or None
    return HostFacts(
        pci=read_pci_functions(sys_root),
        modules=read_modules(sys_root, required_modules),
        module_version=read_stripped(sys_root / "module" / "nvidia" / "version") or None,
        library_version=read_library_version(library_dirs),
        kernel_release=kernel_release,
        kernels=()
        if modules_root is None
        else read_kernel_modules(modules_root, dkms_root, kernel_release),
        os_release=read_os_release(os_release),
        services=services,
        collected_at=time.time(),
    )
