"""RMA evidence: one bundle per failing GPU, the file a replacement case is opened with.

A bundle is a gzipped tar under ``<state_dir>/evidence/`` named after the time, the GPU
and what asked for it. It holds the agent's own view at that moment (``status.json``: the
whole status document; ``gpu.json``: that GPU's identity, readings and findings;
``events.txt``: the kernel-log and NVML lines of that GPU still in the event log;
``inventory.json``: the node inventory), a ``manifest.json`` saying what is in it, and,
when NVIDIA's ``nvidia-bug-report.sh`` is installed, its report, stopped after
``bug_report_timeout_seconds`` (a wedged GPU can make it hang) — a report cut short is
kept and marked so in the manifest.

Bundles are written to a hidden partial directory and renamed into place when complete,
so a crash never leaves a half bundle under a real name; old and surplus bundles are
pruned oldest first by age and total size.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import re
import shlex
import shutil
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuagent import __version__
from gpuagent.config import RemediationEvidence
from gpuagent.model import Finding, NodeSnapshot, Severity
from gpuagent.statusview import event_json, status_document

log = logging.getLogger(__name__)

SUFFIX = ".tar.gz"
_PARTIAL_PREFIX = ".partial-"
_REPORT_NAME = "nvidia-bug-report.log"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


ESCALATED = "escalated"  # a reset did not help: drain and reboot, then likely an RMA


def rma_trigger(finding: Finding) -> str | None:
    """Why ``finding`` calls for an evidence bundle for its GPU (NVIDIA's replacement
    criteria), or None."""
    if finding.gpu is None:
        return None
    if finding.check == "row_remap" and finding.severity is Severity.CRITICAL:
        return "row_remap_failure"
    if finding.check == "retired_pages":
        evidence = finding.evidence_dict()
        pages = [evidence.get(f"retired_pages_{cause}") for cause in ("sbe", "dbe")]
        limit = evidence.get("retired_pages_limit")
        total = sum(p for p in pages if isinstance(p, int))
        if isinstance(limit, int) and total >= limit:
            return "retired_page_limit"
    return None


@dataclass(frozen=True, slots=True)
class Bundle:
    path: Path
    size: int
    bug_report: str  # "included", "timed out after N s (partial)", "not installed", ...

    def describe(self) -> str:
        return f"{self.path} ({self.size} bytes; nvidia-bug-report: {self.bug_report})"


class EvidenceCollector:
    """Writes bundles into ``directory``, one at a time (a bug report is heavy)."""

    def __init__(
        self,
        config: RemediationEvidence,
        directory: Path,
        *,
        node: str,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.directory = directory
        self._node = node
        self._wall = wall_clock
        self._one_at_a_time = asyncio.Lock()
        self._tidied = False  # partial bundles a crash left behind are removed once

    async def collect(
        self, snapshot: NodeSnapshot, bus_id: str, trigger: str, reason: str
    ) -> Bundle:
        """Collect a bundle for GPU ``bus_id``; raises OSError when it cannot be written."""
        async with self._one_at_a_time:
            now = self._wall()
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
            name = _UNSAFE.sub("_", f"{stamp}-{bus_id}-{trigger}")
            files = _agent_files(snapshot, bus_id)
            if not self._tidied:
                await asyncio.to_thread(self._remove_leftovers)
                self._tidied = True
            partial = self.directory / f"{_PARTIAL_PREFIX}{name}"
            await asyncio.to_thread(_fresh_directory, partial)
            try:
                report = await self._bug_report(partial)
                manifest = {
                    "node": self._node,
                    "gpu": bus_id,
                    "trigger": trigger,
                    "reason": reason,
                    "collected_at": now,
                    "agent_version": __version__,
                    "files": sorted([*files, *_reports(partial)]),
                    "nvidia_bug_report": report,
                }
                files["manifest.json"] = _dump(manifest)
                path = self.directory / f"{name}{SUFFIX}"
                size = await asyncio.to_thread(_write_tar, path, name, files, partial)
            finally:
                await asyncio.to_thread(shutil.rmtree, partial, ignore_errors=True)
            await asyncio.to_thread(self.prune)
            return Bundle(path, size, report)

    async def _bug_report(self, into: Path) -> str:
        command = self.config.bug_report_command.strip()
        if not command:
            return "not configured"
        argv = shlex.split(command)
        if shutil.which(argv[0]) is None:
            return f"{argv[0]} not installed"
        timeout = self.config.bug_report_timeout_seconds
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                "--output-file",
                str(into / _REPORT_NAME),
                cwd=into,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                # Its own process group: the report runs many children, all stopped with it.
                start_new_session=True,
            )
        except OSError as exc:
            return f"could not start: {exc}"
        try:
            async with asyncio.timeout(timeout):
                code = await process.wait()
        except TimeoutError:
            _kill_group(process.pid)
            await process.wait()
            return f"timed out after {timeout:g} s (partial)"
        except asyncio.CancelledError:
            _kill_group(process.pid)
            raise
        if not _reports(into):
            return f"exited {code} without a report"
        return "included" if code == 0 else f"exited {code} (report kept)"

    def bundles(self) -> list[Path]:
        """Complete bundles, oldest first."""
        try:
            found = [p for p in self.directory.iterdir() if p.name.endswith(SUFFIX)]
        except FileNotFoundError:
            return []
        return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))

    def _remove_leftovers(self) -> None:
        for leftover in self.directory.glob(f"{_PARTIAL_PREFIX}*"):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)

    def prune(self) -> list[Path]:
        """Remove bundles past ``max_age_days``, then the oldest while the rest exceed
        ``max_total_mib``."""
        removed: list[Path] = []
        oldest_kept = self._wall() - self.config.max_age_days * 86400.0
        kept = []
        for path in self.bundles():
            if path.stat().st_mtime < oldest_kept:
                removed.append(path)
            else:
                kept.append(path)
        budget = self.config.max_total_mib * 1024 * 1024
        total = sum(p.stat().st_size for p in kept)
        # The newest bundle stays even alone over the budget: it is the one asked for.
        while len(kept) > 1 and total > budget:
            oldest = kept.pop(0)
            total -= oldest.stat().st_size
            removed.append(oldest)
        for path in removed:
            path.unlink(missing_ok=True)
            log.info("evidence bundle %s pruned", path)
        return removed


def _agent_files(snapshot: NodeSnapshot, bus_id: str) -> dict[str, bytes]:
    document = status_document(snapshot)
    gpu = next((g for g in document["gpus"] if g["pci_bus_id"] == bus_id), None)
    if gpu is not None:
        # Every finding of the GPU, OK ones included: what was checked and found fine.
        gpu = gpu | {
            "all_findings": [
                {"check": f.check, "severity": f.severity.name, "reason": f.reason}
                | {"evidence": f.evidence_dict()}
                for f in snapshot.health.findings
                if f.gpu == bus_id
            ]
        }
    events = [event_json(e) for e in snapshot.events if bus_id in (e.gpu, e.pci)]
    inventory = None if snapshot.inventory is None else snapshot.inventory.to_json()
    return {
        "status.json": _dump(document),
        "gpu.json": _dump(gpu),
        "events.txt": _event_lines(events).encode(),
        "inventory.json": _dump(inventory),
    }


def _event_lines(events: Iterable[dict[str, Any]]) -> str:
    lines = []
    for event in events:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(event["time"])))
        lines.append(f"{when} {event['source']} {event['kind']}: {event['line']}\n")
    return "".join(lines)


def _dump(value: object) -> bytes:
    return json.dumps(value, indent=2, sort_keys=True, default=str).encode() + b"\n"


def _reports(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob(f"{_REPORT_NAME}*") if p.is_file())


def _fresh_directory(path: Path) -> None:
    # Owner only: a bug report holds the host's details.
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)


def _write_tar(path: Path, name: str, files: dict[str, bytes], reports: Path) -> int:
    import tarfile  # noqa: PLC0415 - an RMA bundle is rare; the module costs RSS

    temporary = path.with_name(f"{_PARTIAL_PREFIX}{path.name}")
    try:
        temporary.touch(mode=0o600)
        with tarfile.open(temporary, "w:gz") as tar:
            for member, content in sorted(files.items()):
                info = tarfile.TarInfo(f"{name}/{member}")
                info.size, info.mtime, info.mode = len(content), int(time.time()), 0o600
                tar.addfile(info, io.BytesIO(content))
            for report in _reports(reports):
                tar.add(reports / report, arcname=f"{name}/{report}")
        with temporary.open("rb") as written:
            os.fsync(written.fileno())
        temporary.rename(path)
    finally:
        temporary.unlink(missing_ok=True)
    return path.stat().st_size


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
