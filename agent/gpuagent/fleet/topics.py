"""MQTT topics (v1): ``<prefix>/<cluster>/<node>/<channel>``.

Nodes publish ``state`` (retained), ``events``, ``actions`` and ``replies``; only the
aggregator publishes ``cmd``. Broker ACLs key on the node segment (see docs/fleet.md), so
names may not contain the MQTT separators or wildcards.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal, get_args

Channel = Literal["state", "events", "actions", "replies", "cmd"]
CHANNELS: Final[tuple[Channel, ...]] = get_args(Channel)
NODE_CHANNELS: Final[tuple[Channel, ...]] = ("state", "events", "actions", "replies")

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# The aggregator's user name on the broker (its certificate's CN), and further
# aggregators' ("aggregator-<name>"): no node may use one.
AGGREGATOR_IDENTITY: Final = "aggregator"


def is_aggregator_identity(name: str) -> bool:
    return name == AGGREGATOR_IDENTITY or name.startswith(AGGREGATOR_IDENTITY + "-")


class TopicError(ValueError):
    pass


def check_name(kind: str, name: str) -> str:
    """A cluster or node name usable as one topic level (and in an ACL pattern)."""
    if not NAME_RE.match(name):
        raise TopicError(
            f"{kind} name {name!r} must be 1-128 letters, digits, '.', '_' or '-' "
            "(no MQTT separators or wildcards)"
        )
    return name


@dataclass(frozen=True, slots=True)
class NodeTopics:
    """The topics of one node."""

    prefix: str
    cluster: str
    node: str

    def __post_init__(self) -> None:
        check_name("cluster", self.cluster)
        check_name("node", self.node)

    def topic(self, channel: Channel) -> str:
        return f"{self.prefix}/{self.cluster}/{self.node}/{channel}"


@dataclass(frozen=True, slots=True)
class ParsedTopic:
    cluster: str
    node: str
    channel: Channel


def parse_topic(prefix: str, topic: str) -> ParsedTopic:
    """Split a topic under ``prefix``; TopicError for anything else."""
    head = prefix + "/"
    if not topic.startswith(head):
        raise TopicError(f"topic {topic!r} is not under {prefix!r}")
    parts = topic[len(head) :].split("/")
    if len(parts) != 3:  # cluster/node/channel
        raise TopicError(f"topic {topic!r} is not <cluster>/<node>/<channel>")
    cluster, node, channel = parts
    if channel not in CHANNELS:
        raise TopicError(f"unknown channel {channel!r}")
    check_name("cluster", cluster)
    check_name("node", node)
    return ParsedTopic(cluster, node, channel)


def subscription(prefix: str, channel: Channel, share_group: str = "") -> str:
    """Every node's ``channel``; with a share group, a shared subscription
    (``$share/<group>/...``) so several aggregators split the fleet."""
    pattern = f"{prefix}/+/+/{channel}"
    return f"$share/{share_group}/{pattern}" if share_group else pattern
