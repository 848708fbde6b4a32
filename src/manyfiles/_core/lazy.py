"""Lazy re-exports for a package's ``__init__``: a name is imported on first use, then cached.

Kept to ``importlib`` alone (no ``typing``).  ``manyfiles/__init__`` writes the same pair out:
this module would be one more import in every fastls start-up (~0.25 ms).
"""

from __future__ import annotations

import importlib


def lazy_exports(namespace: dict[str, object], exports: dict[str, str]) -> tuple:
    """The ``(__getattr__, __dir__)`` pair for a package whose public names load on first use.

    ``namespace`` is the package's ``globals()``; ``exports`` maps each public name to the module
    defining it (absolute, or relative to the package: ``".executor"``).  The public list
    (``__all__``) is the caller's; ``__dir__`` returns it.
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return namespace["__all__"]

    return __getattr__, __dir__
