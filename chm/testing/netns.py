"""Network namespaces joined by veth pairs, made and removed by a test.

    with Network(["redis", "node", "worker"]) as net:
        net.host("node")                 # "10.123.0.2": its address on the link
        net.prefix("node")               # ["ip", "netns", "exec", "chm…-node"]
        subprocess.run([*net.prefix("worker"), sys.executable, "-c", ...])

Each host is its own namespace with a veth pair to a hub namespace holding
a bridge, so the hosts talk over real links (their own TCP stacks, routes
and addresses) and the root namespace is left as it was. Names carry this
process's id, so tests in parallel do not collide; :meth:`close` (and a
failed setup) removes everything made.

Needs ``ip`` (iproute2) and CAP_SYS_ADMIN / CAP_NET_ADMIN.
:func:`unavailable` says why namespaces cannot be made here; with
``fallback=True`` a :class:`Network` then runs every host on loopback
(``127.0.0.1``, no prefix) and sets ``reason``, which a test must report.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Sequence

from chm.errors import ChmError, InvalidArgument

__all__ = ["Network", "unavailable"]

_seq = itertools.count()
_probe: list[str | None] = []


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=False)
    if check and r.returncode != 0:
        raise ChmError(None, f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if _probe:
        return _probe[0]
    why: str | None = None
    if shutil.which("ip") is None:
        why = "no ip command (iproute2)"
    else:
        name = f"chmprobe{os.getpid()}"
        r = _ip("netns", "add", name, check=False)
        if r.returncode != 0:
            why = f"ip netns add: {r.stderr.strip() or r.returncode}"
        else:
            r = _ip(
                "-n", name, "link", "add", "p0", "type", "veth", "peer", "name", "p1", check=False
            )
            if r.returncode != 0:
                why = f"ip link add veth: {r.stderr.strip()}"
            _ip("netns", "del", name, check=False)
    _probe.append(why)
    return why


class Network:
    """Hosts in their own namespaces on one bridged link (module docstring)."""

    def __init__(self, hosts: Sequence[str], *, fallback: bool = False) -> None:
        if not hosts or len(set(hosts)) != len(hosts) or len(hosts) > 200:
            raise InvalidArgument(
                None, f"Network: hosts {list(hosts)!r} must be 1..200 distinct names"
            )
        self.hosts = list(hosts)
        self.reason = unavailable()
        if self.reason is not None and not fallback:
            raise ChmError(None, f"network namespaces are unavailable: {self.reason}")
        self.tag = f"chm{os.getpid() % 100000}x{next(_seq)}"
        self._made: list[str] = []
        self._addr = {h: f"10.123.0.{i + 2}" for i, h in enumerate(self.hosts)}

    @property
    def loopback(self) -> bool:
        """True when the hosts share loopback (namespaces unavailable)."""
        return self.reason is not None

    def ns(self, host: str) -> str:
        return f"{self.tag}-{self.hosts.index(host)}"

    def host(self, host: str) -> str:
        """The host's address (127.0.0.1 on the loopback fallback)."""
        if host not in self._addr:
            raise InvalidArgument(None, f"no host {host!r} in this network")
        return "127.0.0.1" if self.loopback else self._addr[host]

    def prefix(self, host: str) -> list[str]:
        """argv words that run a command on ``host``."""
        self.host(host)
        return [] if self.loopback else ["ip", "netns", "exec", self.ns(host)]

    def start(self) -> Network:
        if self.loopback:
            return self
        try:
            hub = f"{self.tag}-hub"
            _ip("netns", "add", hub)
            self._made.append(hub)
            _ip("-n", hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", hub, "link", "set", "br0", "up")
            for i, h in enumerate(self.hosts):
                ns = self.ns(h)
                _ip("netns", "add", ns)
                self._made.append(ns)
                _ip(
                    "-n",
                    hub,
                    "link",
                    "add",
                    f"v{i}",
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    ns,
                )
                _ip("-n", hub, "link", "set", f"v{i}", "master", "br0")
                _ip("-n", hub, "link", "set", f"v{i}", "up")
                _ip("-n", ns, "addr", "add", f"{self._addr[h]}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Removes every namespace made (their veth pairs go with them)."""
        while self._made:
            _ip("netns", "del", self._made.pop(), check=False)

    def __enter__(self) -> Network:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
