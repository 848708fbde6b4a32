"""Receiving a large body into a file, three ways, on loopback TCP: the receiving thread's CPU per GiB.

* ``recv+pwrite``: ``recv_into`` a reusable 1 MiB buffer, then ``pwrite`` it (s3pull's and the
  cache's path before issue 27; two copies: socket -> buffer -> page cache);
* ``recv->mmap``: ``recv_into`` a writable shared mapping of the preallocated file, a 16 MiB window
  at a time (one copy, but every new page is faulted in and zeroed first);
* ``splice``: socket -> pipe -> file in the kernel (``os.splice``), then the bytes read back through
  a read-only mapping of the file (one copy; what issue 27 kept).

Each way also CRC32s what it received (from the buffer, or from the file's pages), as a check would.
A sender thread in the same process writes random bytes; only the receiving thread's CPU
(``time.thread_time``) is counted.  Rounds interleave the ways; medians are printed.

    flock /work/bench.lock .venv/bin/python benchmarks/receive.py --size 256M --repeat 7
"""

from __future__ import annotations

import argparse
import fcntl
import mmap
import os
import socket
import statistics
import tempfile
import threading
import time
import zlib

CHUNK = 1 << 20
WINDOW = 16 << 20
WAYS = ("recv+pwrite", "recv->mmap", "splice")


def _send(listener: socket.socket, size: int) -> None:
    conn, _ = listener.accept()
    block = os.urandom(4 << 20)
    sent = 0
    while sent < size:
        conn.sendall(block[: min(len(block), size - sent)])
        sent += min(len(block), size - sent)
    conn.close()


def receive(way: str, size: int, folder: str) -> tuple[float, float]:
    """(MiB/s, receiving thread's CPU seconds per GiB) of one body of ``size`` bytes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    sender = threading.Thread(target=_send, args=(listener, size))
    sender.start()
    sock = socket.create_connection(listener.getsockname())
    fd, path = tempfile.mkstemp(dir=folder)
    os.posix_fallocate(fd, 0, size)
    cpu0, t0 = time.thread_time(), time.monotonic()
    n = crc = 0
    if way == "recv+pwrite":
        view = memoryview(bytearray(CHUNK))
        while n < size:
            got = sock.recv_into(view, min(CHUNK, size - n), socket.MSG_WAITALL)
            os.pwrite(fd, view[:got], n)
            crc = zlib.crc32(view[:got], crc)
            n += got
    elif way == "recv->mmap":
        while n < size:
            w = min(WINDOW, size - n)
            with mmap.mmap(fd, w, offset=n) as m:
                view, k = memoryview(m), 0
                while k < w:
                    got = sock.recv_into(view[k:], min(CHUNK, w - k), socket.MSG_WAITALL)
                    crc = zlib.crc32(view[k:k + got], crc)
                    k += got
                view.release()
            n += w
    else:
        out, into = os.pipe()
        fcntl.fcntl(into, getattr(fcntl, "F_SETPIPE_SZ", 1031), CHUNK)
        m = view = None
        base = 0
        while n < size:
            if n - base >= WINDOW or m is None:
                if m is not None:
                    view.release()
                    m.close()
                base = n
                m = mmap.mmap(fd, min(WINDOW, size - n), prot=mmap.PROT_READ, offset=n)
                view = memoryview(m)
            got = os.splice(sock.fileno(), into, min(CHUNK, base + len(view) - n))
            k = 0
            while k < got:
                k += os.splice(out, fd, got - k, offset_dst=n + k)
            crc = zlib.crc32(view[n - base:n - base + got], crc)
            n += got
        view.release()
        m.close()
        os.close(out)
        os.close(into)
    cpu, secs = time.thread_time() - cpu0, time.monotonic() - t0
    sender.join()
    sock.close()
    listener.close()
    os.close(fd)
    os.unlink(path)
    return size / secs / (1 << 20), cpu / (size / (1 << 30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="256M", help="bytes per body (K/M/G suffixes)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--dir", default=None, help="where the files go (default: the temp folder)")
    args = ap.parse_args()
    size = int(args.size[:-1]) << {"K": 10, "M": 20, "G": 30}[args.size[-1]] if args.size[-1] in "KMG" \
        else int(args.size)
    runs: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    for _ in range(args.repeat):
        for way in WAYS:
            runs[way].append(receive(way, size, args.dir or tempfile.gettempdir()))
    print(f"load average {os.getloadavg()[0]:.1f}; {args.size} per body, median of {args.repeat}")
    print("| way | MiB/s | receiving thread CPU s / GiB | per round |")
    print("|---|---:|---:|---|")
    for way, got in runs.items():
        per = ", ".join(f"{c:.2f}" for _, c in got)
        print(f"| {way} | {statistics.median(r for r, _ in got):.0f} | "
              f"{statistics.median(c for _, c in got):.2f} | {per} |")


if __name__ == "__main__":
    main()
