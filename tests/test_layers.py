"""Layers import only from below, and no import circles back: every import in pycollect, read with ``ast``.

Every ``import`` and ``from ... import`` statement counts, wherever it stands: at the top, inside a
function (a lazy import is still an arrow), under ``if TYPE_CHECKING:`` (a type named from above
still ties the layers together). Imports built from strings at run time (``importlib.import_module``
in cli.py, tools/bench.py and the algorithms registry) are not read; each stays inside its own layer.
An import names a module: ``from ..zero import ZeroGPT`` is an arrow to ``pycollect.zero`` (its
``__init__``), ``from . import recording`` one to ``pycollect.recording``. The parents Python runs
first (every module runs ``pycollect/__init__.py``) are not arrows: the root gathers the public
names, above the layers it gathers.

docs/ARCHITECTURE.md draws ``LAYERS`` as ``layer_map()`` renders it; ``test_docs_draw_these_layers``
holds the two equal.
"""
from __future__ import annotations

import ast
import functools
import os
import shutil
from collections import defaultdict

import pytest

ROOT = "pycollect"
HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(os.path.dirname(HERE), ROOT)
DOC = os.path.join(os.path.dirname(HERE), "docs", "ARCHITECTURE.md")

# Bottom first. A module may import from its own layer and from any layer below it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("pycollect._version", "pycollect.plotting")),
    ("engine", ("pycollect.engine",)),
    ("algorithms", ("pycollect.algorithms",)),
    ("counting", ("pycollect.traffic", "pycollect.costmodel", "pycollect.clustersim")),
    ("communicator", ("pycollect.comm", "pycollect.runner", "pycollect.select", "pycollect.settings",
                      "pycollect.recording", "pycollect.cartesian", "pycollect.rooted", "pycollect.mpi4py_face")),
    ("model parts", ("pycollect.nn", "pycollect.optim", "pycollect.pipeline")),
    ("parallel", ("pycollect.parallel",)),
    ("moe", ("pycollect.moe",)),
    ("models", ("pycollect.models",)),
    ("zero", ("pycollect.zero",)),
    ("training", ("pycollect.training",)),
    ("package", ("pycollect",)),
    ("planner", ("pycollect.plan",)),
    ("tools", ("pycollect.tools", "pycollect.cli", "pycollect.__main__")),
)

# Arrows known to break the rules, each to be removed by the change named; the test fails on any other
# arrow that breaks them, and on an entry here whose arrow is gone (remove the entry then).
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


def modules(package_dir: str = PACKAGE_DIR) -> dict[str, str]:
    """``{dotted name: path}`` of every module under ``package_dir`` (a package by its ``__init__``)."""
    top = os.path.basename(package_dir)
    out = {}
    for folder, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(folder, os.path.dirname(package_dir)).split(os.sep)
        for f in sorted(files):
            if f.endswith(".py"):
                parts = rel if f == "__init__.py" else rel + [f[:-3]]
                out[".".join(parts)] = os.path.join(folder, f)
    assert top in out, f"{package_dir} has no __init__.py"
    return out


def _target(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names (relative levels counted from ``module``'s package)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(package_dir: str = PACKAGE_DIR) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``, from every import statement in its source (a fresh
    copy each call: tests plant arrows in it)."""
    return {m: set(targets) for m, targets in _read_imports(package_dir).items()}


@functools.lru_cache(maxsize=None)
def _read_imports(package_dir: str) -> dict[str, frozenset[str]]:
    mods = modules(package_dir)
    top = os.path.basename(package_dir)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = _target(mod, path.endswith("__init__.py"), node)
                # ``from pkg import sub`` is an arrow to the module pkg.sub; ``from mod import name`` to mod.
                names = [f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names]
            else:
                continue
            for name in names:
                if name == top or name.startswith(top + "."):
                    while name not in mods:       # ``import pkg.sub.name`` of a name, not a module
                        name = name.rpartition(".")[0]
                    if name != mod:
                        graph[mod].add(name)
    return {m: frozenset(targets) for m, targets in graph.items()}


def layer_of(module: str, layers=LAYERS) -> int | None:
    """Index in ``layers`` of the longest prefix naming ``module``; the root matches only itself."""
    best, depth = None, -1
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            if (module == p or (p != ROOT and module.startswith(p + "."))) and p.count(".") > depth:
                best, depth = i, p.count(".")
    return best


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's, iterative), each sorted."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def _top(module: str) -> str:
    """The top-level module or package of ``module`` under the root (``pycollect.zero.gpt`` -> ``pycollect.zero``)."""
    return ".".join(module.split(".")[:2])


def problems(graph: dict[str, set[str]], layers=LAYERS, known=KNOWN_EXCEPTIONS) -> list[str]:
    """Every broken rule, one line each: a module with no layer, an arrow upward, a circle between modules
    or between top-level packages, a known exception whose arrow is gone."""
    out = []
    names = [name for name, _ in layers]
    for mod in sorted(graph):
        if layer_of(mod, layers) is None:
            out.append(f"{mod}: in no layer; add it to LAYERS in tests/test_layers.py and to docs/ARCHITECTURE.md")
    edges = {(a, b) for a, targets in graph.items() for b in targets}
    for a, b in sorted(edges - set(known)):
        la, lb = layer_of(a, layers), layer_of(b, layers)
        if la is not None and lb is not None and lb > la:
            out.append(f"{a} ({names[la]}) imports {b} ({names[lb]}): an arrow upward")
    for edge in sorted(set(known) - edges):
        out.append(f"known exception {edge[0]} -> {edge[1]} no longer exists: remove it from KNOWN_EXCEPTIONS")
    kept: dict[str, set[str]] = defaultdict(set)
    tops: dict[str, set[str]] = defaultdict(set)
    for a, b in edges - set(known):
        kept[a].add(b)
        if _top(a) != _top(b) and ROOT not in (a, b):
            tops[_top(a)].add(_top(b))
    for comp in _cycles(kept):
        out.append(f"modules import each other in a circle: {', '.join(comp)}")
    for comp in _cycles(tops):
        out.append(f"packages import each other in a circle: {', '.join(comp)}")
    return out


def layer_map(layers=LAYERS, package_dir: str = PACKAGE_DIR) -> str:
    """The layers top first, one line each: the name, then the folders and files under ``pycollect/``."""
    lines = []
    for name, prefixes in reversed(layers):
        paths = []
        for p in prefixes:
            rel = p.split(".")[1:]
            if not rel:
                paths.append("__init__.py")
            elif os.path.isdir(os.path.join(package_dir, *rel)):
                paths.append("/".join(rel) + "/")
            else:
                paths.append("/".join(rel) + ".py")
        lines.append(f"{name:<14}{' '.join(paths)}")
    return "\n".join(lines)


def test_layers_hold():
    found = problems(imports())
    assert not found, "layers broken (docs/ARCHITECTURE.md):\n" + "\n".join(found)


def test_docs_draw_these_layers():
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    assert layer_map() in doc, f"docs/ARCHITECTURE.md must draw the layers as tests/test_layers.py holds them:\n{layer_map()}"


def test_the_reader_sees_every_kind_of_import():
    graph = imports()
    assert "pycollect.engine.request" in graph["pycollect.engine.mpi_native"]       # at the top, relative
    assert "pycollect.recording" in graph["pycollect.comm"]                        # from . import module
    assert "pycollect.pipeline.plot" in graph["pycollect.tools.explain"]          # inside a function
    assert "pycollect.engine.topology" in graph["pycollect.engine.schedule"]       # under TYPE_CHECKING
    assert "pycollect.costmodel" in graph["pycollect.tools.costmodel"]             # from .. import module


@pytest.mark.parametrize("edge, expected", [
    (("pycollect.engine.executor", "pycollect.comm"), "an arrow upward"),
    (("pycollect.algorithms.registry", "pycollect.tools.costmodel"), "an arrow upward"),
    (("pycollect.nn", "pycollect.pipeline.schedules"), "packages import each other in a circle"),
    (("pycollect.engine.layout", "pycollect.engine.mpi_native"), "modules import each other in a circle"),
])
def test_a_planted_arrow_fails(edge, expected):
    graph = imports()
    if expected == "packages import each other in a circle":     # nn and pipeline share a layer: plant both ways
        graph["pycollect.pipeline.actions"].add("pycollect.nn.linear")
    assert not problems(graph)
    graph[edge[0]].add(edge[1])
    found = problems(graph)
    assert any(expected in line and (edge[0] in line or "circle" in expected) for line in found), found


def test_a_planted_lazy_import_in_a_copy_fails(tmp_path):
    copy = tmp_path / ROOT
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "engine" / "layout.py", "a", encoding="utf-8") as f:
        f.write("\n\ndef _planted():\n    from ..comm import Communicator\n    return Communicator\n")
    found = problems(imports(str(copy)))
    assert any(line.startswith("pycollect.engine.layout (engine) imports pycollect.comm (communicator)")
               for line in found), found


def test_a_module_in_no_layer_and_a_stale_exception_fail():
    graph = imports()
    graph["pycollect.newthing"] = set()
    stale = {("pycollect.models.gpt", "pycollect.zero"): "an arrow that is not there"}
    found = problems(graph, known=stale)
    assert any(line.startswith("pycollect.newthing: in no layer") for line in found), found
    assert any("known exception pycollect.models.gpt -> pycollect.zero no longer exists" in line for line in found), found


# -- private attributes stay with their module ------------------------------------------------------------
# Names of other modules' privates that are documented public API of the standard library: os._exit, and
# the methods of a named tuple (their underscore keeps them apart from the fields).
STDLIB_PRIVATE = {"os._exit"}
NAMED_TUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def private_reads(source: str) -> list[str]:
    """``obj._name`` reads where ``obj`` is not ``self``, ``cls`` or ``super()`` and nothing in this module
    defines ``_name`` (an attribute it assigns, a method, or a keyword it passes, as argparse defaults):
    one module reading another's private attributes."""
    tree = ast.parse(source)
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            own.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        text = ast.unparse(node)
        if node.attr not in own and text not in STDLIB_PRIVATE and node.attr not in NAMED_TUPLE_API:
            found.append(f"{node.lineno}: {text}")
    return found


def test_no_module_reads_another_modules_private_attributes():
    """The engine reads a Communicator's runner through its public attributes (pycollect/runner.py), tools ask the
    Communicator in public (``stages_through_host``): a private name is read only where it is defined."""
    found = {}
    for module, path in modules().items():
        with open(path) as f:
            reads = private_reads(f.read())
        if reads:
            found[module] = reads
    assert not found, f"private attributes read outside their module: {found}"


def test_a_planted_private_read_is_found():
    assert private_reads("def f(comm):\n    return comm._lib\n") == ["2: comm._lib"]
    assert private_reads("class A:\n    def f(self, o):\n        self._x = 1\n        return o._x\n") == []
    assert private_reads("def f():\n    return super()._next_round()\n") == []


# -- one parser per PYCOLLECT_* variable ------------------------------------------------------------------
def environment_reads(source: str) -> list[str]:
    """Reads of a ``PYCOLLECT_*`` variable by its name: ``environ.get("PYCOLLECT_X")``, ``environ["PYCOLLECT_X"]``,
    ``os.getenv("PYCOLLECT_X")`` (engine/environment.py alone parses them; the rest call its parsers)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Call) and node.args:
            name = ast.unparse(node.func)
            if name.endswith("environ.get") or name == "os.getenv":
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
            key = node.slice
        if isinstance(key, ast.Constant) and str(key.value).startswith("PYCOLLECT_"):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_every_pycollect_variable_is_parsed_in_one_module():
    found = {}
    for module, path in modules().items():
        if module != "pycollect.engine.environment":
            with open(path) as f:
                reads = environment_reads(f.read())
            if reads:
                found[module] = reads
    assert not found, f"PYCOLLECT_* variables read outside engine/environment.py: {found}"
    assert environment_reads('import os\nv = os.environ.get("PYCOLLECT_X", "1")\n') == \
        ['2: os.environ.get(\'PYCOLLECT_X\', \'1\')']
