"""The tree both capture formats become, and the readers that turn its values into numbers.

The text and the XML parser each build this tree (an indented `Key : Value` line, or an
element, per node, with the line it came from) and then map it into the model. Keeping the
value readers here means "N/A", units and malformed numbers are handled, and reported,
the same way for both formats.

What nvidia-smi prints where it has no value ("N/A", "[Not Supported]", "Requested
functionality has been deprecated", ...) is quietly absent. A value a reader does not
understand (a new unit, a word where a number was) is read as absent too and noted on the
tree's ``notes``, once per value: the same word in every GPU's block is one note, naming
the first place and how many more. One field the parser does not know never costs the
whole capture.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from gpuagent.smi.model import CaptureError

# What nvidia-smi prints where it has no value: NVML answered NOT_SUPPORTED, NO_PERMISSION,
# DEPRECATED (drivers 570+ for applications clocks, display mode, power state), an unknown
# error, or the field does not apply. Older drivers wrap them in brackets.
_UNAVAILABLE = frozenset(
    {
        "",
        "n/a",
        "not supported",
        "not available",
        "not found",
        "unknown",
        "unknown error",
        "insufficient permissions",
        "requested functionality has been deprecated",
    }
)
_TRUE = frozenset({"enabled", "active", "yes", "true", "on"})
_FALSE = frozenset({"disabled", "not active", "no", "false", "off"})
_NUMBER = re.compile(r"([+-]?[0-9]+(?:\.[0-9]+)?)\s*(.*)")
_INTEGER = re.compile(r"([+-]?[0-9]+)\s*(.*)")
_PSTATE = re.compile(r"P([0-9]{1,2})")
_HEX = re.compile(r"(?:0[xX])?([0-9A-Fa-f]{1,16})")
_DRIVER_VERSION = re.compile(r"(?<![0-9.])([0-9]{3}\.[0-9]{2,3}(?:\.[0-9]{2,3})?)(?![0-9.])")
_CUDA_VERSION = re.compile(r"[0-9]+\.[0-9]+")


class Notes:
    """The values read as absent because no reader understood them, one note per value
    and expectation, in the order first met."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        # (expected, value) -> (the first node, how many more)
        self._seen: dict[tuple[str, str], tuple[Node, int]] = {}

    def add(self, node: Node, value: str, expected: str) -> None:
        key = (expected, value)
        seen = self._seen.get(key)
        if seen is None:
            self._seen[key] = (node, 0)
        elif seen[0] is not node:
            self._seen[key] = (seen[0], seen[1] + 1)

    def __iter__(self) -> Iterator[str]:
        for (expected, value), (node, more) in self._seen.items():
            also = f" (and {more} more {'field' if more == 1 else 'fields'})" if more else ""
            yield f'line {node.line}: {node.label()}: expected {expected}, got "{value}"{also}'


class Node:
    """One entry of a capture: a key, its value (None for a section header), its children.

    Lookups are by key, case-insensitively (drivers have changed the case of a few keys:
    "GPU instance ID" under Processes, "GPU Instance ID" under a MIG device), and the first
    entry of a repeated key wins; ``children`` keeps every entry in file order.
    """

    __slots__ = ("_index", "children", "key", "line", "notes", "parent", "value")

    def __init__(self, key: str, value: str | None, line: int, parent: Node | None) -> None:
        self.key = key
        self.value = value
        self.line = line
        self.parent = parent
        self.children: list[Node] = []
        self._index: dict[str, Node] = {}
        # The values read as absent, for the whole tree: every node shares the root's list.
        self.notes: Notes = Notes() if parent is None else parent.notes

    def add(self, child: Node) -> None:
        self.children.append(child)
        self._index.setdefault(child.key.lower(), child)

    def get(self, *path: str) -> Node | None:
        """The node at ``path`` below this one, or None where any step is missing."""
        node: Node | None = self
        for key in path:
            if node is None:
                return None
            node = node._index.get(key.lower())  # noqa: SLF001 - same class
        return node

    def first(self, *keys: str) -> Node | None:
        """The first of ``keys`` (alternative wordings of one field) that is present."""
        for key in keys:
            node = self._index.get(key.lower())
            if node is not None:
                return node
        return None

    def last_line(self) -> int:
        """The last line of this node's block."""
        node = self
        while node.children:
            node = node.children[-1]
        return node.line

    def label(self) -> str:
        """Where this entry sits, for messages: "GPU 00000000:19:00.0 / PCI / Bus Id"."""
        keys: list[str] = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            keys.append(node.key)
            node = node.parent
        return " / ".join(reversed(keys))


def at(node: Node | None, *path: str) -> Node | None:
    """``node.get(*path)``, None when the section itself is missing."""
    return None if node is None else node.get(*path)


def pick(node: Node | None, *keys: str) -> Node | None:
    """``node.first(*keys)``, None when the section itself is missing."""
    return None if node is None else node.first(*keys)


def entries(node: Node | None, key: str) -> list[Node]:
    """The children of ``node`` called ``key`` (a repeated entry), in file order."""
    if node is None:
        return []
    key = key.lower()
    return [child for child in node.children if child.key.lower() == key]


@dataclass(frozen=True, slots=True)
class EccCounts:
    """One ECC error block (volatile or aggregate), as the model keeps it."""

    corrected: int | None = None
    uncorrected: int | None = None
    sram_corrected: int | None = None
    sram_uncorrected: int | None = None
    sram_threshold_exceeded: bool | None = None


def _unreadable(node: Node, value: str, expected: str) -> None:
    """Note a value that is not what the field holds; the field is then absent."""
    node.notes.add(node, value, expected)


def string(node: Node | None) -> str | None:
    """The value as printed, or None where the capture has none (N/A, or missing)."""
    if node is None or node.value is None:
        return None
    value = node.value
    folded = value.lower()
    if folded.startswith("[") and folded.endswith("]"):
        folded = folded[1:-1].strip()
    return None if folded in _UNAVAILABLE else value


def printed(node: Node | None) -> str | None:
    """The value as printed, keeping an empty one ("") apart from N/A (None): where the
    driver answered with an empty string."""
    if node is not None and node.value == "":
        return ""
    return string(node)


def uuid_text(node: Node | None) -> str | None:
    """A UUID in its canonical lower-case form ("00000001-0000-0000-0000-000000000001")."""
    value = string(node)
    if node is None or value is None:
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        _unreadable(node, value, "a UUID")
        return None


def number(node: Node | None, unit: str = "") -> float | None:
    """A decimal value, with ``unit`` after it or none: "67.74 W" → 67.74."""
    value = string(node)
    if node is None or value is None:
        return None
    match = _NUMBER.fullmatch(value)
    if match is None or match[2] not in ("", unit):
        _unreadable(node, value, f"a number{' in ' + unit if unit else ''}")
        return None
    return float(match[1])


def integer(node: Node | None, unit: str = "") -> int | None:
    """A whole number, with ``unit`` after it or none: "16x" → 16, "2560 bank(s)" → 2560."""
    value = string(node)
    if node is None or value is None:
        return None
    match = _INTEGER.fullmatch(value)
    if match is None or match[2] not in ("", unit):
        _unreadable(node, value, f"a whole number{' in ' + unit if unit else ''}")
        return None
    return int(match[1])


def hexadecimal(node: Node | None) -> int | None:
    """A PCI id as either format prints it: "0x233010DE" (text) or "233010DE" (XML)."""
    value = string(node)
    if node is None or value is None:
        return None
    match = _HEX.fullmatch(value)
    if match is None:
        _unreadable(node, value, "a hexadecimal number")
        return None
    return int(match[1], 16)


def flag(node: Node | None) -> bool | None:
    """Enabled/Disabled, Active/Not Active, Yes/No."""
    value = string(node)
    if node is None or value is None:
        return None
    folded = value.lower()
    if folded in _TRUE:
        return True
    if folded in _FALSE:
        return False
    _unreadable(node, value, "Yes/No, Enabled/Disabled or Active/Not Active")
    return None


def pstate(node: Node | None) -> int | None:
    """A performance state: "P8" → 8."""
    value = string(node)
    if node is None or value is None:
        return None
    match = _PSTATE.fullmatch(value)
    if match is None:
        _unreadable(node, value, "a performance state (P0 to P15)")
        return None
    return int(match[1])


def required(node: Node | None, where: Node, message: str) -> str:
    """A value the model cannot do without: without it the capture is cut short or is not
    what nvidia-smi writes. The error names the entry's line, or the block's."""
    value = string(node)
    if value is None:
        raise CaptureError(message, where.line if node is None else node.line)
    return value


def driver_version(root: Node, keys: tuple[str, ...], missing: CaptureError, bad: str) -> str:
    """The driver's version ("580.105.08"), from the first of ``keys`` that holds one. R610
    prints it as "KMD Version" and follows "Driver Version"'s number with a deprecation
    note in brackets, so the first version-shaped token is taken. ``missing`` is raised
    when no key is there, a CaptureError saying ``bad`` when none holds a version."""
    present = root.first(*keys)
    if present is None:
        raise missing
    for key in keys:
        found = _DRIVER_VERSION.search(string(root.get(key)) or "")
        if found is not None:
            return found[1]
    raise CaptureError(bad, present.line)


def cuda_version(root: Node, keys: tuple[str, ...]) -> str | None:
    """The CUDA version ("12.2") of the first of ``keys`` that holds one: R610 prints it as
    "CUDA UMD Version" and follows "CUDA Version"'s number with a deprecation note."""
    for key in keys:
        found = _CUDA_VERSION.match(string(root.get(key)) or "")
        if found is not None:
            return found[0]
    return None


@dataclass(frozen=True, slots=True)
class PowerLimits:
    """The power block's current (enforced), requested and default limits."""

    current: Node | None
    requested: Node | None
    default: Node | None


def power_limits(power: Node | None, keys: tuple[str, str, str, str, str, str]) -> PowerLimits:
    """The limits of a power block. ``keys`` name, in the capture's format: the block R610
    nests the current, requested and default limits in ("GPU Ceiling Power Limit"), those
    three, then the older layout's "Enforced Power Limit" (what applies) and "Power Limit"
    (what was requested, and the only limit some drivers print)."""
    ceiling, current, requested, default, enforced, legacy = keys

    def limit(key: str) -> Node | None:
        return pick(power, key) or at(power, ceiling, key)

    older = pick(power, legacy) if pick(power, enforced) is not None else None
    return PowerLimits(
        current=limit(current) or pick(power, enforced, legacy),
        requested=limit(requested) or older,
        default=limit(default),
    )


def fabric_health(
    section: Node | None, keys: tuple[str, str, str, str, str]
) -> tuple[tuple[str, bool], ...]:
    """The fabric health block as (condition, true?) pairs, N/A entries left out. ``keys``
    name its Bandwidth ("Full" or "Degraded"), Route Recovery in progress, Route
    Unhealthy, Access Timeout Recovery and Incorrect Configuration ("None" or what is
    wrong) entries in the capture's format."""
    if section is None:
        return ()
    bandwidth, recovery, unhealthy, timeout, configuration = (section.get(k) for k in keys)
    found: list[tuple[str, bool]] = []
    width = string(bandwidth)
    if width is not None and width.lower() in ("full", "degraded"):
        found.append(("bandwidth_degraded", width.lower() == "degraded"))
    for name, node in (
        ("route_recovery", recovery),
        ("route_unhealthy", unhealthy),
        ("access_timeout_recovery", timeout),
    ):
        value = flag(node)
        if value is not None:
            found.append((name, value))
    wrong = string(configuration)
    if wrong is not None:
        found.append(("incorrect_configuration", wrong.lower() != "none"))
    return tuple(found)


def summed(*values: int | None) -> int | None:
    """The sum of the counts present, None when none is (H100 splits SRAM uncorrectable
    into parity and SEC-DED counts; the model keeps their total)."""
    present = [value for value in values if value is not None]
    return sum(present) if present else None


def histogram(
    section: Node | None, keys: tuple[str, str, str, str, str]
) -> tuple[int, int, int, int, int] | None:
    """The bank remap availability histogram (max, high, partial, low, none), or None
    unless all five buckets are readable."""
    if section is None:
        return None
    top, high, partial, low, none = (integer(section.get(key), "bank(s)") for key in keys)
    if top is None or high is None or partial is None or low is None or none is None:
        return None
    return (top, high, partial, low, none)
