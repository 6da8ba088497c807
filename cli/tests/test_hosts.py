"""``floe.hosts``: simulated hosts are reachable only at the addresses the test made, a cut stops traffic like a
pulled cable (an open connection stalls, then carries on after the restore), and nothing is left behind."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contracts import WEIGHTS, WeightsPublished
from eventbus import KafkaSettings, Producer, ensure_topics_sync
from eventbus.broker import LocalBroker, free_ports
from eventbus.replay import replay
from floe.hosts import Network, leftovers

pytestmark = [pytest.mark.scale]

ECHO = """
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
while True:
    c, _ = s.accept()
    with c:
        while data := c.recv(100):
            c.sendall(data.upper())
"""


def _connect(address: str, port: int, timeout: float) -> socket.socket:
    deadline = time.monotonic() + 10
    while True:
        try:
            return socket.create_connection((address, port), timeout=timeout)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _echo(conn: socket.socket, data: bytes) -> bytes:
    conn.sendall(data)
    return conn.recv(100)


def _from_host(net: Network, host: str, address: str, port: int) -> subprocess.CompletedProcess[str]:
    probe = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()"
    return subprocess.run(
        net[host].argv([sys.executable, "-c", probe, address, str(port)]), capture_output=True, text=True, timeout=30
    )


def test_hosts_talk_on_their_addresses_a_cut_stalls_them_and_nothing_is_left() -> None:
    with Network(["server", "client"]) as net:
        server = net["server"]
        assert server.address != net["client"].address and server.address.startswith(str(net.subnet)[:4])
        echo = subprocess.Popen(
            server.argv([sys.executable, "-c", ECHO, server.address, "7000"]), stdout=subprocess.PIPE, text=True
        )
        loopback = subprocess.Popen(
            server.argv([sys.executable, "-c", ECHO, "127.0.0.1", "7001"]), stdout=subprocess.PIPE, text=True
        )
        assert echo.stdout is not None and echo.stdout.readline() == "listening\n"
        assert loopback.stdout is not None and loopback.stdout.readline() == "listening\n"
        assert net.pids("server") and not net.pids("client")

        # Host to host and root to host, at the network's addresses; a host's loopback is its own.
        assert _from_host(net, "client", server.address, 7000).returncode == 0
        assert _from_host(net, "client", "127.0.0.1", 7001).returncode != 0
        with _connect(server.address, 7000, timeout=1.0) as conn:
            assert _echo(conn, b"before") == b"BEFORE"

            net.cut("server")
            with pytest.raises(TimeoutError):  # the open connection stalls: no error, no answer
                _echo(conn, b"during")
            with pytest.raises(OSError):
                socket.create_connection((server.address, 7000), timeout=1.0)
            assert _from_host(net, "client", server.address, 7000).returncode != 0
            assert echo.poll() is None, "a cut host's processes live on"

            net.restore("server")
            conn.settimeout(30)  # TCP retransmits what was sent during the cut
            assert conn.recv(100) == b"DURING"
            assert _echo(conn, b"after") == b"AFTER"
        assert _from_host(net, "client", server.address, 7000).returncode == 0
        network_id = net.id

    # close() killed what ran on the hosts and removed every namespace and link.
    assert echo.wait(timeout=10) == -9 and loopback.wait(timeout=10) == -9
    assert leftovers(network_id) == []


def test_a_broker_on_its_own_host_survives_a_cut_and_loses_nothing(tmp_path: Path) -> None:
    """The broker runs inside a simulated host at that host's address; sends made while its host is cut off are
    delivered once it is back, exactly once."""
    with Network(["broker"]) as net:
        host = net["broker"]
        broker = LocalBroker.at(tmp_path / "kafka")
        try:
            address = broker.start(*free_ports(2), owner_pid=os.getpid(), host=host.address, wrap=host.argv([]))
            assert address.startswith(host.address + ":")
            assert broker.pid() in net.pids("broker"), "the broker runs on its host"
            kafka = KafkaSettings(bootstrap_servers=address)
            topic = WEIGHTS.with_name(f"floe.hosts-test.{net.id}")
            ensure_topics_sync(kafka, [topic])

            async def produce() -> None:
                async with Producer(kafka) as producer:
                    await producer.send(topic, WeightsPublished(version=1, uri="file:///a", step=1))
                    net.cut("broker")
                    cut_at = time.monotonic()
                    sent = asyncio.create_task(
                        producer.send(topic, WeightsPublished(version=2, uri="file:///b", step=2))
                    )
                    await asyncio.sleep(15)
                    assert not sent.done(), "delivered to a host that is cut off"
                    net.restore("broker")
                    await asyncio.wait_for(sent, 120)
                    assert time.monotonic() - cut_at >= 15

            # Bounded as a whole: a stuck send fails the test with this line, not at the run's global timeout.
            asyncio.run(asyncio.wait_for(produce(), 300))
            got = [r.event.version for r in replay(kafka, topic, idle_timeout_s=3.0)]
            assert got == [1, 2]
        finally:
            broker.stop()
