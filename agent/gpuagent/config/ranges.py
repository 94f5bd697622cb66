"""Allowed ranges of numeric configuration keys, declared in the schema's annotations.

Every int and float key of the schema is ``Annotated[int | float, Range(...)]``, so its
range is written once, beside its type and default; the loader refuses a value outside it
(and NaN or infinity, which no range holds) naming the key and line.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """Bounds on a number: greater than ``gt``, at least ``ge``, less than ``lt``, at most
    ``le`` (each None: no such bound). ``label`` names the kind of value in the message."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    label: str = ""

    def problem(self, value: float) -> str | None:
        """Why ``value`` is outside the range, or None."""
        if not math.isfinite(value):
            return f"must be a finite number; it must {self.describe()}"
        low_ok = (self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
        high_ok = (self.lt is None or value < self.lt) and (self.le is None or value <= self.le)
        return None if low_ok and high_ok else f"must {self.describe()}"

    def describe(self) -> str:
        """The range in words: "be greater than 0", "be 0 to 100", "not be negative"."""
        if self == Range(ge=0):
            return "not be negative"
        if self.ge is not None and self.le is not None:
            words = f"{_num(self.ge)} to {_num(self.le)}"
        else:
            bounds = (
                ("greater than", self.gt),
                ("at least", self.ge),
                ("less than", self.lt),
                ("at most", self.le),
            )
            words = " and ".join(f"{name} {_num(b)}" for name, b in bounds if b is not None)
        return f"be {self.label}, {words}" if self.label else f"be {words or 'any number'}"


def _num(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


# The ranges most keys share.
POSITIVE = Range(gt=0)  # durations and sizes that must be set: 0 would mean "never"/"none"
NON_NEGATIVE = Range(ge=0)  # thresholds, holds and counts where 0 is meaningful ("at once", "off")
AT_LEAST_ONE = Range(ge=1)  # counts where 0 would switch a safety step off
FRACTION = Range(gt=0, le=1)
PERCENT = Range(ge=0, le=100)
# Temperatures a GPU's slowdown and shutdown thresholds can have, in degrees Celsius.
CELSIUS = Range(gt=0, le=150)
PORT = Range(ge=1, le=65535, label="a port number")
# MQTT's 16-bit keepalive and 32-bit message expiry interval.
MQTT_KEEPALIVE = Range(gt=0, le=65535)
MQTT_EXPIRY = Range(gt=0, le=2**32 - 1)


def range_of(hint: object) -> Range | None:
    """The Range in an ``Annotated[...]`` hint, else None."""
    if typing.get_origin(hint) is typing.Annotated:
        return next((m for m in typing.get_args(hint)[1:] if isinstance(m, Range)), None)
    return None
