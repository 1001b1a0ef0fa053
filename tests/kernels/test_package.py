"""h3batch.kernels as a room: it imports no other h3batch room (worker, api, core, loadrunner)."""
from __future__ import annotations

import ast
from pathlib import Path

import h3batch.kernels

OTHER_ROOMS = ("h3batch.worker", "h3batch.api", "h3batch.core", "h3batch.loadrunner")


def _imported_modules(path: Path) -> list[str]:
    """Absolute module names a file imports (`from a import b` yields `a` and `a.b`: b may be a module)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_kernels_import_no_other_room():
    """No module of the kernels package imports h3batch.worker, .api, .core or .loadrunner (directly or by name)."""
    files = sorted(Path(h3batch.kernels.__file__).parent.glob("*.py"))
    assert len(files) >= 9  # the package itself, not an empty folder
    offending = {f.name: name for f in files for name in _imported_modules(f)
                 if name.startswith(OTHER_ROOMS)}
    assert offending == {}
