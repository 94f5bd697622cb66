"""DCGM's diagnostic through its command-line tool: `dcgmi diag -r <level> -j [-i <ids>]`.

Used where the agent has no DCGM bindings of its own but dcgmi is installed. The JSON that
`dcgmi diag -j` prints nests categories, tests and per-entity results:

- DCGM 4.x: ``{"DCGM Diagnostic": {"test_categories": [{"category": ..., "tests": [{"name":
  "memory", "results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0,
  "status": "Fail", "warnings": [{"warning": "...", "error_id": ...}], "info": [...]}],
  "test_summary": {"status": "Fail"}}]}]}, "metadata": {...}}``
- DCGM 3.x: the same categories and tests under ``"DCGM GPU Diagnostic"``, each result
  naming its GPUs as ``"gpu_ids"`` ("0" or "0,1") and no entity group.

When it cannot run at all, dcgmi prints ``{"DCGM Diagnostic": {"runtime_error": "..."}}``
(and exits non-zero). NVIDIA publishes no stable schema for this JSON, so the parser reads
what both layouts share and fails closed: a report it cannot read is a result with ``error``
set, never a pass. Any result whose status is "Fail" fails the diagnostic.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from typing import Any

from gpuagent.model import DiagOutcome, DiagResult, DiagTest

_ROOTS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")
_STATUS: dict[str, DiagOutcome] = {
    "pass": "pass",
    "fail": "fail",
    "warn": "warn",
    "warning": "warn",
    "skip": "skip",
    "skipped": "skip",
    "not run": "notrun",
    "notrun": "notrun",
    "not_run": "notrun",
}
_GPU_GROUPS = ("GPU", "1")  # entity_group names / ids of a GPU
_KEEP_OUTPUT = 500  # characters of unreadable output kept in the error


def command(dcgmi: str, level: int, gpu_ids: Iterable[int]) -> list[str]:
    """The argv that runs the diagnostic (no shell is involved)."""
    argv = [dcgmi, "diag", "-r", str(level), "-j"]
    ids = sorted(set(gpu_ids))
    if ids:
        argv += ["-i", ",".join(str(i) for i in ids)]
    return argv


async def run(dcgmi: str, level: int, gpu_ids: Iterable[int], limit: float) -> DiagResult:
    """Run `dcgmi diag` and parse what it printed; killed (and an error result) when it
    does not finish within ``limit`` seconds."""
    gpus = tuple(sorted(set(gpu_ids)))
    started = time.time()
    argv = command(dcgmi, level, gpus)

    def failed(error: str) -> DiagResult:
        return DiagResult(level, gpus, started, time.time(), "dcgmi", error=error)

    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        return failed(f"cannot run {dcgmi}: {exc.strerror or exc}")
    try:
        async with asyncio.timeout(limit):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        return failed(f"dcgmi diag -r {level} did not finish within {limit:g} s (killed)")
    except asyncio.CancelledError:
        process.kill()
        await process.wait()
        raise
    text = stdout.decode(errors="replace")
    result = parse(text, level, gpus, started, time.time())
    if process.returncode and not result.tests and not result.error:
        message = stderr.decode(errors="replace").strip()[-_KEEP_OUTPUT:]
        return failed(f"dcgmi exited {process.returncode}: {message or 'no output'}")
    return result


def parse(
    text: str, level: int, gpus: tuple[int, ...], started: float, finished: float
) -> DiagResult:
    """The `DiagResult` of one `dcgmi diag -j` report (either layout)."""

    def result(tests: tuple[DiagTest, ...] = (), error: str = "") -> DiagResult:
        return DiagResult(level, gpus, started, finished, "dcgmi", tests, error)

    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return result(error="dcgmi diag printed no JSON: " + text.strip()[:_KEEP_OUTPUT])
    body = _body(document)
    if body is None:
        return result(error="dcgmi diag printed JSON without a diagnostic report")
    runtime_error = body.get("runtime_error")
    if runtime_error:
        return result(error=f"DCGM diagnostic could not run: {runtime_error}")
    tests: list[DiagTest] = []
    try:
        for category in _list(body.get("test_categories")):
            for test in _list(_dict(category).get("tests")):
                tests += _test(_dict(test))
    except (TypeError, ValueError) as exc:
        return result(error=f"cannot read dcgmi diag's report: {exc}")
    if not tests:
        return result(error="dcgmi diag reported no test")
    return result(tuple(tests))


def _body(document: object) -> dict[str, Any] | None:
    if not isinstance(document, dict):
        return None
    for root in _ROOTS:
        if isinstance(document.get(root), dict):
            return document[root]  # type: ignore[no-any-return]
    return None


def _test(test: dict[str, Any]) -> list[DiagTest]:
    name = str(test.get("name") or "unnamed")
    found: list[DiagTest] = []
    other_entities = False
    for entry in _list(test.get("results")):
        result = _dict(entry)
        outcome = _outcome(result.get("status"))
        message = _message(result, outcome)
        gpus = _gpus(result)
        if gpus is None:
            other_entities = True  # a CPU or switch result: not what this agent looks after
            continue
        targets: list[int | None] = [*gpus] or [None]
        found.extend(DiagTest(name, outcome, gpu, message) for gpu in targets)
    summary = _dict(test.get("test_summary"))
    overall = _outcome(summary["status"]) if "status" in summary else None
    if not found and overall is not None and (overall == "fail" or not other_entities):
        found.append(DiagTest(name, overall, None, _message(summary, overall)))
    elif overall == "fail" and all(t.outcome != "fail" for t in found):
        # The test failed as a whole (e.g. a plugin error) though no GPU did.
        found.append(DiagTest(name, "fail", None, _message(summary, "fail")))
    return found


def _outcome(status: object) -> DiagOutcome:
    # An unknown or missing status fails: a diagnostic we cannot read is not a pass.
    return _STATUS.get(str(status).strip().lower(), "fail") if status is not None else "fail"


def _gpus(result: dict[str, Any]) -> list[int] | None:
    """The GPUs one result is about ([] for none in particular); None for another entity."""
    if "entity_id" in result:
        group = str(result.get("entity_group", result.get("entity_group_id", "GPU")))
        if group not in _GPU_GROUPS and str(result.get("entity_group_id", "")) not in _GPU_GROUPS:
            return None
        return [int(result["entity_id"])]
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if ids is None or ids == "":
        return []
    if isinstance(ids, int):
        return [ids]
    if isinstance(ids, list):
        return [int(i) for i in ids]
    return [int(part) for part in str(ids).split(",") if part.strip()]


def _message(result: dict[str, Any], outcome: DiagOutcome) -> str:
    """The warnings (errors) of a result; its info only when nothing went wrong."""
    texts = [_warning(w) for w in _list(result.get("warnings"))]
    if not any(texts) and outcome != "fail":
        info = result.get("info")
        texts = [str(i) for i in (info if isinstance(info, list) else [info]) if i]
    return "; ".join(t for t in texts if t)


def _warning(entry: object) -> str:
    if isinstance(entry, dict):
        return str(entry.get("warning") or entry.get("error") or "")
    return str(entry or "")


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
