"""The product's import graph read from source with `ast`: every import, also the lazy ones inside functions (they
run too, only later), but not those under `if TYPE_CHECKING:`. Nodes are dotted module names (`h3batch.api.jobs`);
third-party imports become their top-level name (`torch`), so a chain can end in one."""
from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOMS = {"h3batch": "h3batch", "h3batch.core": "core", "h3batch.api": "api", "h3batch.worker": "worker",
         "h3batch.kernels": "kernels", "h3batch.loadrunner": "loadrunner", "h3batch.client": "client"}
"""Import name -> folder in the checkout (pyproject.toml's package-dir)."""


def modules() -> dict[str, Path]:
    """Every product module: dotted name -> source file."""
    found: dict[str, Path] = {}
    for package, folder in ROOMS.items():
        root = REPO / folder
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            if package == "h3batch" and parts and f"h3batch.{parts[0]}" in ROOMS:
                continue
            found[name] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    out: set[str] = set()

    def resolve(name: str) -> str:
        if name in known:
            return name
        if name.startswith("h3batch."):
            parent = name.rsplit(".", 1)[0]
            return resolve(parent) if parent != "h3batch" else "h3batch"
        return name.split(".", 1)[0]

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    out.add(resolve(alias.name))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                for alias in child.names:
                    full = f"{target}.{alias.name}"
                    out.add(full if full in known else resolve(target))
            visit(child)

    visit(tree)
    out.discard(module)
    return out


def graph(*, parents: bool = True) -> dict[str, set[str]]:
    """module -> the modules (or third-party top-level names) it imports; with `parents`, also the packages whose
    `__init__` Python runs first (right for "what gets loaded", noise for circles)."""
    mods = modules()
    known = set(mods)
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges[name] = _imports(tree, name, path.name == "__init__.py", known)
        # Importing a.b.c runs a/__init__ and a/b/__init__ first.
        parts = name.split(".")
        for i in range(2, len(parts) if parents else 0):
            parent = ".".join(parts[:i])
            if parent in known and parent != name:
                edges[name].add(parent)
        edges[name].discard(name)
    return edges


def chain(edges: dict[str, set[str]], start: str, forbidden) -> list[str] | None:
    """The shortest import chain from `start` to a node for which `forbidden(node)` is true, or None."""
    seen = {start: None}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        for nxt in sorted(edges.get(node, ())):
            if nxt in seen:
                continue
            seen[nxt] = node
            if forbidden(nxt):
                path = [nxt]
                while seen[path[-1]] is not None:
                    path.append(seen[path[-1]])
                return path[::-1]
            if nxt in edges:
                todo.append(nxt)
    return None


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one product module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return groups
