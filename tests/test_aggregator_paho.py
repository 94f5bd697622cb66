"""The shared paho property tables behave exactly as paho's own per-object tables, and
the patch is applied only to a paho version it was verified against."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import paho.mqtt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gpuagent.aggregator import paho_tables

TABLES = frozenset({"packetType", "types", "names", "properties"})

# Every property MQTT 5 allows on a PUBLISH, as (name, value) assignments in order: the
# multi-valued ones (UserProperty, SubscriptionIdentifier) appear several times.
Assignments = tuple[tuple[str, Any], ...]
REPRESENTATIVE: dict[str, Assignments] = {
    "none": (),
    "aggregator": (  # what fleet messages carry
        ("MessageExpiryInterval", 86400),
        ("ContentType", "application/json"),
        ("UserProperty", ("node", "n1")),
        ("UserProperty", ("cluster", "c1")),
        ("CorrelationData", b"\x00\x01"),
    ),
    "every_publish_property": (
        ("PayloadFormatIndicator", 1),
        ("MessageExpiryInterval", 0xFFFFFFFF),
        ("ContentType", "application/vnd.gpuagent+json; charset=utf-8"),
        ("ResponseTopic", "gpuagent/v1/c1/n1/reply"),
        ("CorrelationData", bytes(range(256))),
        ("SubscriptionIdentifier", 1),
        ("SubscriptionIdentifier", 268435455),
        ("TopicAlias", 65535),
        ("UserProperty", ("a", "1")),
        ("UserProperty", ("a", "1")),  # repeated pairs are kept, in order
        ("UserProperty", ("", "")),
    ),
    "unicode_and_extremes": (
        ("PayloadFormatIndicator", 0),
        ("MessageExpiryInterval", 0),
        ("ContentType", "tëxt/plain ✓"),
        ("ResponseTopic", "ноды/😀"),
        ("CorrelationData", b""),
        ("TopicAlias", 1),
        ("UserProperty", ("ключ", "значение")),
    ),
}


@pytest.fixture
def patched() -> Iterator[None]:
    """The patch on for the test; afterwards as it was found (the aggregator installs it)."""
    was = paho_tables.installed()
    assert paho_tables.install()
    yield
    if was:
        paho_tables.install()
    else:
        paho_tables.uninstall()


@pytest.fixture
def quiet_refusal(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh "logged once" flag, and paho's state restored afterwards."""
    was = paho_tables.installed()
    monkeypatch.setattr(paho_tables, "_refusal_logged", False)
    yield
    monkeypatch.undo()
    if was:
        paho_tables.install()
    else:
        paho_tables.uninstall()


def build(assignments: Assignments) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    for name, value in assignments:
        setattr(props, name, value)
    return props


def values(props: Properties) -> dict[str, Any]:
    """The properties an object holds, without paho's tables."""
    return {k: v for k, v in vars(props).items() if k not in TABLES}


def observe(assignments: Assignments) -> dict[str, Any]:
    """Everything paho lets a caller see of these properties: built, packed and decoded."""
    built = build(assignments)
    wire = built.pack()
    decoded = Properties(PacketTypes.PUBLISH)
    _, length = decoded.unpack(wire)
    reused = build((("ContentType", "stale"), ("UserProperty", ("old", "1"))))
    reused.unpack(wire)  # unpack clears what the object held before
    return {
        "wire": wire,
        "length": length,
        "built": values(built),
        "decoded": values(decoded),
        "reused": values(reused),
        "json": decoded.json(),
        "str": str(decoded),
        "empty": decoded.isEmpty(),
    }


def outcome(assignments: Assignments) -> dict[str, Any]:
    """`observe`, or the error paho raised (then the patched class must raise the same)."""
    try:
        return observe(assignments)
    except Exception as exc:  # compared with what unpatched paho raised
        return {"error": type(exc), "message": str(exc)}


def unpatched(assignments: Assignments) -> dict[str, Any]:
    was = paho_tables.installed()
    paho_tables.uninstall()
    try:
        return outcome(assignments)
    finally:
        if was:
            paho_tables.install()


@pytest.mark.parametrize("case", sorted(REPRESENTATIVE))
def test_publish_properties_decode_as_unpatched_paho(patched: None, case: str) -> None:
    assignments = REPRESENTATIVE[case]
    reference = unpatched(assignments)
    assert paho_tables.installed()
    assert outcome(assignments) == reference
    assert reference["decoded"] == reference["built"]  # the reference itself round-trips


def test_the_aggregators_properties_decode_to_the_expected_values(patched: None) -> None:
    decoded = Properties(PacketTypes.PUBLISH)
    decoded.unpack(build(REPRESENTATIVE["aggregator"]).pack())
    assert decoded.UserProperty == [("node", "n1"), ("cluster", "c1")]
    assert decoded.json()["CorrelationData"] == "0001"


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
_publish_property = st.one_of(
    st.tuples(st.just("PayloadFormatIndicator"), st.integers(0, 1)),
    st.tuples(st.just("MessageExpiryInterval"), st.integers(0, 0xFFFFFFFF)),
    st.tuples(st.just("ContentType"), _text),
    st.tuples(st.just("ResponseTopic"), _text),
    st.tuples(st.just("CorrelationData"), st.binary(max_size=40)),
    st.tuples(st.just("SubscriptionIdentifier"), st.integers(1, 268435455)),
    st.tuples(st.just("TopicAlias"), st.integers(1, 65535)),
    st.tuples(st.just("UserProperty"), st.tuples(_text, _text)),
)
_MULTIPLE = frozenset({"UserProperty", "SubscriptionIdentifier"})


@st.composite
def _assignments(draw: st.DrawFn) -> Assignments:
    drawn = draw(st.lists(_publish_property, max_size=12))
    seen: set[str] = set()
    kept: list[tuple[str, Any]] = []
    for name, value in drawn:  # single-valued properties once (a second one is invalid)
        if name in _MULTIPLE or name not in seen:
            seen.add(name)
            kept.append((name, value))
    return tuple(kept)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(assignments=_assignments())
def test_any_publish_properties_decode_as_unpatched_paho(assignments: Assignments) -> None:
    was = paho_tables.installed()
    try:
        reference = unpatched(assignments)
        assert paho_tables.install()
        assert outcome(assignments) == reference  # paho's MalformedPacket (a NUL) too
    finally:
        if not was:
            paho_tables.uninstall()


@pytest.mark.parametrize(
    "packet", [PacketTypes.PUBACK, PacketTypes.CONNACK, PacketTypes.DISCONNECT]
)
def test_the_other_packets_paho_reads_decode_as_unpatched(patched: None, packet: int) -> None:
    def decode() -> dict[str, Any]:
        props = Properties(packet)
        props.ReasonString = "why"
        props.UserProperty = ("k", "v")
        out = Properties(packet)
        out.unpack(props.pack())
        return values(out)

    paho_tables.uninstall()
    reference = decode()
    paho_tables.install()
    assert decode() == reference == {"ReasonString": "why", "UserProperty": [("k", "v")]}


def test_validation_and_clearing_still_work(patched: None) -> None:
    props = Properties(PacketTypes.PUBLISH)
    assert props.isEmpty()
    with pytest.raises(Exception, match="does not apply"):
        props.SessionExpiryInterval = 10  # a CONNECT property
    with pytest.raises(Exception, match="must be one of"):
        props.NoSuchProperty = 1
    with pytest.raises(Exception, match="range 1-65535"):
        props.TopicAlias = 0
    props.ContentType = "x"
    assert not props.isEmpty()
    props.clear()
    assert props.isEmpty()
    # Objects share the tables, never each other's values.
    other = Properties(PacketTypes.PUBLISH)
    props.ContentType = "y"
    assert other.isEmpty()
    assert other.names is props.names


def test_the_installed_paho_is_a_verified_one() -> None:
    # When this fails, a paho upgrade arrived: check its Properties (see the module
    # docstring) and add the version to VERIFIED_VERSIONS, or the aggregator runs slower.
    assert paho.mqtt.__version__ in paho_tables.VERIFIED_VERSIONS
    assert paho_tables.supported()


@pytest.mark.parametrize("version", ["3.0.0", "2.99.0", "2.2.1", "2.2.0rc1", "1.6.1", ""])
def test_the_gate_refuses_an_unknown_version(
    monkeypatch: pytest.MonkeyPatch,
    quiet_refusal: None,
    caplog: pytest.LogCaptureFixture,
    version: str,
) -> None:
    assert paho_tables.install()  # on, so the refusal must also take it off
    monkeypatch.setattr("paho.mqtt.__version__", version)
    assert not paho_tables.supported()
    with caplog.at_level(logging.WARNING, logger=paho_tables.__name__):
        assert not paho_tables.install()
        assert not paho_tables.install()
    assert not paho_tables.installed()
    assert Properties(PacketTypes.PUBLISH).names is not Properties(PacketTypes.PUBLISH).names
    refusals = [r for r in caplog.records if r.name == paho_tables.__name__]
    assert len(refusals) == 1  # logged once, not per consumer or per call
    assert f"paho-mqtt {version} is not a version it was verified against" in (
        refusals[0].getMessage()
    )


def test_the_gate_refuses_a_properties_layout_it_does_not_know(
    monkeypatch: pytest.MonkeyPatch, quiet_refusal: None, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(paho_tables, "_LAYOUT_MATCHES", False)
    with caplog.at_level(logging.WARNING, logger=paho_tables.__name__):
        assert not paho_tables.install()
    assert not paho_tables.installed()
    assert "layout" in caplog.text


def test_verified_versions_are_exact_releases() -> None:
    assert paho_tables.supported("2.2.0")
    assert not paho_tables.supported("2")
    assert not paho_tables.supported("2.2")
    assert all(v.count(".") == 2 for v in paho_tables.VERIFIED_VERSIONS)
