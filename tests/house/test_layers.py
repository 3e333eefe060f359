"""The package's layers run one way (docs/architecture.md): a module imports only its own layer or lower
ones, no import cycle exists, and an import inside a function is there for start-up time or an optional
dependency, never to dodge a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "src" / "smallinit"

# Bottom first; a module of layer i may import layers ≤ i. The package root (the public names) is the top.
LAYERS = [
    {"errors", "fields", "io", "signals", "version"},
    {"config"},
    {"init"},
    {"model"},
    {"adapters"},
    {"data"},
    {"measures"},
    {"monitor"},
    {"train"},
    {"analysis", "generate", "export"},
    {"auditing"},  # reads saved models as analysis does
    {"study.running"},  # the study's wing: three rooms, bottom first, and its door (study/__init__.py)
    {"study.judging"},
    {"study.planning"},
    {"study"},
    {"report"},
    {"integrations"},
    {"demo"},
    {"cli", "__main__"},
    {""},  # smallinit/__init__.py
]
# Imports inside functions: the CLI (any module of its package) imports a command's modules when it runs
# (start-up time); the HF export (and the gated-model bridge) imports the modules that need the optional
# transformers package only when used.
LAZY_ALLOWED = {("cli", None), ("export.hf", "export.remote"), ("export.gated", "export.remote")}


def _modules() -> dict[str, Path]:
    mods = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = f
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> list[tuple[str, bool]]:
    """(module imported, whether the import is inside a function), TYPE_CHECKING blocks left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # annotations only: nothing is imported at run time
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            targets: list[str] = []
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = [p for p in package[: len(package) - child.level + 1] if p]
                    module = ".".join(base + ([child.module] if child.module else []))
                elif child.module.startswith("smallinit"):
                    module = child.module.removeprefix("smallinit").lstrip(".")
                else:
                    module = None
                if module is not None:
                    targets = [
                        f"{module}.{a.name}".lstrip(".")
                        if f"{module}.{a.name}".lstrip(".") in mods
                        else module
                        for a in child.names
                    ]
            elif isinstance(child, ast.Import):
                targets = [
                    a.name.removeprefix("smallinit").lstrip(".")
                    for a in child.names
                    if a.name == "smallinit" or a.name.startswith("smallinit.")
                ]
            found.extend((t, inner) for t in targets if t in mods and t != name)
            visit(child, inner)

    visit(tree, False)
    return found


def _layer(module: str) -> int:
    """The layer of the longest entry that is the module or a package above it ("study.judging" before "study")."""
    found = [
        (len(entry), i)
        for i, layer in enumerate(LAYERS)
        for entry in layer
        if module == entry or (entry and module.startswith(entry + "."))
    ]
    if found:
        return max(found)[1]
    raise AssertionError(
        f"smallinit.{module} belongs to no layer; add its package to LAYERS and docs/architecture.md"
    )


MODULES = _modules()
GRAPH = {name: _imports(name, path, MODULES) for name, path in MODULES.items()}


def test_no_module_imports_a_higher_layer():
    upward = [
        f"smallinit.{a} (layer {_layer(a)}) imports smallinit.{b} (layer {_layer(b)})"
        for a, edges in GRAPH.items()
        for b, _ in edges
        if _layer(b) > _layer(a)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    edges = {a: {b for b, _ in bs} for a, bs in GRAPH.items()}
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(f"smallinit.{m}" for m in cycle))
            if nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            walk(start, [start])


def test_imports_inside_functions_only_where_allowed():
    def allowed(a: str, b: str) -> bool:
        return any(
            (a == who or a.startswith(who + ".")) and (target is None or b.startswith(target))
            for who, target in LAZY_ALLOWED
        )

    lazy = [
        f"smallinit.{a} imports smallinit.{b} inside a function"
        for a, edges in GRAPH.items()
        for b, nested in edges
        if nested and not allowed(a, b)
    ]
    assert not lazy, "\n".join(lazy)


def test_the_checker_sees_imports():  # the tests above would pass on a graph that found nothing
    assert ("train.trainer", False) not in GRAPH["train.callbacks"]  # a TYPE_CHECKING import is left out
    assert ("model", False) in GRAPH["train.trainer"] and ("errors", False) in GRAPH["io"]
    assert any(nested for _, nested in GRAPH["cli.study"]) and ("cli.study", False) in GRAPH["cli"]
    assert (
        _layer("study")
        > _layer("study.planning.plan")
        > _layer("study.judging.claims.c4")
        > _layer("train.trainer")
        > _layer("monitor.monitor")
        > _layer("measures.activations")
    )
