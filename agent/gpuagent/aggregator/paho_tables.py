"""Shared MQTT 5 property tables for paho-mqtt.

paho builds three lookup tables (property names, types, which packets allow which
property) afresh in every `Properties` object, and under MQTT 5 it makes one for every
PUBLISH it receives; `unpack` then walks all 27 names twice to clear the new, empty
object. That is most of paho's cost per received message: it held one aggregator core to
about 1,500 messages/s. The tables are constants (nothing in paho writes to them), so
`install()` makes every `Properties` share one copy and clears by the precomputed names.
The behaviour is unchanged; tests/test_aggregator_paho.py holds the patched class to the
original's results.
"""

from __future__ import annotations

from typing import Any, Final

import paho.mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

_ORIGINAL_INIT: Final = Properties.__init__
_ORIGINAL_CLEAR: Final = Properties.clear
_template = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
_TYPES: Final = _template.types
_NAMES: Final = _template.names
_TABLE: Final = _template.properties
_COMPRESSED: Final = tuple(name.replace(" ", "") for name in _NAMES)


def _init(self: Properties, packetType: int) -> None:  # noqa: N803 - paho's name
    object.__setattr__(self, "packetType", packetType)
    object.__setattr__(self, "types", _TYPES)
    object.__setattr__(self, "names", _NAMES)
    object.__setattr__(self, "properties", _TABLE)


def _clear(self: Properties) -> None:
    attributes: dict[str, Any] = self.__dict__
    for name in _COMPRESSED:
        attributes.pop(name, None)


def supported() -> bool:
    """Only the paho line whose Properties this was written against (2.x)."""
    return paho.mqtt.__version__.startswith("2.")


def install() -> bool:
    """Share the tables (idempotent); False, leaving paho alone, on another paho."""
    if not supported():
        return False
    Properties.__init__ = _init  # type: ignore[method-assign]
    Properties.clear = _clear  # type: ignore[method-assign]
    return True


def uninstall() -> None:
    Properties.__init__ = _ORIGINAL_INIT  # type: ignore[method-assign]
    Properties.clear = _ORIGINAL_CLEAR  # type: ignore[method-assign]
