"""A real network filesystem over loopback: sshfs (FUSE + SFTP) against a private sshd.

There is no kernel NFS client here, but FUSE works, and sshfs behaves like the mounts our users
list: every readdir batch is a round trip, and a warm listing reports every entry as DT_UNKNOWN
with inode 0xffffffff (libfuse's FUSE_UNKNOWN_INO), which is also our real-world DT_UNKNOWN source.

Library use (benchmarks import it as ``from _sshfs import sshfs_mount``)::

    with sshfs_mount("/work/bench-data/x") as mnt:     # mnt: pathlib.Path of the mount
        os.listdir(mnt)                                 # warm after the first listing
        remount(mnt)                                    # "freshly mounted": new sshfs, empty caches

    with sshfs_mount(src, latency_ms=2) as mnt: ...     # optional per-direction delay (TCP proxy)

Command line (the mount outlives the command; state is kept under /tmp/mf-sshfs/)::

    python benchmarks/_sshfs.py up DIR MNT [--latency-ms MS]
    python benchmarks/_sshfs.py down DIR MNT

What it does: installs Debian ``openssh-server`` and ``sshfs`` with apt-get if missing (root
needed), generates a host key and a client key in a scratch directory, runs ``sshd -D`` on
127.0.0.1 on a free port with a private config (root login by key only, internal-sftp), and
mounts ``sshfs -p PORT root@127.0.0.1:DIR MNT``; unmounting is ``fusermount -u``.  Each mount
has its own sshd, so mounts are independent.  ``tc netem`` does not exist on this kernel, so
latency comes from a small user-space TCP proxy (``python _sshfs.py proxy ...``) between sshfs
and sshd that delays every chunk by ``latency_ms`` in each direction.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

STATE_DIR = Path("/tmp/mf-sshfs")
SSHD = "/usr/sbin/sshd"

_SSHD_CONFIG = """\
ListenAddress 127.0.0.1
Port {port}
HostKey {scratch}/host_key
PidFile {scratch}/sshd.pid
AuthorizedKeysFile {scratch}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
LogLevel ERROR
Subsystem sftp internal-sftp
"""


def ensure_installed() -> None:
    """Install openssh-server and sshfs with apt-get unless both are present."""
    if shutil.which("sshfs") and os.path.exists(SSHD) and shutil.which("ssh-keygen"):
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", "openssh-server", "sshfs"], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    for _ in range(100):  # reap if it is our child, else wait for it to vanish
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
            if done:
                return
        except ChildProcessError:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.02)


@dataclass
class SshServer:
    """A private sshd on 127.0.0.1 (plus the optional delay proxy in front of it)."""

    scratch: Path
    port: int                      # what clients connect to (the proxy's port if there is one)
    sshd_pid: int
    proxy_pid: int | None = None

    @property
    def client_key(self) -> Path:
        return self.scratch / "client_key"

    @classmethod
    def start(cls, latency_ms: float = 0.0) -> SshServer:
        ensure_installed()
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)   # sshd's privilege-separation dir
        scratch = Path(tempfile.mkdtemp(prefix="mf-sshd-"))
        for key in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(scratch / key)],
                           check=True, stdout=subprocess.DEVNULL)
        shutil.copy(scratch / "client_key.pub", scratch / "authorized_keys")
        port = _free_port()
        (scratch / "sshd_config").write_text(_SSHD_CONFIG.format(port=port, scratch=scratch))
        # New session: the server survives the `up` command and ignores the caller's Ctrl-C.
        log = open(scratch / "sshd.log", "wb")   # noqa: SIM115 - handed to the child
        sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(scratch / "sshd_config")],
                                stdout=log, stderr=log, start_new_session=True)
        log.close()
        server = cls(scratch, port, sshd.pid)
        try:
            _wait_port(port, sshd)
            if latency_ms > 0:
                listen = _free_port()
                proxy = subprocess.Popen([sys.executable, __file__, "proxy", str(listen), str(port),
                                          str(latency_ms)], start_new_session=True)
                server.proxy_pid = proxy.pid
                _wait_port(listen, proxy)
                server.port = listen
        except BaseException:
            server.stop()
            raise
        return server

    def stop(self) -> None:
        if self.proxy_pid:
            _kill(self.proxy_pid)
        _kill(self.sshd_pid)
        shutil.rmtree(self.scratch, ignore_errors=True)


@dataclass
class SshfsMount:
    """``remote_dir`` served by ``server`` and mounted with sshfs at ``path``."""

    remote_dir: Path
    path: Path
    server: SshServer
    options: tuple[str, ...] = ()
    own_mountpoint: bool = field(default=False, repr=False)

    def mount(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        opts = ",".join((f"IdentityFile={self.server.client_key}", "StrictHostKeyChecking=no",
                         "UserKnownHostsFile=/dev/null", "BatchMode=yes", "LogLevel=ERROR", *self.options))
        subprocess.run(["sshfs", "-p", str(self.server.port), "-o", opts,
                        f"root@127.0.0.1:{self.remote_dir}", str(self.path)], check=True)
        if not os.path.ismount(self.path):
            raise RuntimeError(f"sshfs did not mount {self.path}")

    def unmount(self) -> None:
        if not os.path.ismount(self.path):
            return
        # A killed reader can keep the mount busy for a moment: fall back to a lazy unmount.
        if subprocess.run(["fusermount", "-u", str(self.path)], stderr=subprocess.DEVNULL).returncode:
            subprocess.run(["fusermount", "-u", "-z", str(self.path)], check=True)

    def remount(self) -> None:
        """Unmount and mount again: a new sshfs process with empty caches ("freshly mounted")."""
        self.unmount()
        self.mount()


_ACTIVE: dict[Path, SshfsMount] = {}


@contextlib.contextmanager
def sshfs_mount(remote_dir: str | os.PathLike, mountpoint: str | os.PathLike | None = None, *,
                latency_ms: float = 0.0, options: tuple[str, ...] = ()) -> Iterator[Path]:
    """Mount ``remote_dir`` over sshfs (own sshd on loopback); yield the mount path; clean up.

    ``mountpoint`` defaults to a fresh temporary directory.  ``latency_ms`` > 0 puts a delay
    proxy between sshfs and sshd (added in each direction).  ``options`` are extra sshfs ``-o``
    options such as ``"dir_cache=no"``.  Call :func:`remount` on the yielded path for a cold mount.
    """
    remote = Path(remote_dir).resolve()
    own = mountpoint is None
    path = Path(tempfile.mkdtemp(prefix="mf-sshfs-mnt-")) if own else Path(mountpoint).resolve()
    server = SshServer.start(latency_ms)
    m = SshfsMount(remote, path, server, tuple(options), own)
    try:
        m.mount()
        _ACTIVE[path] = m
        yield path
    finally:
        _ACTIVE.pop(path, None)
        try:
            m.unmount()
        finally:
            server.stop()
            if own:
                with contextlib.suppress(OSError):
                    path.rmdir()


def remount(path: str | os.PathLike) -> None:
    """Remount a path yielded by :func:`sshfs_mount` (new sshfs process, cold client caches)."""
    _ACTIVE[Path(path).resolve()].remount()


# -- command line: up / down keep state in STATE_DIR so the mount outlives the command -----------

def _state_file(mnt: Path) -> Path:
    return STATE_DIR / (hashlib.sha1(str(mnt).encode()).hexdigest()[:16] + ".json")


def up(remote_dir: str, mnt: str, latency_ms: float = 0.0) -> Path:
    remote, path = Path(remote_dir).resolve(), Path(mnt).resolve()
    if os.path.ismount(path):
        raise SystemExit(f"_sshfs.py: {path}: already a mount point")
    server = SshServer.start(latency_ms)
    try:
        SshfsMount(remote, path, server).mount()
    except BaseException:
        server.stop()
        raise
    STATE_DIR.mkdir(exist_ok=True)
    _state_file(path).write_text(json.dumps({"remote": str(remote), "scratch": str(server.scratch),
                                             "port": server.port, "sshd_pid": server.sshd_pid,
                                             "proxy_pid": server.proxy_pid}))
    return path


def down(remote_dir: str, mnt: str) -> None:
    path = Path(mnt).resolve()
    state_file = _state_file(path)
    if not state_file.exists():
        raise SystemExit(f"_sshfs.py: {path}: not mounted by _sshfs.py up")
    st = json.loads(state_file.read_text())
    server = SshServer(Path(st["scratch"]), st["port"], st["sshd_pid"], st["proxy_pid"])
    SshfsMount(Path(st["remote"]), path, server).unmount()
    server.stop()
    state_file.unlink()


# -- the delay proxy --------------------------------------------------------------------------

def proxy(listen_port: int, target_port: int, latency_ms: float) -> None:
    """Forward 127.0.0.1:listen_port -> target_port, delaying each chunk ``latency_ms`` each way."""
    import asyncio

    delay = latency_ms / 1000.0

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        # Chunks are released in arrival order: deadlines grow monotonically with arrival time.
        try:
            while data := await reader.read(1 << 16):
                loop.call_at(loop.time() + delay, writer.write, data)
                if writer.transport.get_write_buffer_size() > (8 << 20):
                    await writer.drain()
            await asyncio.sleep(delay)
        finally:
            writer.close()

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pump(cr, sw), pump(sr, cw), return_exceptions=True)

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="_sshfs.py", description="sshfs over loopback for benchmarks")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("up", "down"):
        sp = sub.add_parser(name)
        sp.add_argument("dir")
        sp.add_argument("mnt")
        if name == "up":
            sp.add_argument("--latency-ms", type=float, default=0.0)
    sp = sub.add_parser("proxy", help="internal: the TCP delay proxy")
    sp.add_argument("listen_port", type=int)
    sp.add_argument("target_port", type=int)
    sp.add_argument("latency_ms", type=float)
    a = p.parse_args(argv)
    if a.cmd == "up":
        print(up(a.dir, a.mnt, a.latency_ms))
    elif a.cmd == "down":
        down(a.dir, a.mnt)
    else:
        proxy(a.listen_port, a.target_port, a.latency_ms)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
