"""Finding and importing DCGM's Python bindings, and loading libdcgm beneath them.

The bindings are a directory of top-level modules (dcgm_structs, dcgm_agent, ...) that
import each other by bare name, so the directory goes on sys.path while they import and
comes off again afterwards: nothing else the agent imports can resolve to a DCGM module.

DCGM 4.2 to 4.5 ship modules that do an unguarded ``import logger`` (a module of DCGM's
own test framework). When that import fails and no real ``logger`` exists, a harmless
stand-in module is given to that one import and removed from sys.modules afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import logging
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DCGM4_PATH = Path("/usr/share/datacenter-gpu-manager-4/bindings/python3")
DCGM3_PATH = Path("/usr/local/dcgm/bindings/python3")

# Imported in this order; each may import the ones before it by bare name.
_REQUIRED = ("dcgmvalue", "dcgm_structs", "dcgm_fields", "dcgm_agent")
_OPTIONAL = ("dcgm_errors", "pydcgm")
_LOGGER = "logger"


class DcgmAbsentError(Exception):
    """The bindings are not installed, do not import, or find no libdcgm."""


@dataclass(frozen=True)
class DcgmBindings:
    """The imported modules (typed Any: the bindings carry no type information)."""

    path: Path
    structs: Any
    agent: Any
    fields: Any
    value: Any
    errors: Any | None
    version: str | None = None

    def has(self, function: str) -> bool:
        return hasattr(self.agent, function)


def candidate_paths(configured: str) -> tuple[Path, ...]:
    """Where to look: the configured directory only, else DCGM 4's then DCGM 3's."""
    if configured:
        return (Path(configured),)
    return (DCGM4_PATH, DCGM3_PATH)


def find_bindings(configured: str) -> Path | None:
    for path in candidate_paths(configured):
        if (path / "dcgm_agent.py").is_file() and (path / "dcgm_structs.py").is_file():
            return path
    return None


class _LoggerShim(types.ModuleType):
    """What DCGM's modules use of their test framework's ``logger``: log calls (sent to
    the agent's log at debug level) and the diagnostic's trace file setting (none)."""

    nvvs_trace_log_filename: str | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args: object, **_kwargs: object) -> None:
            if args:
                log.debug("dcgm %s: %s", name, " ".join(str(a) for a in args))

        return call


@contextlib.contextmanager
def _on_path(path: Path) -> Iterator[None]:
    entry = str(path)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


def _forget_foreign(path: Path) -> None:
    """Drop DCGM modules imported earlier from another directory, so this one's load."""
    for name in (*_REQUIRED, *_OPTIONAL):
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None)
        if module is not None and (origin is None or Path(origin).parent != path):
            del sys.modules[name]


def _import(name: str) -> types.ModuleType:
    """Import one binding module, with a ``logger`` shim if (only if) it needs one."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != _LOGGER or _LOGGER in sys.modules:
            raise
    if importlib.util.find_spec(_LOGGER) is not None:  # a real one that failed to import
        return importlib.import_module(name)
    sys.modules[_LOGGER] = _LoggerShim(_LOGGER)
    try:
        return importlib.import_module(name)
    finally:
        sys.modules.pop(_LOGGER, None)


def import_bindings(path: Path) -> DcgmBindings:
    """Import the modules from ``path`` (DcgmAbsentError when they do not import)."""
    _forget_foreign(path)
    modules: dict[str, types.ModuleType | None] = {}
    with _on_path(path):
        for name in (*_REQUIRED, *_OPTIONAL):
            try:
                modules[name] = _import(name)
            except Exception as exc:  # a broken installation is "absent"
                if name in _REQUIRED:
                    raise DcgmAbsentError(f"{name} from {path}: {exc}") from exc
                log.debug("DCGM binding %s does not import: %s", name, exc)
                modules[name] = None
    return DcgmBindings(
        path=path,
        structs=modules["dcgm_structs"],
        agent=modules["dcgm_agent"],
        fields=modules["dcgm_fields"],
        value=modules["dcgmvalue"],
        errors=modules["dcgm_errors"],
    )


def parse_version(build_info: str) -> str | None:
    """ "version:4.5.0;arch:x86_64;..." → "4.5.0"."""
    for item in build_info.split(";"):
        key, _, value = item.partition(":")
        if key.strip() == "version" and value.strip():
            return value.strip()
    return None


def require(configured: str) -> Path:
    """Where the bindings are; DcgmAbsentError when there are none."""
    path = find_bindings(configured)
    if path is None:
        where = ", ".join(str(p) for p in candidate_paths(configured))
        raise DcgmAbsentError(f"no DCGM Python bindings in {where}")
    return path


def load(configured: str) -> DcgmBindings:
    """Find, import and initialise the bindings (blocking: libdcgm is loaded here).

    DcgmAbsentError when there are none, they do not import, or libdcgm is missing."""
    return load_from(require(configured))


def load_from(path: Path) -> DcgmBindings:
    """Import and initialise the bindings found at ``path`` (blocking, as `load`)."""
    bindings = import_bindings(path)
    structs = bindings.structs
    try:
        # On the path again: what loading the library imports resolves beside the bindings.
        with _on_path(path):
            structs._dcgmInit()  # noqa: SLF001 - how the bindings load libdcgm
    except structs.DCGMError as exc:
        if getattr(exc, "value", None) == structs.DCGM_ST_LIBRARY_NOT_FOUND:
            raise DcgmAbsentError(f"libdcgm not found ({path})") from exc
        raise
    bindings.agent.dcgmInit()
    version = None
    with contextlib.suppress(Exception):
        info = bindings.agent.dcgmVersionInfo().rawBuildInfoString
        version = parse_version(info.decode() if isinstance(info, bytes) else str(info))
    return dataclasses.replace(bindings, version=version)
