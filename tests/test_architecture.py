"""The import graph follows the declared flow (README "Layout"), with no circles.

Every import counts, function-local and `TYPE_CHECKING` ones included: an edge hidden inside a
function is still an edge a reader has to know about.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The shared vocabulary every layer may use.
VOCABULARY = {"errors", "toolchain", "problem", "targets", "candidate", "logs", "version"}

# layer -> the layers it may import (besides itself and the vocabulary). Read bottom-up:
# datasets <- features <- costmodel <- search <- tuner <- cli; ir <- measure <- tuner.
ALLOWED: dict[str, set[str]] = {
    "vocabulary": set(),
    "ir": set(),
    "datasets": set(),
    "features": {"datasets"},
    "costmodel": {"features", "datasets"},
    "search": {"costmodel", "features", "datasets"},
    "measure": {"ir", "datasets"},
    "tuner": {"measure", "search", "costmodel", "features", "datasets", "ir"},
    "evaluation": {"search", "costmodel", "features", "datasets"},
    "cli": {"tuner", "evaluation", "measure", "search", "costmodel", "features", "datasets", "ir",
            "api"},
    "api": {"ir", "costmodel", "search", "features", "datasets"},  # dispatchtune/__init__.py
    "benchmarks": {"cli", "tuner", "evaluation", "measure", "search", "costmodel", "features",
                   "datasets", "ir", "api"},
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("tests", ".venv", ".typecheck", "build") or rel.parts[0].startswith("."):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(["dispatchtune", *parts])] = path
    return found


def _imports(path: Path, module: str, known: set[str]) -> set[str]:
    """Project modules imported anywhere in `path` (resolved to the most specific known module)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            # `from pkg import sub` imports the submodule `pkg.sub` when there is one.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name.startswith("dispatchtune") and name != module:
                targets.add(name)
    return targets


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "api"
    if parts[1] in VOCABULARY:
        return "vocabulary"
    if parts[1] == "__main__":
        return "cli"
    return parts[1]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {m: _imports(p, m, known) for m, p in modules.items()}


def test_every_package_is_a_declared_layer() -> None:
    unknown = sorted({_layer(m) for m in _graph()} - set(ALLOWED))
    assert not unknown, f"packages missing from the declared flow: {unknown}"


def test_imports_follow_the_declared_flow() -> None:
    wrong = []
    for module, targets in sorted(_graph().items()):
        layer = _layer(module)
        for target in sorted(targets):
            other = _layer(target)
            if other not in (layer, "vocabulary") and other not in ALLOWED[layer]:
                wrong.append(f"{module} -> {target} ({layer} may not import {other})")
    assert not wrong, "imports against the declared flow:\n" + "\n".join(wrong)


def test_vocabulary_imports_nothing_above_it() -> None:
    graph = _graph()
    wrong = [f"{m} -> {t}" for m in graph if _layer(m) == "vocabulary"
             for t in graph[m] if _layer(t) != "vocabulary"]
    assert not wrong, wrong


def test_runtime_code_never_imports_benchmarks() -> None:
    graph = _graph()
    wrong = [f"{m} -> {t}" for m, ts in graph.items() if _layer(m) != "benchmarks"
             for t in ts if _layer(t) == "benchmarks"]
    assert not wrong, wrong


def test_no_import_cycles() -> None:
    graph = _graph()
    # Tarjan's strongly connected components, iteratively; any component of two or more modules
    # is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
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
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    assert not cycles, f"import cycles: {cycles}"


def test_every_package_is_installed() -> None:
    """A wheel (not the editable install the tests run from) holds only the listed packages."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {m for m, p in _modules().items() if p.name == "__init__.py"}
    assert packages <= listed, f"packages missing from pyproject.toml: {sorted(packages - listed)}"
