"""Hosts of our own on one machine: each in its own Linux network namespace, joined by a
bridge in the root namespace, so a test can cut one host's link and leave it running (a
network partition: the process is alive and believes what it believed, but nothing reaches
it and it reaches nothing).

Addresses come from a documentation range (RFC 5737: 198.51.100.0/24, else 203.0.113.0/24
or 192.0.2.0/24 when another run holds it), which exists only inside the namespaces and on
the bridge: the namespaces have no default route, so nothing in them reaches out, and nothing
outside the machine can reach them. The bridge holds ``.1``; host ``i`` (0-based) is
``.(11 + i)``. Everything is removed by :meth:`Namespaces.close` (also when the set-up fails
half-way), and a run that died without closing leaves nothing a later run trips on: names
carry the process id, and :func:`remove_stale` deletes those of processes that are gone.

Needs root and iproute2 (``ip netns``, veth, bridge); ``tc netem`` is not used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess

log = logging.getLogger("tests.services")

SUBNETS = ("198.51.100", "203.0.113", "192.0.2")
PREFIX = "eo"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.stdout}")
    return done


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"{PREFIX}{os.getpid()}probe"
    done = _ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"`ip netns add` failed: {done.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def remove_stale() -> None:
    """Delete namespaces and bridges a dead run of this module left behind."""
    names = _ip("netns", "list", check=False).stdout.split()
    links = re.findall(r"^\d+: ([^:@]+)", _ip("-o", "link", "show", check=False).stdout, re.M)
    for name in [*names, *links]:
        m = re.fullmatch(rf"{PREFIX}(\d+)(?:br|n\d+|v\d+|probe)", name)
        if m is None or _alive(int(m.group(1))):
            continue
        if name in names:
            _ip("netns", "del", name, check=False)
        else:
            _ip("link", "del", name, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _free_subnet() -> str:
    routes = _ip("-4", "route", "show", check=False).stdout
    for subnet in SUBNETS:
        if f"{subnet}.0/24" not in routes:
            return subnet
    raise RuntimeError(f"every documentation subnet {SUBNETS} is in use on this machine")


class Namespaces:
    """``count`` hosts, each in a namespace of its own, on one bridge (see the module)."""

    def __init__(self, count: int) -> None:
        self.count = count
        tag = f"{PREFIX}{os.getpid()}"
        self.bridge = f"{tag}br"
        self.names = [f"{tag}n{i}" for i in range(count)]
        self.links = [f"{tag}v{i}" for i in range(count)]  # root-side end of each veth
        self.subnet = ""
        self.hosts: list[str] = []
        self.gateway = ""
        self.cut_now: set[int] = set()

    def start(self) -> Namespaces:
        remove_stale()
        self.subnet = _free_subnet()
        self.gateway = f"{self.subnet}.1"
        self.hosts = [f"{self.subnet}.{11 + i}" for i in range(self.count)]
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, (ns, link) in enumerate(zip(self.names, self.links, strict=True)):
                peer = f"{link}p"
                _ip("netns", "add", ns)
                _ip("link", "add", link, "type", "veth", "peer", "name", peer)
                _ip("link", "set", peer, "netns", ns)
                _ip("link", "set", link, "master", self.bridge)
                _ip("link", "set", link, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "link", "set", peer, "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.hosts[i]}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise
        log.info("network namespaces %s on bridge %s (%s.0/24)", self.names, self.bridge,
                 self.subnet)
        return self

    def launcher(self, i: int) -> list[str]:
        """The command prefix that runs a program inside host ``i``'s namespace."""
        return ["ip", "netns", "exec", self.names[i]]

    def cut(self, i: int) -> None:
        """Host ``i`` loses its link: every packet to or from it is dropped from now on
        (open connections stay open on both sides; nothing is reset)."""
        _ip("link", "set", self.links[i], "down")
        self.cut_now.add(i)
        log.info("cut the link of host %d (%s)", i, self.hosts[i])

    def heal(self, i: int) -> None:
        _ip("link", "set", self.links[i], "up")
        self.cut_now.discard(i)
        log.info("restored the link of host %d (%s)", i, self.hosts[i])

    def close(self) -> None:
        for ns in self.names:
            _ip("netns", "del", ns, check=False)
        for link in self.links:
            _ip("link", "del", link, check=False)
        with contextlib.suppress(Exception):
            _ip("link", "del", self.bridge, check=False)
        self.cut_now.clear()

    def __enter__(self) -> Namespaces:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
