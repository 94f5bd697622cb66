"""The shared paho property tables behave exactly as paho's own per-object tables."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gpuagent.aggregator import paho_tables


def publish_properties() -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 86400
    props.ContentType = "application/json"
    props.UserProperty = ("node", "n1")
    props.UserProperty = ("cluster", "c1")
    props.CorrelationData = b"\x00\x01"
    return props


@pytest.fixture
def patched() -> Iterator[None]:
    assert paho_tables.install()
    yield
    paho_tables.install()  # the aggregator installs it; leave it as found


def test_packing_and_unpacking_match_the_original(patched: None) -> None:
    paho_tables.uninstall()
    original = publish_properties()
    wire = original.pack()
    decoded_original = Properties(PacketTypes.PUBLISH)
    decoded_original.unpack(wire)
    paho_tables.install()
    fast = publish_properties()
    assert fast.pack() == wire
    decoded = Properties(PacketTypes.PUBLISH)
    decoded.unpack(wire)
    assert decoded.json() == decoded_original.json() == original.json()
    assert decoded.UserProperty == [("node", "n1"), ("cluster", "c1")]


def test_validation_and_clearing_still_work(patched: None) -> None:
    props = Properties(PacketTypes.PUBLISH)
    assert props.isEmpty()
    with pytest.raises(Exception, match="does not apply"):
        props.SessionExpiryInterval = 10  # a CONNECT property
    with pytest.raises(Exception, match="must be one of"):
        props.NoSuchProperty = 1
    props.ContentType = "x"
    assert not props.isEmpty()
    props.clear()
    assert props.isEmpty()
    # Objects share the tables, never each other's values.
    other = Properties(PacketTypes.PUBLISH)
    props.ContentType = "y"
    assert other.isEmpty()
    assert other.names is props.names


def test_install_is_skipped_on_another_paho(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("paho.mqtt.__version__", "3.0.0")
    paho_tables.uninstall()
    try:
        assert not paho_tables.install()
        assert Properties(PacketTypes.PUBLISH).names is not Properties(PacketTypes.PUBLISH).names
    finally:
        monkeypatch.undo()
        paho_tables.install()
