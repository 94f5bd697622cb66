"""Messages on a node's ``.../cmd`` topic: allowlisted commands, cordon decisions and the
aggregator's acknowledgements.

Anything oversized, malformed, addressed to another node, expired or outside the allowlist
is rejected, counted and logged once per reason. Every command gets a reply (through the
spool), also one that is refused or fails; commands run one at a time in arrival order,
each in a task of its own, so a slow one never holds up the cordon decisions arriving
beside it. docs/fleet.md lists the commands.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from gpuagent.config import MqttOutput
from gpuagent.fleet import schema
from gpuagent.kernel.parse import canonical_pci

log = logging.getLogger("gpuagent.fleet.reporter")

_SEEN_COMMANDS = 1024


class CommandTarget(Protocol):
    """What remote commands may touch on the node (the daemon implements it)."""

    def refresh(self) -> None: ...

    async def run_checks(self) -> str: ...

    def set_remediation_mode(self, mode: str) -> str: ...

    async def reset_gpu(self, bus_id: str) -> str: ...

    async def acknowledge(self, bus_id: str, check: str | None, reason: str, by: str) -> str: ...


class CommandRefusedError(Exception):
    """A well-formed command the node will not carry out; the text says why."""


class Commands:
    def __init__(
        self,
        config: MqttOutput,
        node: str,
        cluster: str,
        *,
        reply: Callable[[dict[str, Any]], None],
        acknowledged: Callable[[list[str]], Coroutine[Any, Any, None]],
        decisions: dict[str, asyncio.Future[dict[str, Any]]],
    ) -> None:
        self.config = config
        self.node = node
        self.cluster = cluster
        self._reply = reply
        self._acknowledged = acknowledged
        # Cordon requests waiting for their decision, by request id (the reporter's).
        self._decisions = decisions
        self._seen_commands: OrderedDict[str, None] = OrderedDict()
        self._command_tasks: set[asyncio.Task[None]] = set()
        self._command_lock = asyncio.Lock()
        self.target: CommandTarget | None = None
        self.received: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()

    def _reject(self, reason: str, detail: str) -> None:
        if not self.rejected[reason]:
            log.warning("rejected a command from the broker (%s): %s", reason, detail)
        self.rejected[reason] += 1

    def handle(self, payload: bytes | bytearray) -> asyncio.Task[None] | None:
        """Act on one message from ``.../cmd``; a command to run gets a task of its own
        (returned), so cordon decisions are never stuck behind a slow command."""
        message = self._accepted(payload)
        if message is None:
            return None
        if message["type"] == "ack":
            ids = [i for i in message["ids"] if isinstance(i, str)]
            task = asyncio.get_running_loop().create_task(self._acknowledged(ids))
            self._command_tasks.add(task)
            task.add_done_callback(self._command_tasks.discard)
            return task
        if message["type"] == "cordon_decision":
            self.received["cordon_decision"] += 1
            future = self._decisions.get(message["request_id"])
            if future is not None and not future.done():
                future.set_result(message)
            return None
        if message["type"] != "command" or message["command"] not in schema.COMMANDS:
            self._reject("not_allowed", f"{message['type']} {message.get('command')!r}")
            return None
        task = asyncio.get_running_loop().create_task(self._run_command(message))
        # Held until done (the loop keeps only weak references); outlives a reconnect,
        # since its reply goes through the spool.
        self._command_tasks.add(task)
        task.add_done_callback(self._command_tasks.discard)
        return task

    def _accepted(self, payload: bytes | bytearray) -> dict[str, Any] | None:
        """The message, if it is well-formed, for this node, fresh and not seen before."""
        try:
            message = schema.decode(payload, max_bytes=self.config.max_command_bytes)
        except schema.PayloadError as exc:
            self._reject(exc.reason, exc.detail)
            return None
        if message["node"] != self.node or message["cluster"] != self.cluster:
            self._reject("foreign", f"addressed to {message['cluster']}/{message['node']}")
            return None
        if message["type"] == "ack":
            return message  # not a command: no age limit, and no room taken among their ids
        # A command queued for a node that was away (its session outlives an outage)
        # must not run whenever the node comes back.
        age = time.time() - message["time"]
        if message["type"] == "command" and abs(age) > self.config.max_command_age_seconds:
            self._reject("expired", f"{message.get('command')!r} sent {age:.0f} s ago")
            return None
        if message["id"] in self._seen_commands:
            return None  # QoS 1 may deliver twice: act once
        self._seen_commands[message["id"]] = None
        while len(self._seen_commands) > _SEEN_COMMANDS:
            self._seen_commands.popitem(last=False)
        return message

    async def _run_command(self, message: dict[str, Any]) -> None:
        command, args = str(message["command"]), message["args"]
        self.received[command] += 1
        # One command at a time, in arrival order, as before they ran on the read loop.
        async with self._command_lock:
            try:
                detail = await self._dispatch(command, args)
                ok = True
            except CommandRefusedError as exc:
                detail, ok = str(exc), False
                log.warning("refused remote command %s: %s", command, detail)
            except Exception as exc:  # noqa: BLE001 - every command gets a reply
                detail, ok = f"failed: {exc!r}", False
                log.warning("remote command %s failed: %r", command, exc)
        self._reply(
            schema.reply_message(self.node, self.cluster, message["id"], ok=ok, detail=detail)
        )

    async def _dispatch(self, command: str, args: dict[str, Any]) -> str:
        target = self.target
        if target is None:
            raise CommandRefusedError("the node is not ready for commands")
        if command == "refresh":
            target.refresh()
            return "refresh requested"
        if command == "run_checks":
            return await target.run_checks()
        if command == "set_remediation_mode":
            mode = args.get("mode")
            if not isinstance(mode, str):
                raise CommandRefusedError("missing or invalid argument")
            try:
                return target.set_remediation_mode(mode)
            except ValueError as exc:
                raise CommandRefusedError(str(exc)) from None
        if command == "reset_gpu":
            return await self._reset(target, args.get("gpu"))
        if command == "ack":
            return await self._acknowledge(target, args)
        # "cordon_decision" as a plain command: decisions come as their own message type.
        raise CommandRefusedError(f"{command} is not a command this node runs")

    async def _acknowledge(self, target: CommandTarget, args: dict[str, Any]) -> str:
        gpu, check, reason = args.get("gpu"), args.get("check"), args.get("reason")
        if not isinstance(gpu, str) or not isinstance(reason, str):
            raise CommandRefusedError("ack needs args.gpu (a PCI bus id) and args.reason")
        if check is not None and not isinstance(check, str):
            raise CommandRefusedError("ack's args.check must be a check name")
        by = args.get("by")
        who = f"{by[:64]} (aggregator)" if isinstance(by, str) and by else "aggregator"
        try:
            return await target.acknowledge(canonical_pci(gpu) or gpu, check, reason, who)
        except ValueError as exc:  # AckError: nothing to acknowledge, no reason, no audit
            raise CommandRefusedError(str(exc)) from None

    async def _reset(self, target: CommandTarget, gpu: object) -> str:
        if not self.config.allow_remote_reset:
            raise CommandRefusedError(
                "remote GPU resets are disabled on this node (outputs.mqtt.allow_remote_reset)"
            )
        if not isinstance(gpu, str):
            raise CommandRefusedError("reset_gpu needs args.gpu, a PCI bus id")
        return await target.reset_gpu(gpu)
