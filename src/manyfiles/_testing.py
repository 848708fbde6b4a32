"""Test-only knobs, in one place.  Production code never reads them from the environment.

A knob is a module attribute here with a production default.  Library code reads the
attribute (``from manyfiles import _testing; if _testing.KNOB: ...``); tests set it:

* in the test process::

      from manyfiles import _testing
      with _testing.override(fake_dtype=0):     # restored on exit
          ...

* in a real subprocess (the CLI under test), through this module's launcher::

      python -m manyfiles._testing fake_dtype=0 -- fastls -r /data

  which sets the knobs, then runs the named console script with the remaining arguments
  (values are Python literals: ``0``, ``None``, ``'text'``); ``-- -c CODE`` runs Python code
  instead, e.g. to check what the library sees.

Knobs:
    fake_dtype: ``None`` (production), or a value every ``d_type`` reads as in the C core:
        ``0`` (DT_UNKNOWN) behaves as sshfs, NFSv3 READDIR and XFS ``ftype=0`` do, so the
        fstatat fallback is exercised on any filesystem; an out-of-range value (e.g. 200)
        exercises the guard against garbage d_type values.

Adding one: a module attribute with its production default, a line in the list above, and,
when the knob must reach C or another layer when it changes, an entry in ``_APPLY``.
"""

from __future__ import annotations

import ast
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

fake_dtype: int | None = None


def _apply_fake_dtype(value: int | None) -> None:
    try:
        from manyfiles import _dents
    except ImportError:  # no C core: nothing to fake
        return
    _dents._set_fake_dtype(-1 if value is None else int(value))


# knob name -> what else must happen when it changes (besides the attribute)
_APPLY: dict[str, Callable[[Any], None]] = {"fake_dtype": _apply_fake_dtype}
_DEFAULTS = {"fake_dtype": None}


def knobs() -> dict[str, Any]:
    """Current value of every knob."""
    return {name: globals()[name] for name in _DEFAULTS}


def set_knobs(**values: Any) -> None:
    """Set knobs by name (an unknown name is a TypeError)."""
    for name, value in values.items():
        if name not in _DEFAULTS:
            raise TypeError(f"unknown test knob {name!r}; known: {', '.join(sorted(_DEFAULTS))}")
        globals()[name] = value
        if name in _APPLY:
            _APPLY[name](value)


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Set knobs for the duration of a ``with`` block."""
    saved = {name: globals()[name] for name in values if name in _DEFAULTS}
    set_knobs(**values)
    try:
        yield
    finally:
        set_knobs(**saved)


def main(argv: list[str] | None = None) -> None:
    """``python -m manyfiles._testing KNOB=VALUE ... -- SCRIPT ARGS...``"""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        raise SystemExit("usage: python -m manyfiles._testing KNOB=VALUE ... -- SCRIPT [ARGS...]")
    split = args.index("--")
    settings, (script, *rest) = args[:split], args[split + 1 :]
    for item in settings:
        name, _, text = item.partition("=")
        set_knobs(**{name: ast.literal_eval(text)})
    if script == "-c":
        sys.argv = ["-c", *rest[1:]]
        exec(compile(rest[0], "<string>", "exec"), {"__name__": "__main__"})
        return
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="console_scripts") if e.name == script]
    sys.argv = [script, *rest]
    entry.load()()


if __name__ == "__main__":
    # run as a script this file is `__main__`: set the knobs on the module the library imports
    from manyfiles._testing import main as _main

    _main()
