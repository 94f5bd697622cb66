"""Shared MQTT 5 property tables for paho-mqtt: a version-gated patch of paho's private
`Properties` internals.

Why: paho builds three lookup tables (property names, types, which packets allow which
property) afresh in every `Properties` object, and under MQTT 5 it makes one for every
PUBLISH it receives; `unpack` then walks all 27 names twice to clear the new, empty
object. That is most of paho's cost per received message: it held one aggregator core to
about 1,500 messages/s. paho offers no supported way to change this (no hook, no
option, no factory for the `Properties` it builds while reading packets), so `install()`
replaces `Properties.__init__` and `Properties.clear`: every object shares one copy of
the tables (built by paho's own constructor at import time, so their contents are
paho's), and clearing pops the precomputed attribute names.

What this touches: it is process-wide (it patches the class, not one client), and it
relies on paho's private layout: `__init__` sets exactly ``packetType``, ``types``,
``names`` and ``properties``, and nothing in paho ever writes to the three tables. So it
is isolated behind a gate (`supported()`):

* the installed ``paho.mqtt.__version__`` must be in `VERIFIED_VERSIONS`, an explicit
  allow-list of releases whose `Properties` was checked (a new paho release, even 2.x,
  runs unpatched until someone checks it and adds it);
* and a `Properties` built by paho's own constructor must hold exactly the attributes
  above (a vendor-patched paho that adds state is refused as well).

Otherwise `install()` logs once (a warning: the aggregator then runs at paho's own speed)
and leaves paho alone. `uninstall()` restores paho's methods.

tests/test_aggregator_paho.py holds the patched class to unpatched paho's results: the
wire bytes and decoded properties for every property a PUBLISH may carry, validation,
clearing, and the gate refusing an unknown version.

To allow a new paho release: diff its ``paho/mqtt/properties.py`` against a verified one
(``Properties.__init__``, ``clear`` and every method reading the tables), add the version
to `VERIFIED_VERSIONS`, and run the test with it installed.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import paho.mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

log = logging.getLogger(__name__)

# paho-mqtt releases whose Properties this patch was checked against. 2.2.0 is the one
# the tests run with; 2.0.0 and 2.1.0 have the same Properties.__init__ and clear (the
# differences, in readBytes and the variable byte integer decoder, do not touch the tables).
VERIFIED_VERSIONS: Final = frozenset({"2.0.0", "2.1.0", "2.2.0"})
# What paho's constructor sets on a Properties: the patch shares these (all but the first).
_EXPECTED_ATTRIBUTES: Final = frozenset({"packetType", "types", "names", "properties"})

_ORIGINAL_INIT: Final = Properties.__init__
_ORIGINAL_CLEAR: Final = Properties.clear
_template = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
_TYPES: Final = _template.types
_NAMES: Final = _template.names
_TABLE: Final = _template.properties
_COMPRESSED: Final = tuple(name.replace(" ", "") for name in _NAMES)
_LAYOUT_MATCHES: Final = set(vars(_template)) == _EXPECTED_ATTRIBUTES

_refusal_logged = False


def _init(self: Properties, packetType: int) -> None:  # noqa: N803 - paho's name
    object.__setattr__(self, "packetType", packetType)
    object.__setattr__(self, "types", _TYPES)
    object.__setattr__(self, "names", _NAMES)
    object.__setattr__(self, "properties", _TABLE)


def _clear(self: Properties) -> None:
    attributes: dict[str, Any] = self.__dict__
    for name in _COMPRESSED:
        attributes.pop(name, None)


def refusal(version: str | None = None) -> str | None:
    """Why the patch must not be applied to this paho (None: it may be)."""
    version = paho.mqtt.__version__ if version is None else version
    if version not in VERIFIED_VERSIONS:
        verified = ", ".join(sorted(VERIFIED_VERSIONS))
        return f"paho-mqtt {version} is not a version it was verified against ({verified})"
    if not _LAYOUT_MATCHES:
        return f"paho-mqtt {version}'s Properties does not have the layout it was written for"
    return None


def supported(version: str | None = None) -> bool:
    """Whether the installed paho (or ``version``) is one the patch was verified against."""
    return refusal(version) is None


def installed() -> bool:
    return Properties.__init__ is _init


def install() -> bool:
    """Share the tables (idempotent). On a paho it was not verified against: log once,
    leave paho alone (restoring its methods if a patch was in place) and return False."""
    global _refusal_logged  # noqa: PLW0603 - log the refusal once per process
    why = refusal()
    if why is not None:
        uninstall()
        if not _refusal_logged:
            _refusal_logged = True
            log.warning(
                "not sharing paho's MQTT 5 property tables: %s; paho runs unpatched "
                "(correct, but receiving costs more CPU per message)",
                why,
            )
        return False
    Properties.__init__ = _init  # type: ignore[method-assign]
    Properties.clear = _clear  # type: ignore[method-assign]
    return True


def uninstall() -> None:
    Properties.__init__ = _ORIGINAL_INIT  # type: ignore[method-assign]
    Properties.clear = _ORIGINAL_CLEAR  # type: ignore[method-assign]
