"""Commands to nodes: only the allowlist in `schema.COMMANDS` ever leaves the aggregator."""

from __future__ import annotations

import uuid
from typing import Any

from gpuagent.aggregator.ingest import Outgoing
from gpuagent.fleet import schema
from gpuagent.fleet.topics import NodeTopics


class CommandError(ValueError):
    pass


def command(
    prefix: str, cluster: str, node: str, name: object, args: object
) -> tuple[Outgoing, dict[str, Any]]:
    """The message for ``name`` with ``args``, and where it goes; CommandError if refused."""
    if not isinstance(name, str) or name not in schema.COMMANDS:
        allowed = ", ".join(sorted(schema.COMMANDS))
        raise CommandError(f"command {name!r} is not allowed (allowed: {allowed})")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise CommandError('"args" must be a JSON object')
    message = schema.command_message(
        f"aggregator:cmd:{uuid.uuid4().hex}", node, cluster, name, args
    )
    topic = NodeTopics(prefix, cluster, node).topic("cmd")
    return Outgoing(topic, schema.encode(message)), message
