"""Import hygiene of src/manyfiles (issues 10, 19): no import circles, no private names across packages,
imports pointing down the layers of docs/architecture.md.

Every module is parsed (ast, nothing is imported) and every import statement counts, at module
level or inside a function (a lazy import is still a dependency).  Imports under
``if TYPE_CHECKING:`` (they never run) count for the circles only (issue 26): a module that needs
another's names to be understood is not independent of it, whether or not the import runs.  The rules:

1. **No circles**: the graph "module A imports module B" has no cycle.  ``from P import x``
   is an edge to ``P.x`` when that is a module, else to ``P``.  Importing ``a.b.c`` also
   initializes ``a`` and ``a.b``; those implicit parent-package edges are not counted (Python
   handles them, and every module would otherwise "import" ``manyfiles/__init__``).
2. **Private names stay in their package.**  A module's package is the directory that holds it
   (``manyfiles.remove._plan`` -> ``manyfiles.remove``; a package's ``__init__`` belongs to the
   package itself).
   * A private *module* (a name component ``_x``: ``manyfiles._core.pool``, ``manyfiles.s3._y``)
     is the internal API of the package holding its first private component: only modules
     inside that package (or its subpackages) may import it.  ``manyfiles._core.pool`` serves
     all of manyfiles; ``manyfiles.s3._y`` serves manyfiles.s3 only.
   * A private *name inside a module* (``_x`` defined in ``manyfiles.listing``: a function,
     class, constant or import) may be used -- ``from M import _x`` or ``M._x`` -- only by
     modules of the same package (``manyfiles.listing._dents`` from ``manyfiles.remove`` was
     the case issue 10 names).
   Dunder names (``__version__``) are public.

Modules owned by branches still at work get an explicit allow-list below, one entry per
offence, each naming its owner; the lead has them fixed.  The test also fails when an
allow-listed offence is gone, so the list only shrinks.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "manyfiles"

# (importer, "what it uses") -> owner of the importer.  Keep sorted; say who fixes it.
ALLOWED_PRIVATE: dict[tuple[str, str], str] = {
}
# a cycle, as test_no_import_circles prints it (rotated to its smallest module) -> owner
ALLOWED_CYCLES: dict[tuple[str, ...], str] = {
}


def module_names() -> dict[str, Path]:
    """Every module of the package: dotted name -> file (C extensions: their .c file)."""
    out: dict[str, Path] = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    for name, source in EXTENSIONS.items():
        if (SRC / source).exists():
            out.setdefault(name, SRC / source)
    return out


# the C extensions, as setup.py builds them: module name -> the source with its init function
EXTENSIONS = {"manyfiles._dents": "manyfiles/listing/_dents.c"}


MODULES = module_names()


def package_of(module: str) -> str:
    """The package a module belongs to (a package's __init__ belongs to itself)."""
    if MODULES[module].name == "__init__.py":
        return module
    return module.rpartition(".")[0]


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class Use:
    """One import or attribute access found in a module."""

    def __init__(self, target: str, name: str | None, line: int) -> None:
        self.target = target  # the manyfiles module imported / accessed
        self.name = name      # the attribute used from it (None: the module itself)
        self.line = line


def _type_checking_blocks(tree: ast.Module) -> set[int]:
    """ids of the statements under ``if TYPE_CHECKING:``."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                skip.update(id(n) for n in ast.walk(stmt))
    return skip


def _resolve_from(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


def uses(module: str, *, type_checking: bool = False) -> Iterator[Use]:
    """Every manyfiles module ``module`` imports, and every attribute it takes from one
    (``type_checking``: also under ``if TYPE_CHECKING:``)."""
    path = MODULES[module]
    if path.suffix != ".py":
        return
    tree = ast.parse(path.read_text(), str(path))
    skip = set() if type_checking else _type_checking_blocks(tree)
    aliases: dict[str, str] = {}  # local name -> manyfiles module (any scope: names rarely clash)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == PACKAGE and a.name in MODULES:
                    yield Use(a.name, None, node.lineno)
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else PACKAGE
        elif isinstance(node, ast.ImportFrom):
            source = _resolve_from(module, node)
            if source.split(".")[0] != PACKAGE:
                continue
            for a in node.names:
                sub = f"{source}.{a.name}"
                if sub in MODULES:
                    yield Use(sub, None, node.lineno)
                    aliases[a.asname or a.name] = sub
                else:
                    yield Use(source, a.name, node.lineno)
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.Attribute):
            continue
        target = _dotted(node.value, aliases)
        if target is None:
            continue
        sub = f"{target}.{node.attr}"
        if sub not in MODULES:  # an attribute of a module (a submodule is an import, seen above)
            yield Use(target, node.attr, node.lineno)


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """The manyfiles module an expression names (``listing``, ``manyfiles.shard.layout``), or None."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        if base is not None and f"{base}.{node.attr}" in MODULES:
            return f"{base}.{node.attr}"
    return None


def private_offences() -> dict[tuple[str, str], str]:
    """(importer, what) -> why, for every use of a private name outside its package."""
    found: dict[tuple[str, str], str] = {}
    for module in MODULES:
        own = package_of(module)
        for use in uses(module):
            parts = use.target.split(".")
            private_at = [i for i, p in enumerate(parts) if is_private(p)]
            home = ".".join(parts[: private_at[0]]) if private_at else ""  # what a private module serves
            if private_at and not (module == home or module.startswith(home + ".")):
                found[(module, use.target)] = f"line {use.line}: private module of {home}"
            if use.name is not None and is_private(use.name):
                if own == package_of(use.target) or use.target == module:
                    continue
                found[(module, f"{use.target}.{use.name}")] = (
                    f"line {use.line}: private name of {use.target} used outside {package_of(use.target)}")
    return found


def import_graph(*, type_checking: bool = True) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for use in uses(module, type_checking=type_checking):
            if use.target != module:
                graph[module].add(use.target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """One representative cycle per strongly connected component with more than one module
    (Tarjan), rotated to start at its smallest name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_one_cycle(sorted(component), graph))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return found


def _one_cycle(component: list[str], graph: dict[str, set[str]]) -> tuple[str, ...]:
    """A shortest cycle through the component's smallest module (breadth-first)."""
    start, members = component[0], set(component)
    paths = {start: (start,)}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return paths[v]
            if w not in paths:
                paths[w] = (*paths[v], w)
                queue.append(w)
    return tuple(component)


def test_the_checker_sees_what_it_must() -> None:
    """The parser itself: known imports, a function-level one, a private name, a C module."""
    assert "manyfiles._dents" in MODULES and "manyfiles.remove" in MODULES
    walker = {(u.target, u.name) for u in uses("manyfiles.remove._walker")}
    assert ("manyfiles._dents", None) in walker and ("manyfiles.trace.iotrace", "native_sink") in walker
    executor = {(u.target, u.name) for u in uses("manyfiles.remove._executor")}
    assert ("manyfiles._core.retry", "retrying") in executor  # imported inside a method
    assert package_of("manyfiles.remove") == "manyfiles.remove"
    assert package_of("manyfiles.remove._plan") == "manyfiles.remove"
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]
    # an import under `if TYPE_CHECKING:` is an edge of the circles' graph (and of nothing else)
    events = {(u.target, u.name) for u in uses("manyfiles.s3._events", type_checking=True)}
    assert ("manyfiles.s3._pullconfig", "PullConfig") in events
    assert ("manyfiles.s3._pullconfig", "PullConfig") not in {(u.target, u.name)
                                                                for u in uses("manyfiles.s3._events")}
    assert "manyfiles.s3._pullconfig" in import_graph()["manyfiles.s3._events"]


def test_no_import_circles() -> None:
    found = {c: " -> ".join((*c, c[0])) for c in cycles(import_graph())}
    unexpected = {c: text for c, text in found.items() if c not in ALLOWED_CYCLES}
    assert not unexpected, "import circles:\n" + "\n".join(unexpected.values())
    gone = set(ALLOWED_CYCLES) - set(found)
    assert not gone, f"fixed, drop from ALLOWED_CYCLES: {sorted(gone)}"


def test_no_private_name_is_used_outside_its_package() -> None:
    found = private_offences()
    unexpected = {k: v for k, v in found.items() if k not in ALLOWED_PRIVATE}
    assert not unexpected, "private names across packages:\n" + "\n".join(
        f"{importer} uses {what} ({why})" for (importer, what), why in sorted(unexpected.items()))
    gone = set(ALLOWED_PRIVATE) - set(found)
    assert not gone, f"fixed, drop from ALLOWED_PRIVATE: {sorted(gone)}"



# what manyfiles.scale may use besides itself and manyfiles' shared core (manyfiles._core.*, _dents)
SCALE_MAY_USE = ("manyfiles.errors", "manyfiles.trace.iotrace", "manyfiles.trace.format")


def test_scale_imports_no_tool() -> None:
    """manyfiles.scale is the tool-agnostic executor layer (issue 13): each tool keeps its cluster
    job beside its own code and imports scale, never the other way."""
    found = []
    for module in MODULES:
        if module != "manyfiles.scale" and not module.startswith("manyfiles.scale."):
            continue
        for use in uses(module):
            parts = use.target.split(".")
            if (parts[:2] == ["manyfiles", "scale"] or use.target in SCALE_MAY_USE
                    or is_private(parts[1])):  # manyfiles._core.*, manyfiles._dents
                continue
            found.append(f"{module} line {use.line}: {use.target}")
    assert not found, "manyfiles.scale uses a tool:\n" + "\n".join(found)

# issue 19's layers (docs/architecture.md): core <- scale <- tools <- face <- cli; imports point down
LAYER_RANK = {"core": 0, "scale": 1, "tool": 2, "face": 3, "cli": 4}
# module prefix -> (layer, package); the longest prefix wins
LAYERS = {
    "manyfiles": ("face", "manyfiles"),            # __init__: the lazy public face
    "manyfiles._info": ("face", "manyfiles"),
    "manyfiles.demo": ("face", "manyfiles"),
    "manyfiles.cli": ("cli", "cli"),
    "manyfiles.__main__": ("cli", "cli"),
    "manyfiles.errors": ("core", "core"),
    "manyfiles._core": ("core", "core"),
    "manyfiles._dents": ("core", "core"),
    "manyfiles.trace": ("core", "core"),
    "manyfiles.iotrace": ("core", "core"),          # public alias of manyfiles.trace.iotrace
    "manyfiles.profiling": ("core", "core"),        # public alias of manyfiles.trace.profiling
    "manyfiles.scale": ("scale", "scale"),
    "manyfiles.fastls": ("tool", "listing"),        # public alias of manyfiles.listing.fastls
    "manyfiles.table": ("tool", "listing"),         # public alias of manyfiles.listing.table
    **{f"manyfiles.{tool}": ("tool", tool)
       for tool in ("listing", "shard", "remove", "s3", "mirror", "push", "cache", "ml")},
}
# the tools each tool may import besides itself (the order of docs/architecture.md)
TOOLS_MAY_USE = {
    "listing": (),
    "shard": ("listing",),
    "remove": ("listing",),
    "s3": ("shard",),
    "mirror": ("listing", "s3", "shard"),
    "push": ("listing", "mirror", "s3"),
    "cache": ("listing", "s3", "shard"),
    "ml": ("cache", "listing", "s3"),
}
# (importer, imported) -> why
LAYER_EXCEPTIONS = {
    ("manyfiles.listing._fastls_main", "manyfiles.cli.ls"):
        "the fastls script runs the common invocations without click, the rest through the CLI",
}


def layer_of(module: str) -> tuple[str, str]:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        found = LAYERS.get(".".join(parts[:n]))
        if found is not None:
            return found
    raise AssertionError(f"{module}: in no layer (add it to LAYERS and docs/architecture.md)")


def layer_offences() -> list[str]:
    found = []
    for module in MODULES:
        layer, package = layer_of(module)
        for use in uses(module):
            to_layer, to_package = layer_of(use.target)
            version = (use.target, use.name) == ("manyfiles", "__version__")
            if version or (module, use.target) in LAYER_EXCEPTIONS:
                continue
            if layer == to_layer == "tool":
                ok = to_package == package or to_package in TOOLS_MAY_USE[package]
            else:
                ok = LAYER_RANK[to_layer] < LAYER_RANK[layer] or layer == to_layer
            if not ok:
                found.append(f"{module} ({layer} {package}) line {use.line}: "
                             f"{use.target} ({to_layer} {to_package})")
    return found


def test_imports_follow_the_layers() -> None:
    """core <- scale <- tools (in their order) <- face <- cli: no module imports a layer above it."""
    found = layer_offences()
    assert not found, "imports against the layers (docs/architecture.md):\n" + "\n".join(sorted(set(found)))


def test_the_layer_check_sees_an_import_upwards(monkeypatch) -> None:
    """The check itself: a core module importing a tool, and a tool importing a later tool, are found."""
    real = uses

    def with_extra(module: str) -> Iterator[Use]:
        yield from real(module)
        if module == "manyfiles._core.pool":
            yield Use("manyfiles.listing", "walk", 1)
        if module == "manyfiles.shard.layout":
            yield Use("manyfiles.cache", "Cache", 2)

    monkeypatch.setattr(sys.modules[__name__], "uses", with_extra)
    found = layer_offences()
    assert any(f.startswith("manyfiles._core.pool (core core) line 1: manyfiles.listing") for f in found)
    assert any(f.startswith("manyfiles.shard.layout (tool shard) line 2: manyfiles.cache") for f in found)


def test_the_rules_on_a_small_package(tmp_path: Path, monkeypatch) -> None:
    """A made-up manyfiles: the offences issue 10 names are found, the allowed uses are not."""
    files = {
        "__init__.py": "",
        "_pool.py": "def _inner(): pass\nclass Pool: pass\n",
        "listing.py": ("from manyfiles import _pool\n_dents = None\n"
                       "def walk():\n    from manyfiles import remove\n"),
        "remove/__init__.py": "from manyfiles.remove import _plan\n",
        "remove/_plan.py": ("import manyfiles.listing\nfrom manyfiles._pool import Pool\n"
                            "from manyfiles.remove import _seam\nx = manyfiles.listing._dents\n"),
        "remove/_seam.py": "from manyfiles import listing\ny = listing._dents\nz = listing.__name__\n",
        "s3/__init__.py": "",
        "s3/_keys.py": "from manyfiles import _pool\nw = _pool._inner\n",
        "cache/__init__.py": "from manyfiles.s3 import _keys\n",
        "s3/_config.py": ("from typing import TYPE_CHECKING\n"
                          "if TYPE_CHECKING:\n    from manyfiles.s3._run import Run\n"),
        "s3/_run.py": "from manyfiles.s3._config import Config\nclass Run: pass\n",
    }
    for rel, text in files.items():
        (tmp_path / "manyfiles" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "manyfiles" / rel).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", module_names())
    assert sorted(private_offences()) == [
        ("manyfiles.cache", "manyfiles.s3._keys"),            # a private module of another package
        ("manyfiles.remove._plan", "manyfiles.listing._dents"),  # through `import manyfiles.listing`
        ("manyfiles.remove._seam", "manyfiles.listing._dents"),  # the case issue 10 names
        ("manyfiles.s3._keys", "manyfiles._pool._inner"),     # a private name of a shared private module
    ]
    # listing -> remove (inside a function) -> remove._plan -> listing
    assert cycles(import_graph()) == [("manyfiles.listing", "manyfiles.remove", "manyfiles.remove._plan"),
                                      ("manyfiles.s3._config", "manyfiles.s3._run")]  # under TYPE_CHECKING
    assert cycles(import_graph(type_checking=False)) == [
        ("manyfiles.listing", "manyfiles.remove", "manyfiles.remove._plan")]


def test_the_readme_layout_names_every_module_and_folder() -> None:
    """README's "Layout" section lists every module and folder of src/manyfiles (issue 19)."""
    readme = (SRC.parent / "README.md").read_text()
    section = readme[readme.index("## Layout"):]
    section = section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section
    missing = []
    for path in sorted((SRC / PACKAGE).rglob("*")):
        if "__pycache__" in path.parts or path.suffix not in ("", ".py", ".c", ".h") or path.is_file() != (
                path.suffix != ""):
            continue
        if path.is_dir():
            found = re.search(rf"\b{re.escape(path.name)}/", section)
        elif path.name == "__init__.py" and path.parent != SRC / PACKAGE:
            continue  # a package is listed by its folder
        else:
            found = re.search(rf"(?<!\w){re.escape(path.stem)}\b", section)
        if not found:
            missing.append(str(path.relative_to(SRC)))
    assert not missing, f"not in README's Layout section: {missing}"


# A production module reaching for the tests: a test module imported, or the old environment bridge
# of the test knobs (issue 19: faults reach production code only through checkpoints and the
# extension's _set_fake_dtype, installed by tests/faults.py).
TEST_REACH = re.compile(r"^\s*(?:import|from)\s+(?:faults|conftest|pytest|tests|_pytest)\b"
                        r"|MANYFILES_TESTING|manyfiles\._core\.testing", re.M)


def reach_offences(root: Path) -> list[str]:
    """``path line N: what`` for each match of TEST_REACH in the .py, .c and .h files under ``root``."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".c", ".h"):
            text = path.read_text(errors="replace")
            found += [f"{path.relative_to(root.parent)} line {text.count(chr(10), 0, m.start()) + 1}: "
                      f"{m.group().strip()}" for m in TEST_REACH.finditer(text)]
    return found


def test_no_production_module_reads_a_test_knob() -> None:
    found = reach_offences(SRC / PACKAGE)
    assert not found, "production code reaching for the tests:\n" + "\n".join(found)


def test_the_knob_check_sees_a_test_import_and_the_bridge(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import os\nimport faults\n")
    (tmp_path / "b.py").write_text('x = 1\nspec = os.environ.get("MANYFILES_TESTING")\n')
    (tmp_path / "c.c").write_text('PyImport_GetModule("manyfiles._core.testing");\n')
    (tmp_path / "d.py").write_text("    from pytest import fixture\n# the tests (faults.py) hold it here\n")
    assert [f.split(":")[0] for f in reach_offences(tmp_path)] == [
        f"{tmp_path.name}/a.py line 2", f"{tmp_path.name}/b.py line 2", f"{tmp_path.name}/c.c line 1",
        f"{tmp_path.name}/d.py line 1"]
