"""DCGM's diagnostic through the Python bindings: `dcgmActionValidate_v2`.

`validate` builds the run-diag request (the newest version these bindings carry: v10 in
DCGM 4.x, older ones for older bindings), runs it, and turns DCGM's response into a
`DiagResult`: one `DiagTest` per test and entity (a GPU, or None for a result that is not
about one GPU), with DCGM's error or info message. It blocks for as long as the diagnostic
runs (seconds for level 1, many minutes for level 3), so it is called on the DCGM source's
own thread, never on the event loop.

The bindings are passed in as modules (`dcgm_agent`, `dcgm_structs`), never imported here:
the agent loads them from wherever DCGM installed them, and a node without DCGM never
imports them at all.

The response is read the way DCGM 4.x lays it out (`c_dcgmDiagResponse_v11` / `_v12`):
``tests`` index into ``results`` (per entity), ``errors`` and ``info`` (each with its entity
and test id). A diagnostic that could not run (a DCGM error code) is a result with ``error``
set, which never passes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from gpuagent.model import DiagOutcome, DiagResult, DiagTest

# The request versions, newest first: the first these bindings define is used.
_RUN_DIAG_VERSIONS = (
    ("c_dcgmRunDiag_v10", "dcgmRunDiag_version10"),
    ("c_dcgmRunDiag_v9", "dcgmRunDiag_version9"),
    ("c_dcgmRunDiag_v8", "dcgmRunDiag_version8"),
    ("c_dcgmRunDiag_v7", "dcgmRunDiag_version7"),
)
# DCGM_DIAG_RESULT_* → our outcome (the names, so a renumbering cannot mislabel one).
_OUTCOMES: tuple[tuple[str, DiagOutcome], ...] = (
    ("DCGM_DIAG_RESULT_PASS", "pass"),
    ("DCGM_DIAG_RESULT_SKIP", "skip"),
    ("DCGM_DIAG_RESULT_WARN", "warn"),
    ("DCGM_DIAG_RESULT_FAIL", "fail"),
    ("DCGM_DIAG_RESULT_NOT_RUN", "notrun"),
)
_FE_GPU = 1  # dcgm_fields.DCGM_FE_GPU: the entity group of a GPU
_SYSTEM = "system"  # the test name given to errors that belong to no test


def validate(  # noqa: PLR0911 - one return per way a diagnostic can end
    dcgm_agent: Any,
    dcgm_structs: Any,
    handle: Any,
    level: int,
    gpu_ids: Iterable[int],
) -> DiagResult:
    """Run DCGM's diagnostic at ``level`` (1-4) on ``gpu_ids`` (empty: every GPU) and wait
    for it. Never raises for what DCGM answers: an error is a result with ``error`` set."""
    gpus = tuple(sorted(set(gpu_ids)))
    started = time.time()

    def result(tests: tuple[DiagTest, ...] = (), error: str = "") -> DiagResult:
        return DiagResult(level, gpus, started, time.time(), "bindings", tests, error)

    if not 1 <= level <= 4:
        return result(error=f"no diagnostic level {level} (1-4)")
    try:
        request, version = _request(dcgm_structs, level, gpus)
    except (AttributeError, ValueError) as exc:
        return result(error=f"cannot build the diagnostic request: {exc}")
    try:
        response = dcgm_agent.dcgmActionValidate_v2(handle, request, version)
    except dcgm_structs.DCGMError as exc:
        return result(error=f"DCGM diagnostic could not run: {exc}")
    except AssertionError as exc:  # the bindings' check of the response version
        return result(error=f"DCGM answered with an unexpected response: {exc}")
    try:
        tests = read_response(dcgm_structs, response)
    except (AttributeError, IndexError, TypeError, ValueError) as exc:
        return result(error=f"cannot read DCGM's diagnostic response: {exc}")
    if not tests:
        return result(error="DCGM's diagnostic reported no test")
    return result(tests)


def _request(dcgm_structs: Any, level: int, gpus: tuple[int, ...]) -> tuple[Any, int]:
    """The run-diag struct for ``level`` on ``gpus`` and its version word."""
    for struct_name, version_name in _RUN_DIAG_VERSIONS:
        struct = getattr(dcgm_structs, struct_name, None)
        version = getattr(dcgm_structs, version_name, None)
        if struct is not None and version is not None:
            break
    else:
        raise ValueError("these DCGM bindings define no run-diag request version 7-10")
    request = struct()
    request.version = version
    request.flags = dcgm_structs.DCGM_RUN_FLAGS_VERBOSE  # infos as well as errors
    request.validate = level
    listed = ",".join(str(g) for g in gpus)
    if hasattr(request, "entityIds"):  # v9 and later: entities instead of a GPU list
        request.groupId = dcgm_structs.DCGM_GROUP_NULL
        request.entityIds = listed or "*"
    elif listed:
        request.groupId = dcgm_structs.DCGM_GROUP_NULL
        request.gpuList = listed
    else:
        request.groupId = dcgm_structs.DCGM_GROUP_ALL_GPUS
    return request, version


def read_response(dcgm_structs: Any, response: Any) -> tuple[DiagTest, ...]:
    """Every test's result per entity in a `c_dcgmDiagResponse_v11`/`_v12` (DCGM 4.x), plus
    the errors that belong to no test (DCGM's system errors) as failures of "system"."""
    outcomes = {
        getattr(dcgm_structs, name): outcome
        for name, outcome in _OUTCOMES
        if hasattr(dcgm_structs, name)
    }
    system_test = getattr(dcgm_structs, "DCGM_DIAG_RESPONSE_SYSTEM_ERROR", 255)
    errors = _filled(response.errors, response.numErrors)
    infos = _filled(response.info, response.numInfo)
    results = _filled(response.results, response.numResults)
    tests: list[DiagTest] = []
    for test_id, test in enumerate(_filled(response.tests, response.numTests)):
        name = _text(test.name) or _text(test.pluginName) or f"test {test_id}"
        indices = list(test.resultIndices[: int(test.numResults)])
        per_entity = [results[i] for i in indices if i < len(results)]
        if not per_entity:
            # A test with no per-entity result (skipped before it started): its overall one.
            outcome = outcomes.get(int(test.result), "fail")
            message = _messages(errors, test_id, None) or _messages(infos, test_id, None)
            tests.append(DiagTest(name, outcome, None, message))
            continue
        for entry in per_entity:
            gpu = _gpu(entry.entity)
            if gpu is None and int(entry.entity.entityGroupId) != 0:
                continue  # a CPU or switch: not what this agent looks after
            outcome = outcomes.get(int(entry.result), "fail")
            message = _messages(errors, test_id, entry.entity)
            if not message and outcome != "fail":
                message = _messages(infos, test_id, entry.entity)
            tests.append(DiagTest(name, outcome, gpu, message))
    system = [e for e in errors if int(e.testId) == system_test]
    if system:
        detail = "; ".join(_text(e.msg) for e in system)
        tests.append(DiagTest(_SYSTEM, "fail", None, detail))
    return tuple(tests)


def _filled(array: Any, count: Any) -> list[Any]:
    """The entries of a fixed-size response array that DCGM filled (its count, at most
    the array's length)."""
    return list(array[: min(int(count), len(array))])


def _gpu(entity: Any) -> int | None:
    return int(entity.entityId) if int(entity.entityGroupId) == _FE_GPU else None


def _messages(entries: list[Any], test_id: int, entity: Any | None) -> str:
    """The messages of ``entries`` (errors or infos) for this test and entity."""
    found = []
    for entry in entries:
        if int(entry.testId) != test_id:
            continue
        if entity is not None and (
            int(entry.entity.entityGroupId) != int(entity.entityGroupId)
            or int(entry.entity.entityId) != int(entity.entityId)
        ):
            continue
        text = _text(entry.msg)
        if text and text not in found:
            found.append(text)
    return "; ".join(found)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace").strip()
    return str(value).strip()
