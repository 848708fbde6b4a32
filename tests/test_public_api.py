"""The public API, pinned (issue 19): names and signatures of ``manyfiles`` and its public packages.

A move inside the package (issue 19's layout) must leave every name a user imports where it was,
with the same call signature.  ``public_api.json`` is the snapshot, taken from main before the
move; this test computes the same description from the installed code and compares.

What counts as public, per module: ``__all__`` where the module defines one, else its names
without a leading underscore that are defined in manyfiles (a class or function whose
``__module__`` is that module or below it) or are plain values (constants); imported helpers
(``os``, ``ProgressArg``) are not part of a module's API.  Each name is described by kind and, for
callables, ``inspect.signature``; a class also by the signatures of its public methods.

A deliberate API change regenerates the snapshot (and says so in the commit)::

    .venv/bin/python tests/test_public_api.py --update
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
import types
from pathlib import Path

import pytest

SNAPSHOT = Path(__file__).with_name("public_api.json")

# the import paths users use (README, docs/, notebooks/): the package, its subpackages, and the
# top-level modules the docs name
MODULES = (
    "manyfiles",
    "manyfiles.cache",
    "manyfiles.errors",
    "manyfiles.fastls",
    "manyfiles.iotrace",
    "manyfiles.listing",
    "manyfiles.ml",
    "manyfiles.mirror",
    "manyfiles.profiling",
    "manyfiles.push",
    "manyfiles.remove",
    "manyfiles.s3",
    "manyfiles.scale",
    "manyfiles.shard",
    "manyfiles.table",
    "manyfiles.trace",
)

_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _signature(obj: object) -> str:
    try:
        return _ADDRESS.sub("", str(inspect.signature(obj)))
    except (TypeError, ValueError):  # a builtin without a text signature
        return "(?)"


def _defined_in(obj: object, module: str) -> bool:
    """Whether a name is this module's own (not an import of a stdlib or helper name)."""
    home = getattr(obj, "__module__", None)
    if not isinstance(home, str) or isinstance(obj, (str, bytes, int, float, tuple, frozenset, dict)):
        return True  # a constant: no __module__ of its own
    return home == module or home.startswith(module + ".")


def public_names(module: types.ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is not None:
        return sorted(names)
    return sorted(n for n, v in vars(module).items()
                  if not n.startswith("_") and n != "TYPE_CHECKING" and not isinstance(v, types.ModuleType)
                  and _defined_in(v, module.__name__))


def describe(obj: object) -> object:
    if isinstance(obj, types.ModuleType):
        return "module"
    if isinstance(obj, type):
        methods = {}
        for name, member in sorted(vars(obj).items()):
            if name.startswith("_") and name != "__init__":
                continue
            if isinstance(member, (staticmethod, classmethod)):
                methods[name] = _signature(member.__func__)
            elif isinstance(member, property):
                methods[name] = "property"
            elif inspect.isfunction(member):
                methods[name] = _signature(member)
        return {"class": _signature(obj), "methods": methods}
    if callable(obj):
        return {"callable": _signature(obj)}
    return {"value": type(obj).__name__}


def snapshot() -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name in MODULES:
        module = importlib.import_module(name)
        out[name] = {attr: describe(getattr(module, attr)) for attr in public_names(module)}
    return out


@pytest.mark.parametrize("module", MODULES)
def test_public_api_is_unchanged(module: str) -> None:
    pinned = json.loads(SNAPSHOT.read_text())[module]
    now = snapshot_of(module)
    missing = sorted(set(pinned) - set(now))
    added = sorted(set(now) - set(pinned))
    changed = {n: (pinned[n], now[n]) for n in sorted(set(pinned) & set(now)) if pinned[n] != now[n]}
    assert not (missing or added or changed), (
        f"{module}: public API changed (if deliberate: python tests/test_public_api.py --update)\n"
        f"  gone: {missing}\n  new: {added}\n  changed: {json.dumps(changed, indent=1)}")


def snapshot_of(name: str) -> dict[str, object]:
    module = importlib.import_module(name)
    return {attr: describe(getattr(module, attr)) for attr in public_names(module)}


def test_every_pinned_module_is_in_the_snapshot() -> None:
    assert sorted(json.loads(SNAPSHOT.read_text())) == sorted(MODULES)


def test_the_pin_sees_a_renamed_export_and_a_changed_signature(monkeypatch) -> None:
    """The comparison itself: a renamed export and a new parameter both show up."""
    import manyfiles.shard as shard

    before = snapshot_of("manyfiles.shard")
    monkeypatch.setattr(shard, "__all__", [("apply_all" if n == "apply" else n) for n in shard.__all__])
    monkeypatch.setattr(shard, "apply_all", shard.apply, raising=False)
    renamed = snapshot_of("manyfiles.shard")
    assert "apply" in before and "apply" not in renamed and "apply_all" in renamed

    def plan(path, layout=None, *, workers=4, extra=1): ...
    monkeypatch.setattr(shard, "plan", plan)
    assert snapshot_of("manyfiles.shard")["plan"] != before["plan"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_public_api.py --update")
    SNAPSHOT.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
