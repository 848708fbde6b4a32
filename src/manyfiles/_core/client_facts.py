"""What a client process learned that the worker processes running its shards should know too.

A module shares a fact once (:func:`share`: its name, how to collect it on the client, how a
worker adopts it); the cluster executor sends :func:`collect`'s snapshot with every shard it
submits, and the worker :func:`adopt`\\ s it before the shard runs.  The one fact today: the
endpoints that answered the client (:func:`manyfiles.s3.retry.answered`).  A worker whose first
request to such an endpoint fails is then in an outage, ridden out for the stall timeout, and not
in a first contact with an endpoint that was never there (half of it): whether a worker happened
to reach S3 before a cut no longer decides how the job ends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

_SHARED: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {}
_WAITING: dict[str, Any] = {}       # adopted before the module that shares them was imported here


def share(name: str, collect: Callable[[], Any], adopt: Callable[[Any], None]) -> None:
    """Send ``collect()`` (a picklable value) with every shard; a worker calls ``adopt(value)``."""
    _SHARED[name] = (collect, adopt)
    if name in _WAITING:
        adopt(_WAITING.pop(name))


def collect() -> dict[str, Any]:
    """Every shared fact, as this process knows it now."""
    return {name: get() for name, (get, _) in _SHARED.items()}


def adopt(facts: Mapping[str, Any]) -> None:
    """Learn what the client knew (on a worker, before a shard of its job runs)."""
    for name, value in facts.items():
        if name in _SHARED:
            _SHARED[name][1](value)
        else:
            _WAITING[name] = value


__all__ = ["adopt", "collect", "share"]
