"""The daemon's C heap: two malloc arenas, and the pages start-up freed given back.

glibc gives each thread that allocates an arena of its own (up to eight per core) and
keeps what is freed in them, and in the main heap, for later: the daemon's dozen threads
hold the GIL for nearly all they do, so more arenas buy no parallelism, only pages.
Start-up (imports, the configuration, the first poll and render) frees megabytes that
the running daemon never needs again. Capping the arenas before any thread starts and
trimming once start-up is done took about 1 MB off the peak RSS of the simulated 8-GPU
node (docs/benchmarks.md#memory). Where the C library is not glibc both are skipped.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

_M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 2

try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None)
except OSError:  # pragma: no cover - a C library that cannot be opened by name
    _libc = None


def _glibc(name: str) -> Any:
    return getattr(_libc, name, None) if _libc is not None else None


def cap_arenas(arenas: int = ARENAS) -> bool:
    """Limit malloc to ``arenas`` arenas; before threads start, or it applies only to
    threads that have not allocated yet. The environment's MALLOC_ARENA_MAX wins."""
    mallopt = _glibc("mallopt")
    if mallopt is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))


def give_back() -> bool:
    """Return the free pages of every arena to the kernel (glibc's malloc_trim)."""
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    return bool(trim(0))
