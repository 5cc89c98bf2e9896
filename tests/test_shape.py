"""The code's shape as gates (issue 20): no import cycles, nothing radon rates D, hskstore without torch,
hskstore's layers imported in one direction (issue 38).

CI runs these with the rest of the suite, so the shape stays true: a change that adds an import
cycle between two files or two packages, an import against hskstore's layers, or a block radon rates
D or worse (complexity > 20), fails here with the names to look at. ruff's C901 gate (max-complexity 12,
pyproject.toml) covers the rest.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("hskstore", "pipelines")


def _modules() -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            mods[name] = path
    return mods


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom, mods: dict[str, Path]) -> list[str]:
    """The project modules an import statement names (a `from pkg import name` names pkg.name when that
    is a module, else pkg)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        base = node.module or ""
        if node.level:
            parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*parts, base] if base else parts)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    found = []
    for name in names:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.append(name)
    return found


_DYNAMIC = ("import_module", "__import__")  # importlib.import_module("a.b"), __import__("a.b")


def _dynamic_targets(node: ast.AST, mods: dict[str, Path]) -> list[str]:
    """The project module an `import_module("...")` or `__import__("...")` call names by a string literal."""
    if not isinstance(node, ast.Call) or not node.args:
        return []
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    first = node.args[0]
    if name not in _DYNAMIC or not isinstance(first, ast.Constant) or not isinstance(first.value, str):
        return []
    target = first.value
    while target and target not in mods:
        target = target.rpartition(".")[0]
    return [target] if target else []


def test_the_graph_reads_import_module_strings():
    mods = {"hskstore.share.bundle": Path("x"), "hskstore.io.reader": Path("y")}
    for code in ('import_module("hskstore.share.bundle").f()', 'importlib.import_module("hskstore.share.bundle")',
                 '__import__("hskstore.share.bundle")'):
        assert _dynamic_targets(ast.parse(code).body[0].value.func.value if code.endswith(".f()") else
                                ast.parse(code).body[0].value, mods) == ["hskstore.share.bundle"], code
    assert _dynamic_targets(ast.parse('import_module("xarray")').body[0].value, mods) == []


def import_graph() -> dict[str, set[str]]:
    """Every import between project files, at module level or inside functions (a lazy import is still
    a dependency), except those under `if TYPE_CHECKING:`; an `import_module`/`__import__` call naming a
    module by a string literal counts as an import of it."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for n in ast.walk(block)
        }
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                graph[module].update(_targets(module, path, node, mods))
            graph[module].update(t for t in _dynamic_targets(node, mods) if t != module)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def package_of(module: str, mods: dict[str, Path]) -> str:
    """hskstore is one package; pipelines' subpackages (core, dump, train, ...) and top-level files each
    count as one."""
    parts = module.split(".")
    if parts[0] == "hskstore" or len(parts) == 1:
        return parts[0]
    return ".".join(parts[:2])


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_files():
    assert cycles(import_graph()) == []


def test_no_import_cycle_between_packages():
    mods = _modules()
    packages: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        source = package_of(module, mods)
        packages.setdefault(source, set())
        packages[source].update(package_of(t, mods) for t in targets if package_of(t, mods) != source)
    for targets in list(packages.values()):
        for t in targets:
            packages.setdefault(t, set())
    assert cycles(packages) == []


def test_train_layers_import_one_way():
    """pipelines/train's folders are layers: losses <- students <- data <- run <- kinds (options under all)."""
    order = ["options", "losses", "students", "data", "run", "kinds"]
    upward = set()
    for module, targets in import_graph().items():
        parts = module.split(".")
        if parts[:2] != ["pipelines", "train"] or len(parts) < 3:
            continue
        for target in targets:
            tparts = target.split(".")
            if tparts[:2] == ["pipelines", "train"] and len(tparts) > 2 and tparts[2] != parts[2]:
                if order.index(tparts[2]) > order.index(parts[2]):
                    upward.add((module, target))
    assert upward == set()


def test_hskstore_never_imports_pipelines():
    leaks = {m: sorted(t for t in ts if t.startswith("pipelines")) for m, ts in import_graph().items()}
    assert {m: ts for m, ts in leaks.items() if m.startswith("hskstore") and ts} == {}


# hskstore's layers (issue 38, docs/concepts/layout.md): what each may import. The root holds the errors, the
# plugin loader and the version, which every layer uses; the codecs (hskstore/codecs) are part of the format.
LAYERS = {
    "root": {"root"},
    "format": {"root", "format"},
    "method": {"root", "format", "method"},
    "io": {"root", "format", "io"},
    "share": {"root", "format", "method", "io", "share"},
}
ROOT_MODULES = {"hskstore.errors", "hskstore.plugins", "hskstore.version"}


def layer_of(module: str) -> str | None:
    """The layer of a hskstore module (None: a top-level module no layer holds yet: place it in one)."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    if len(parts) > 1 and parts[1] == "codecs":
        return "format"
    return "root" if module in ROOT_MODULES else None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports between hskstore modules against the direction of the layers (the package itself, which
    re-exports the public names on first use, excepted), and modules outside every layer."""
    found = []
    for module, targets in sorted(graph.items()):
        if not module.startswith("hskstore.") or module == "hskstore":
            continue
        layer = layer_of(module)
        if layer is None:
            found.append(f"{module}: in no layer (hskstore/format, io, method or share)")
            continue
        found += [f"{module} ({layer}) imports {t} ({layer_of(t)})" for t in sorted(targets)
                  if t.startswith("hskstore.") and layer_of(t) not in LAYERS[layer]]
    return found


def test_layer_rule_finds_a_violation():
    graph = {"hskstore.io.reader": {"hskstore.share.bundle", "hskstore.format.schema", "hskstore.errors"},
             "hskstore.method.selection": {"hskstore.io.reader"}, "hskstore.format.schema": {"hskstore.codecs"},
             "hskstore.stray": set()}
    assert layer_violations(graph) == [
        "hskstore.io.reader (io) imports hskstore.share.bundle (share)",
        "hskstore.method.selection (method) imports hskstore.io.reader (io)",
        "hskstore.stray: in no layer (hskstore/format, io, method or share)",
    ]


def test_hskstore_imports_follow_its_layers():
    """format <- io <- share, and the method's pure functions on the format alone."""
    assert layer_violations(import_graph()) == []


def test_no_block_rated_d_or_worse():
    radon = pytest.importorskip("radon.complexity", reason="radon is in the test extra")
    worse = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for block in radon.cc_visit(path.read_text()):
                if radon.cc_rank(block.complexity) >= "D":
                    worse.append(f"{path.relative_to(ROOT)}:{block.lineno} {block.name} {block.complexity}")
    assert worse == []


BLOCK_TORCH = """
import importlib, pkgutil, sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"blocked: {name}")

sys.meta_path.insert(0, Block())
import hskstore
for info in pkgutil.walk_packages(hskstore.__path__, "hskstore."):
    importlib.import_module(info.name)
import pipelines.registry, pipelines.methods
print("ok", sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")))
"""


def test_hskstore_and_the_registry_import_without_torch():
    done = subprocess.run([sys.executable, "-c", BLOCK_TORCH], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok []"
