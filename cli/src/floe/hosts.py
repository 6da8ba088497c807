"""Simulated hosts on one machine: network namespaces with their own addresses, joined by a switch, cut at will.

The multi-host tests (docs/scaling.md) run the broker and the services on separate "hosts" and take hosts off the
network. ``Network`` builds that from Linux primitives (root only):

- one namespace per host (``floe-<id>-<host>``), whose only link besides ``lo`` is ``eth0`` with ``10.<a>.<b>.<n>/24``;
- a **switch** namespace holding a bridge and the far end of every host's veth. The bridge lives there, not in the
  root namespace, because a root-namespace bridge is subject to the root's iptables when ``br_netfilter`` is
  loaded (Docker loads it and sets ``FORWARD`` to ``DROP``); a fresh namespace has no rules;
- the root namespace (the test itself: readiness probes, audits) joins the switch too, as ``10.<a>.<b>.1``, so its
  traffic to a host is local output, never forwarded, and stays on addresses the test created.

``cut(host)`` takes the host's port on the switch down (traffic in both directions stops, sockets stay open, as
with a pulled cable) and ``restore(host)`` brings it back. ``close()`` kills what still runs in the namespaces and
removes every namespace and link; ``leftovers()`` lists any that remain (the tests assert it is empty).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

__all__ = ["Host", "Network", "NetworkError", "leftovers"]

PREFIX = "floe-"  # every namespace this module makes starts so; ``leftovers`` looks for them
LINK_PREFIX = "fl"  # root-namespace links (the root's port on the switch)


class NetworkError(RuntimeError):
    pass


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 under 10.200.0.0/13 that no route or address of this machine overlaps."""
    routes = _ip("-4", "route", "show", "table", "all").stdout + _ip("-4", "-o", "addr").stdout
    used: list[ipaddress.IPv4Network] = []
    for word in routes.split():
        try:
            net = ipaddress.ip_network(word, strict=False)
        except ValueError:
            continue
        if isinstance(net, ipaddress.IPv4Network) and net.prefixlen > 0:
            used.append(net)
    candidates = list(ipaddress.IPv4Network("10.200.0.0/13").subnets(new_prefix=24))
    start = secrets.randbelow(len(candidates))
    for i in range(len(candidates)):
        net = candidates[(start + i) % len(candidates)]
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetworkError("no free /24 under 10.200.0.0/13")


@dataclass
class Host:
    name: str
    netns: str
    address: str
    port: str  # the host's port on the switch (a link in the switch namespace)

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]


@dataclass
class Network:
    """``Network(["broker", "node-a"])``: hosts on one switch; a context manager that removes all of it."""

    names: Sequence[str]
    id: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: dict[str, Host] = field(default_factory=dict, init=False)
    subnet: ipaddress.IPv4Network | None = field(default=None, init=False)

    @property
    def switch(self) -> str:
        return f"{PREFIX}{self.id}-switch"

    @property
    def root_link(self) -> str:
        return f"{LINK_PREFIX}{self.id}r"

    @property
    def root_address(self) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    def __enter__(self) -> Network:
        try:
            self.up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def up(self) -> None:
        if os.geteuid() != 0:
            raise NetworkError("simulated hosts need root (network namespaces and veth links)")
        if len(set(self.names)) != len(self.names) or len(self.names) > 200:
            raise NetworkError(f"host names must be distinct, at most 200: {list(self.names)}")
        for name in self.names:  # before anything is made
            if len(name) > 40 or not name.replace("-", "").isalnum():
                raise NetworkError(f"host name {name!r}: letters, digits and '-', at most 40")
        self.subnet = _free_subnet()
        prefix = self.subnet.prefixlen
        _ip("netns", "add", self.switch)
        _ip("link", "add", "br0", "type", "bridge", netns=self.switch)
        _ip("link", "set", "br0", "up", netns=self.switch)
        _ip("link", "set", "lo", "up", netns=self.switch)
        # The root namespace's port: its end stays here with the first address, the other end joins the bridge.
        _ip("link", "add", self.root_link, "type", "veth", "peer", "name", "root", "netns", self.switch)
        _ip("link", "set", "root", "master", "br0", "up", netns=self.switch)
        _ip("addr", "add", f"{self.root_address}/{prefix}", "dev", self.root_link)
        _ip("link", "set", self.root_link, "up")
        for i, name in enumerate(self.names):
            netns = f"{PREFIX}{self.id}-{name}"
            address = str(self.subnet.network_address + 2 + i)
            port = f"h{i}"
            _ip("netns", "add", netns)
            self.hosts[name] = Host(name, netns, address, port)
            _ip("link", "add", "eth0", "netns", netns, "type", "veth", "peer", "name", port, "netns", self.switch)
            _ip("link", "set", port, "master", "br0", "up", netns=self.switch)
            _ip("link", "set", "lo", "up", netns=netns)
            _ip("addr", "add", f"{address}/{prefix}", "dev", "eth0", netns=netns)
            _ip("link", "set", "eth0", "up", netns=netns)

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def cut(self, name: str) -> None:
        """Take ``name`` off the network: its switch port goes down; its processes and sockets live on."""
        host = self.hosts[name]
        _ip("link", "set", host.port, "down", netns=self.switch)

    def restore(self, name: str) -> None:
        host = self.hosts[name]
        _ip("link", "set", host.port, "up", netns=self.switch)

    def pids(self, name: str) -> list[int]:
        """Processes running in ``name``'s namespace."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.hosts[name].netns], capture_output=True, text=True, timeout=30
        ).stdout
        return [int(p) for p in out.split()]

    def close(self, timeout_s: float = 10.0) -> None:
        """Kill what runs on the hosts (SIGKILL: their owners have had their chance to stop them), then remove every
        namespace and link. Idempotent."""
        names = [h.netns for h in self.hosts.values()]
        deadline = time.monotonic() + timeout_s
        for host in self.hosts.values():
            while True:
                pids = self.pids(host.name) if _netns_exists(host.netns) else []
                if not pids or time.monotonic() > deadline:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.05)
        _ip("link", "del", self.root_link, check=False)  # takes its peer in the switch with it
        for netns in [*names, self.switch]:
            if _netns_exists(netns):
                _ip("netns", "del", netns, check=False)  # a namespace's veth ends go with it
        self.hosts.clear()


def _netns_exists(netns: str) -> bool:
    return os.path.exists(f"/run/netns/{netns}")


def leftovers(network_id: str | None = None) -> list[str]:
    """Namespaces and root links this module made that still exist (of one network, or of any)."""
    ns_prefix = PREFIX + (f"{network_id}-" if network_id else "")
    root_link = re.compile(rf"{LINK_PREFIX}{re.escape(network_id) if network_id else '[0-9a-f]{6}'}r")
    found = [f"netns {n}" for n in sorted(os.listdir("/run/netns"))] if os.path.isdir("/run/netns") else []
    found = [f for f in found if f.split(" ", 1)[1].startswith(ns_prefix)]
    links = _ip("-o", "link", "show", check=False).stdout.splitlines()
    for line in links:
        parts = line.split(":", 2)
        if len(parts) > 1:
            link = parts[1].strip().split("@", 1)[0]
            if root_link.fullmatch(link):
                found.append(f"link {link}")
    return found
