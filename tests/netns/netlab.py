"""Simulated hosts for the multi-host tests: Linux network namespaces joined by veth pairs and a bridge.

A :class:`Lab` is a bridge in a namespace of its own (``mfnet-<pid>-<tag>-br``) and hosts, each a
namespace (``mfnet-<pid>-<tag>-<name>``) with one veth (``eth0``) whose peer is a port of the
bridge; every address (``10.90.0.0/16``) exists only on those veths, so the processes a host runs
(``ip netns exec``) talk to each other and to nothing else.  Everything is removed by
:meth:`Lab.close`, and namespaces of earlier sessions whose process is gone by :func:`sweep`.

Faults (see docs/scale-out.md, "Faults"; measured here: no iptables, nft or netem):

* :meth:`Host.link` down/up: the bridge side of the host's veth (its sockets see "No route to
  host" within a few seconds);
* :meth:`Host.drop` / :meth:`Host.undrop`: a silent drop toward some peers (packets vanish,
  connections hang): a permanent neighbour entry in the host's namespace to a MAC that does not
  exist, for each peer address;
* processes are killed by their pid (``ip netns exec`` execs the command: same pid).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path

PREFIX = "mfnet"
NET = "10.90"                      # the lab's /16: hosts get 10.90.<n // 250>.<n % 250 + 2>
BOGUS_MAC = "02:00:00:de:ad:01"    # a locally administered MAC that no lab host has
NAME = re.compile(rf"{PREFIX}-(\d+)-")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def missing() -> str | None:
    """What this machine lacks for the lab (one line), None if nothing."""
    if shutil.which("ip") is None:
        return "the multi-host tests need iproute2's `ip` (apt-get install iproute2)"
    if os.geteuid() != 0:
        return "the multi-host tests need root (network namespaces: `ip netns add`)"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode:
        return f"the multi-host tests need `ip netns add` to work: {made.stderr.strip()}"
    try:
        veth = _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1", check=False)
        bridge = _ip("-n", probe, "link", "add", "b0", "type", "bridge", check=False)
    finally:
        _ip("netns", "del", probe, check=False)
    for what, proc in (("veth pairs", veth), ("bridges", bridge)):
        if proc.returncode:
            return f"the multi-host tests need {what} in a network namespace: {proc.stderr.strip()}"
    return None


def _namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_namespace(ns: str) -> None:
    """SIGKILL what still runs in ``ns`` (by pid), then delete it (and its veth ends with it)."""
    pids = _ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", ns, check=False)


def sweep() -> list[str]:
    """Remove the lab namespaces left by test sessions that died (``mfnet-<pid>-...`` whose pid
    is gone): the namespaces removed."""
    stale = [ns for ns in _namespaces()
             if (m := NAME.match(ns)) and not os.path.exists(f"/proc/{m.group(1)}")]   # (we are root)
    for ns in stale:
        _kill_namespace(ns)
    return stale


class Host:
    """One simulated machine: a namespace with one address on the lab's bridge."""

    def __init__(self, lab: Lab, name: str, index: int) -> None:
        self.lab = lab
        self.name = name
        self.ns = f"{lab.tag}-{name}"
        self.ip = f"{NET}.{index // 250}.{index % 250 + 2}"
        self.port = f"v{index}"               # its veth's peer, a port of the bridge
        self.procs: list[subprocess.Popen] = []
        _ip("netns", "add", self.ns)
        lab.namespaces.append(self.ns)
        br = lab.bridge_ns
        _ip("-n", br, "link", "add", self.port, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        _ip("-n", br, "link", "set", self.port, "master", "br0", "up")
        _ip("-n", self.ns, "addr", "add", f"{self.ip}/16", "dev", "eth0")
        _ip("-n", self.ns, "link", "set", "eth0", "up")
        _ip("-n", self.ns, "link", "set", "lo", "up")

    def popen(self, argv: list[str], *, env: dict[str, str] | None = None, log: Path | None = None,
              **kwargs) -> subprocess.Popen:
        """Start ``argv`` on this host (``ip netns exec``: the Popen's pid is the program's)."""
        out = open(log, "ab") if log is not None else subprocess.DEVNULL   # noqa: SIM115 (the child holds it)
        try:
            proc = subprocess.Popen(["ip", "netns", "exec", self.ns, *argv], env=env, stdout=kwargs.pop(
                "stdout", out), stderr=kwargs.pop("stderr", out), start_new_session=True, **kwargs)
        finally:
            if log is not None:
                out.close()
        self.procs.append(proc)
        return proc

    def link(self, up: bool) -> None:
        """The host's cable: its port on the bridge up or down."""
        _ip("-n", self.lab.bridge_ns, "link", "set", self.port, "up" if up else "down")

    def drop(self, peers: Iterable[Host]) -> None:
        """From now on, packets from this host to ``peers`` vanish (and so, with no answer, do
        their connections): each peer's address maps to a MAC that nobody has."""
        for p in peers:
            _ip("-n", self.ns, "neigh", "replace", p.ip, "lladdr", BOGUS_MAC, "nud", "permanent",
                "dev", "eth0")

    def undrop(self, peers: Iterable[Host]) -> None:
        for p in peers:
            _ip("-n", self.ns, "neigh", "del", p.ip, "dev", "eth0", check=False)

    def kill(self) -> None:
        """SIGKILL every process this host started (by pid) and reap them."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


class Lab:
    """A bridge and the hosts plugged into it; :meth:`close` removes all (also after a failure)."""

    def __init__(self, tag: str) -> None:
        self.tag = f"{PREFIX}-{os.getpid()}-{tag}"
        self.bridge_ns = f"{self.tag}-br"
        self.namespaces: list[str] = []
        self.hosts: list[Host] = []
        self._lock = threading.Lock()
        _ip("netns", "add", self.bridge_ns)
        self.namespaces.append(self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge_ns, "link", "set", "br0", "up")

    def host(self, name: str) -> Host:
        with self._lock:          # scenarios add hosts from their own threads
            host = Host(self, name, len(self.hosts))
            self.hosts.append(host)
        return host

    def close(self) -> None:
        for host in self.hosts:
            host.kill()
        for ns in reversed(self.namespaces):
            _kill_namespace(ns)
        self.namespaces.clear()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until(condition, timeout: float, what: str, poll: float = 0.05):
    """Poll ``condition`` until it returns something true (returned); AssertionError after ``timeout``."""
    t0 = time.monotonic()
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(poll)
