"""The package's shape, checked from its source: layers, no import cycles, small modules.

Every import counts -- module level and function level -- except those under
``if TYPE_CHECKING:``, which never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "local_mutex"
MAX_LINES = 400

# Top to bottom: a module may import its own layer or those below it, never above.
LAYERS = [
    (
        "entry",
        [
            "local_mutex.cli",
            "local_mutex.action",
            "local_mutex.action_inputs",
            "local_mutex.api",
            "local_mutex.__main__",
        ],
    ),
    ("commands", ["local_mutex.commands"]),
    ("holds", ["local_mutex.holds"]),
    ("lifecycle", ["local_mutex.lifecycle", "local_mutex.held", "local_mutex.runspec"]),
    ("backends", ["local_mutex.backends"]),
    ("supervise", ["local_mutex.supervise"]),
    ("ui", ["local_mutex.ui"]),
    (
        "base",
        [
            "local_mutex.errors",
            "local_mutex.names",
            "local_mutex.identity",
            "local_mutex.nesting",
            "local_mutex._json",
            "local_mutex._proc",
            "local_mutex._fastsignal",
            "local_mutex._site",
            "local_mutex._version",
            "local_mutex",
        ],
    ),
]
# Backends never reach into each other.
SIBLINGS = [
    "local_mutex.backends.flock",
    "local_mutex.backends.git",
    "local_mutex.backends.postgres",
]


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for orelse in node.orelse:
                visit(orelse)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("local_mutex"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.startswith("local_mutex"):
                for alias in node.names:
                    candidate = f"{base}.{alias.name}"
                    found.add(candidate if _exists(candidate) else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(here)
    return found


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def layer_of(module: str) -> int:
    best, depth = len(LAYERS), -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = index, len(prefix)
    return best


def test_every_module_has_a_layer() -> None:
    assert [m for m in graph() if layer_of(m) == len(LAYERS)] == []


def test_no_module_imports_a_layer_above_it() -> None:
    bad = []
    for module, deps in graph().items():
        for dep in deps:
            if layer_of(dep) < layer_of(module):
                bad.append(f"{module} -> {dep}")
    assert bad == []


def test_backends_do_not_import_each_other() -> None:
    bad = []
    for module, deps in graph().items():
        mine = [s for s in SIBLINGS if module == s or module.startswith(s + ".")]
        for dep in deps:
            theirs = [s for s in SIBLINGS if dep == s or dep.startswith(s + ".")]
            if mine and theirs and mine != theirs:
                bad.append(f"{module} -> {dep}")
    assert bad == []


def test_no_import_cycles() -> None:
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
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
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strongconnect(v)
    assert cycles == []


def test_no_module_is_over_the_size_limit() -> None:
    """The package's modules, and the action's bootstrap beside them."""
    root = PACKAGE.parents[1]
    long = {
        str(p.relative_to(root)): n
        for p in [*PACKAGE.rglob("*.py"), *(root / "setup").glob("*.py")]
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_checker_sees_function_level_imports(tmp_path: Path) -> None:
    """The guard itself: an import inside a function is an edge."""
    probe = PACKAGE / "lifecycle.py"
    assert "local_mutex.supervise.keeper" in imports_of(probe)
    assert any(d.startswith("local_mutex.backends") for d in imports_of(PACKAGE / "api.py"))
