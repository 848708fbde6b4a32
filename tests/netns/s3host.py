"""The S3 host of the multi-host tests: moto's server on ``IP:PORT`` (run in its namespace with
``ip netns exec``), driven by the test through stdin/stdout (the test process has no address in
the lab).  One JSON command per line, one JSON answer per line:

* ``{"seed": BUCKET, "objects": {key: [size, seed]}}`` -> ``{"ok": n}``: the bucket created and
  filled through moto's own backend (no HTTP: thousands of objects in a fraction of a second);
  the bytes are ``blob(size, seed)`` (tests/s3/s3util.py);
* ``{"inventory": BUCKET}`` -> ``{key: md5 hex}`` of the bytes moto holds;
* ``{"requests": true}`` -> ``{client address: requests served}`` (who talks to S3, and when it stopped);
* ``{"delay": BUCKET, "seconds": S, "from": ADDRESS or null}`` -> ``{"ok": 1}``: from now on, every
  GET of an object of BUCKET (from ADDRESS only, if given) is answered S seconds late (a slow store,
  so that a job is still running when a fault comes; 0 removes the delay).
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "s3"))

ACCOUNT = "123456789012"


def main(ip: str, port: int) -> None:
    import logging

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from moto.s3.models import s3_backends
    from s3util import blob
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    served: Counter[str] = Counter()
    lock = threading.Lock()
    app = DomainDispatcherApplication(create_backend_app)

    delays: dict[tuple[str, str | None], float] = {}

    def counting(environ, start_response):
        peer = environ.get("REMOTE_ADDR", "?")
        with lock:
            served[peer] += 1
        listing = "list-type" in environ.get("QUERY_STRING", "")
        if delays and environ.get("REQUEST_METHOD") == "GET" and not listing:
            bucket = environ.get("PATH_INFO", "").lstrip("/").split("/", 1)[0]
            wait = delays.get((bucket, peer), delays.get((bucket, None), 0.0))
            if wait:
                time.sleep(wait)
        return app(environ, start_response)

    server = make_server(ip, port, counting, True, request_handler=MotoRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    backend = s3_backends[ACCOUNT]["global"]
    print(json.dumps({"ready": f"http://{ip}:{port}"}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            answer = _answer(cmd, backend, served, lock, blob, delays)
        except Exception as exc:          # the test reads it as a failure of its command
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
    server.shutdown()


def _answer(cmd: dict, backend, served: Counter, lock: threading.Lock, blob, delays: dict) -> dict:
    if "seed" in cmd:
        backend.create_bucket(cmd["seed"], "us-east-1")
        for key, (size, seed) in cmd["objects"].items():
            backend.put_object(cmd["seed"], key, blob(size, seed))
        return {"ok": len(cmd["objects"])}
    if "inventory" in cmd:
        bucket = backend.get_bucket(cmd["inventory"])
        return {k: hashlib.md5(v.value).hexdigest() for k, v in bucket.keys.items()}
    if "delay" in cmd:
        delays[(cmd["delay"], cmd.get("from"))] = float(cmd["seconds"])
        return {"ok": 1}
    if "requests" in cmd:
        with lock:
            return dict(served)
    return {"error": f"unknown command {cmd!r}"}


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
