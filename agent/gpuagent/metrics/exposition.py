"""Prometheus text exposition (format 0.0.4), rendered fast.

prometheus_client validates and escapes every label of every sample on every render,
about 10 ms for an 8-GPU node. Our label sets repeat (one per GPU, per check, per link),
so each distinct set is formatted once and reused; rendering is then a string join. The
output is the same text prometheus_client's `generate_latest` produces (a test holds the
two to that), and Prometheus accepts it whatever Accept header it sent.
"""

from __future__ import annotations

import gzip
import math
import threading
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# How the text format names OpenMetrics types (prometheus_client's own munging).
_TEXT_TYPE = {"unknown": "untyped", "info": "gauge", "stateset": "gauge"}
_NAME_SUFFIX = {"counter": "_total", "info": "_info"}


class BareCounterFamily(Metric):
    """A counter whose name and samples stay as given: dcgm-exporter declares its counters
    `counter` under names without `_total` (DCGM_FI_DEV_PCIE_REPLAY_COUNTER), which the
    text format allows, but prometheus_client's counter families always add the suffix.
    The samples are added as `Sample(name, labels, value)`."""

    def __init__(self, name: str, documentation: str) -> None:
        super().__init__(name, documentation, "counter")


def _escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


class TextRenderer:
    """Renders metric families to the text format, memoising formatted label sets and values.

    Each render remembers what it formatted and reuses what the render before it did: what
    repeats from one snapshot to the next (label sets, flags, health, counters) is formatted
    once, and the memo never holds more than two renders' worth, however many values the
    gauges that move every poll (power, energy, clocks) go through.
    """

    def __init__(self) -> None:
        self._label_sets: dict[tuple[tuple[str, str], ...], str] = {}
        self._previous_label_sets: dict[tuple[tuple[str, str], ...], str] = {}
        self._values: dict[float, str] = {}
        self._previous_values: dict[float, str] = {}

    def _labels(self, labels: dict[str, str]) -> str:
        # Keyed in the family's own label order (sorting every sample's labels cost more
        # than the rest of the lookup); the text sorts them, as prometheus_client does.
        key = tuple(labels.items())
        formatted = self._label_sets.get(key)
        if formatted is None:
            formatted = self._previous_label_sets.get(key)
            if formatted is None:
                inner = ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in sorted(key))
                formatted = f"{{{inner}}}" if inner else ""
            self._label_sets[key] = formatted
        return formatted

    def _value(self, value: float) -> str:
        # Zero first: 0.0 and -0.0 are one key to a dict but two texts.
        if value == 0:
            return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
        text = self._values.get(value)
        if text is None:
            text = self._previous_values.get(value)
            if text is None:
                text = floatToGoString(value)  # type: ignore[no-untyped-call]
            self._values[value] = text
        return text

    def render(self, families: Iterable[Metric]) -> bytes:
        self._previous_label_sets, self._label_sets = self._label_sets, {}
        self._previous_values, self._values = self._values, {}
        out: list[str] = []
        append = out.append
        for family in families:
            suffix = "" if isinstance(family, BareCounterFamily) else _NAME_SUFFIX.get(family.type)
            name = family.name + (suffix or "")
            append(f"# HELP {name} {_escape_help(family.documentation)}\n")
            append(f"# TYPE {name} {_TEXT_TYPE.get(family.type, family.type)}\n")
            for sample in family.samples:
                labels = self._labels(sample.labels) if sample.labels else ""
                append(f"{sample.name}{labels} {self._value(sample.value)}\n")
        return "".join(out).encode()


class Exposition:
    """The rendered /metrics body of the registry's current families, kept until they change.

    The snapshot collector returns the very same family objects until the next snapshot,
    so the body (and its gzip form, made on first request) is built once per snapshot.
    `refresh()` lets the daemon render right after it publishes, so scrapes find the body
    ready and never pay for rendering themselves. With ``rendered_by_caller`` a scrape
    serves what was rendered last and renders only when nothing was yet: the daemon decides
    when a snapshot is worth rendering (`SnapshotPublisher`).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self.rendered_by_caller = False
        self._renderer = TextRenderer()
        self._lock = threading.Lock()
        self._families: tuple[Metric, ...] = ()
        self._body = b""
        self._gzipped: bytes | None = None

    def _current(self) -> None:
        families = tuple(self._registry.collect())
        if len(families) != len(self._families) or any(
            a is not b for a, b in zip(families, self._families, strict=True)
        ):
            self._families = families
            self._body = self._renderer.render(families)
            self._gzipped = None

    def refresh(self) -> None:
        with self._lock:
            self._current()

    def body(self, *, gzipped: bool) -> bytes:
        if not self._lock.acquire(blocking=False):
            # The daemon is rendering the next snapshot: serve the last one, whole, rather
            # than wait for it (a kernel-log storm renders often, and scrapes must not wait).
            body, packed = self._body, self._gzipped
            if not gzipped:
                return body
            return packed if packed is not None else gzip.compress(body, compresslevel=5)
        try:
            if not self.rendered_by_caller or not self._body:
                self._current()
            if not gzipped:
                return self._body
            if self._gzipped is None:
                self._gzipped = gzip.compress(self._body, compresslevel=5)
            return self._gzipped
        finally:
            self._lock.release()
