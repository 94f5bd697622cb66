"""NVML outcomes, handled once here so no reader repeats the same preamble.

- NotSupported (and the other "this GPU or driver can't answer that" codes) → the value is
  absent (None), never an error.
- GPU_IS_LOST → `GpuLostError`: the whole GPU is lost.
- anything else → `NvmlCallError`: this poll of the GPU failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pynvml

from gpuagent.model import NvmlInitProblem

T = TypeVar("T")

# Codes that mean "no such value here", not "something is wrong".
_ABSENT = (
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_NOT_FOUND,
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
)


class GpuLostError(Exception):
    pass


class NvmlUnavailableError(Exception):
    """No NVML call could be made: no session, the GPU is not in it, or NVML is closing."""


class NvmlCallError(Exception):
    def __init__(self, call: str, error: pynvml.NVMLError) -> None:
        self.call = call
        self.code = int(error.value)
        super().__init__(f"{call}: {error}")


def is_absent(code: int) -> bool:
    return code in _ABSENT


def _code_unless_lost(call: str, exc: pynvml.NVMLError) -> int:
    """The error's NVML code; a lost GPU is not an answer but GpuLostError, whatever the
    caller expects of other errors."""
    if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
        raise GpuLostError(call) from None
    return int(exc.value)


def optional(call: str, fn: Callable[..., T], *args: object) -> T | None:
    """Call ``fn``; None when the GPU or driver does not provide the value."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        if is_absent(_code_unless_lost(call, exc)):
            return None
        raise NvmlCallError(call, exc) from None


def return_code(call: str, fn: Callable[..., object], *args: object) -> int:
    """Call ``fn``; NVML's return code (NVML_SUCCESS when it answered), for a caller that
    acts on which error it was. A lost GPU still raises GpuLostError."""
    try:
        fn(*args)
    except pynvml.NVMLError as exc:
        return _code_unless_lost(call, exc)
    return int(pynvml.NVML_SUCCESS)


def required(call: str, fn: Callable[..., T], *args: object) -> T:
    """Call ``fn`` (a setter): any NVML error is an error, NotSupported included."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        _code_unless_lost(call, exc)
        raise NvmlCallError(call, exc) from None


def classify_init_error(error: pynvml.NVMLError) -> NvmlInitProblem:
    problems: dict[int, NvmlInitProblem] = {
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "driver_not_loaded",
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "library_not_found",
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "version_mismatch",
        pynvml.NVML_ERROR_NO_PERMISSION: "no_permission",
        pynvml.NVML_ERROR_TIMEOUT: "timeout",
    }
    return problems.get(error.value, "other")


def text(value: bytes | str | None) -> str | None:
    """pynvml returns bytes or str depending on version; normalise."""
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else value
