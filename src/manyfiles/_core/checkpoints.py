"""Named checkpoints: the moments of a long operation where an observer may act.

A tool marks a moment with ``reached("move")`` (shard: right after a rename), ``reached("tree")``,
``reached("command")`` (every command, once its options are parsed, before any work)...; the
moments are listed in docs/architecture.md.  Nothing in manyfiles registers a hook, so in
production ``reached`` is one global load and an empty-dict test (the shard apply loop calls it
once per file).  The crash-safety tests register hooks that SIGKILL or hold the process at an
exact moment (tests/faults.py, in-process or through its launcher for a real CLI); the library
does not know about them.

Example:
    >>> seen = []
    >>> add("move", lambda *context: seen.append(context))
    >>> reached("move"); reached("mkdir")
    >>> remove("move"); reached("move")
    >>> seen
    [()]
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: fastls' click-free start imports this module (typing costs ~10 ms)
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["add", "reached", "remove"]

#: point -> its hooks, in the order added; empty in production.
_hooks: dict[str, list[Callable[..., None]]] = {}


def reached(point: str, context: tuple = ()) -> None:
    """Call the hooks of ``point`` with ``*context`` (what the point says about the moment, e.g.
    the journal's ``(fd, record)`` about to be written); a no-op when none is added."""
    if _hooks:
        for hook in _hooks.get(point, ()):
            hook(*context)


def add(point: str, hook: Callable[..., None]) -> None:
    """Call ``hook(*context)`` each time ``point`` is reached in this process, from then on."""
    _hooks.setdefault(point, []).append(hook)


def remove(point: str) -> None:
    """Forget every hook of ``point``."""
    _hooks.pop(point, None)
