"""A handled MQTT reconnect is one log line: the real daemon against a real mosquitto
(tests/mqtt_broker.py), its broker killed or stopped and started again while the agent
publishes."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable

import aiomqtt
import pytest

from conftest import DaemonProcess
from fleet_support import H100, xid_records
from gpuagent.fleet.connection import client_options, quiet_socket_races, settle
from mqtt_broker import Broker

pytestmark = pytest.mark.integration

Run = Callable[..., DaemonProcess]
# A dropped connection under paho logged "ERROR mqtt: failed to receive on socket: [Errno
# 104] Connection reset by peer" beside the agent's own line in about half the outages
# with traffic; six make a repeat of it all but certain to show.
OUTAGES = 6
NEVER_RETRIEVED = "Future exception was never retrieved"


def _problems(log: str) -> list[str]:
    return [
        line
        for line in log.splitlines()
        if " ERROR " in line
        or " CRITICAL " in line
        or "Traceback" in line
        or "never retrieved" in line
    ]


def test_a_broker_restart_logs_one_line_and_no_traceback(
    run_daemon: Run, mqtt_broker: Broker
) -> None:
    daemon = run_daemon(H100, config_extra=mqtt_broker.agent_config())
    daemon.wait_for(lambda _d: daemon.metric("gpuagent_mqtt_connected") == 1.0, timeout=30)
    bus = daemon.status()["gpus"][1]["pci_bus_id"]
    for outage in range(OUTAGES):
        mark = len(daemon.log())
        # Events to publish, so the broker goes while the agent sends.
        daemon.write_kernel_log(*xid_records(1000 * (outage + 1), 300, bus))
        (mqtt_broker.stop if outage % 2 else mqtt_broker.kill)()
        daemon.wait_for_log("MQTT connection lost", after=mark, timeout=30)
        mqtt_broker.start()
        daemon.wait_for_log("MQTT connected", after=mark, timeout=30)
        daemon.wait_for(lambda _d: daemon.metric("gpuagent_mqtt_connected") == 1.0, timeout=30)
        during = daemon.log()[mark:]
        lost = [line for line in during.splitlines() if "MQTT connection lost" in line]
        assert len(lost) == 1, during
        assert _problems(during) == []
    assert _problems(daemon.log()) == []


@pytest.mark.parametrize("settled", [True, False])
async def test_an_ending_nothing_iterated_over_is_read(mqtt_broker: Broker, settled: bool) -> None:
    """A connection that ends while no message iterator waits (while the reporter waits for
    its first state report's PUBACK) leaves aiomqtt's record of the end unread: asyncio
    logs "Future exception was never retrieved", with the exception, when the client is
    collected, unless `settle` read it. asyncio logs exactly the futures whose
    ``_log_traceback`` is still set then."""
    client = aiomqtt.Client(**client_options(mqtt_broker.connection(), client_id="t-end"))
    async with client:
        # Paused, the broker never answers; killed, the socket closes under the publish.
        assert mqtt_broker.process is not None
        mqtt_broker.process.send_signal(signal.SIGSTOP)
        publishing = asyncio.create_task(
            client.publish("gpuagent/v1/test", b"x", qos=1, timeout=2.0)
        )
        await asyncio.sleep(0.2)
        await asyncio.to_thread(mqtt_broker.kill)
        with pytest.raises(aiomqtt.MqttError, match="timed out"):
            await publishing
    ended = client._disconnected
    assert ended.done()
    if settled:
        settle(client)
    # What asyncio would log when the client is collected.
    assert ended._log_traceback is not settled
    # Read here in either case, so this test leaves nothing to be logged.
    assert isinstance(ended.exception(), aiomqtt.MqttCodeError)


async def test_a_socket_closed_before_the_loop_watches_it_is_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The race aiomqtt leaves: paho's socket handed to `add_writer` through
    `call_soon_threadsafe`, closed by the lost connection before that runs."""
    loop = asyncio.get_running_loop()
    quiet_socket_races(loop)
    quiet_socket_races(loop)  # a reconnect installs it again: still one handler
    closed = socket.socket()
    fd = closed.fileno()
    closed.close()
    with caplog.at_level(logging.DEBUG):
        loop.call_soon(loop.add_writer, fd, lambda: None)
        await asyncio.sleep(0.05)
        quiet = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert quiet == []
        assert any("closed before the loop watched it" in r.getMessage() for r in caplog.records)

        def broken() -> None:
            raise ValueError("a real bug")

        loop.call_soon(broken)  # anything else is still an error, with its traceback
        await asyncio.sleep(0.05)
    [error] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.exc_info is not None
    assert isinstance(error.exc_info[1], ValueError)
    loop.set_exception_handler(None)
