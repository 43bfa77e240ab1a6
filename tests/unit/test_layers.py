"""The package's layers: every import points down, and only the FUSE adapter imports pyfuse3.

The folders are the layers (packfs/__init__.py draws them). A module may import its own
layer and any layer ranked below it; layers of one rank (fuse and fsck, store and
swiftmeta) may not import each other. Imports are read with ast, wherever they stand:
inside functions and under TYPE_CHECKING too, since a lazy import is still a dependency.
"""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import packfs

PACKAGE = Path(packfs.__file__).parent

# The layer of a module is its longest prefix here; the number is its rank.
LAYERS = {
    "packfs.cli": 6,
    "packfs.fuse": 5, "packfs.fsck": 5, "packfs.importer": 5,
    "packfs.core": 4,
    "packfs.namespace": 3,
    "packfs.store": 2, "packfs.swiftmeta": 2,
    "packfs.store.disk": 1,
    "packfs": 0, "packfs.errors": 0, "packfs.options": 0, "packfs.stats": 0, "packfs.prometheus": 0,
    "packfs.progress": 0,
}
FUSE_ONLY = {"pyfuse3"}  # what only packfs.fuse may import


def layer_of(module: str) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return prefix
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def _exists(root: Path, module: str) -> bool:
    """Whether `module` (packfs.…) is a module, package or C extension source in the tree."""
    path = root.joinpath(*module.split(".")[1:])
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists() or path.with_suffix(".c").exists()


def imports_of(root: Path, path: Path) -> list[tuple[int, str]]:
    """(line, module) for each import in `path`, relative ones made absolute; `from X import
    name` counts as X.name where that is a module."""
    module_parts = ["packfs", *path.relative_to(root).with_suffix("").parts]
    if module_parts[-1] == "__init__":
        module_parts.pop()
        package = module_parts
    else:
        package = module_parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{source}.{alias.name}"
                found.append((node.lineno, full if source.startswith("packfs") and _exists(root, full) else source))
    return found


def violations(root: Path) -> list[str]:
    """Every import in the package at `root` that points up or sideways, or reaches pyfuse3
    from outside the adapter."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        importer = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        mine = layer_of(importer)
        for line, target in imports_of(root, path):
            top = target.split(".")[0]
            if top in FUSE_ONLY and not mine.startswith("packfs.fuse"):
                found.append(f"{rel}:{line}: {importer} ({mine}) imports {target}, which only packfs.fuse may")
            if top != "packfs":
                continue
            theirs = layer_of(target)
            if theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
                found.append(f"{rel}:{line}: {importer} ({mine}, rank {LAYERS[mine]}) imports {target} "
                             f"({theirs}, rank {LAYERS[theirs]})")
    return found


def test_every_import_points_down():
    assert violations(PACKAGE) == []


def test_every_module_is_in_a_layer():
    for path in PACKAGE.rglob("*.py"):
        layer_of(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))


def import_cycle(root: Path) -> list[str]:
    """One cycle between the modules at `root` (the modules along it), or []."""
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        graph[name] = {t for _, t in imports_of(root, path) if t.startswith("packfs") and t != name}
    state: dict[str, int] = {}  # 1 while on the path being walked, 2 when done

    def walk(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(graph[node] & graph.keys()):  # (C extensions have no node)
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if not state.get(nxt) and (cycle := walk(nxt, path + [nxt])):
                return cycle
        state[node] = 2
        return []

    for name in sorted(graph):
        if not state.get(name) and (cycle := walk(name, [name])):
            return cycle
    return []


def test_no_module_imports_itself_back():
    """No cycle between modules, lazy or not (inodes and xattrstore had one)."""
    assert import_cycle(PACKAGE) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "packfs"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


LAYERED = {"__init__.py": "", "store/__init__.py": "", "core/__init__.py": "", "fuse/__init__.py": "",
           "fsck/__init__.py": "", "store/volumes.py": "", "store/disk.py": "", "core/pack.py": ""}


def test_the_check_finds_an_upward_import(tmp_path):
    root = _tree(tmp_path, {**LAYERED, "store/volumes.py": "def f():\n    from ..core import pack\n"})
    assert [v.split(": ", 1)[1] for v in violations(root)] == [
        "packfs.store.volumes (packfs.store, rank 2) imports packfs.core.pack (packfs.core, rank 4)"]


def test_the_check_finds_a_sideways_import_and_pyfuse3_below_the_adapter(tmp_path):
    root = _tree(tmp_path, {**LAYERED, "fsck/__init__.py": "from packfs.fuse import daemon\n",
                            "core/pack.py": "import pyfuse3\nfrom . import helper\n", "core/helper.py": "",
                            "store/disk.py": "from . import volumes\n"})
    assert len(violations(root)) == 3
    assert any("packfs.fsck (packfs.fsck, rank 5) imports packfs.fuse" in v for v in violations(root))
    assert any("imports pyfuse3, which only packfs.fuse may" in v for v in violations(root))
    assert any("packfs.store.disk (packfs.store.disk, rank 1) imports packfs.store.volumes" in v
               for v in violations(root))


def test_the_check_allows_downward_and_same_layer_imports(tmp_path):
    root = _tree(tmp_path, {**LAYERED, "core/pack.py": "from ..store import volumes\nfrom .. import errors\n",
                            "errors.py": "", "store/volumes.py": "from .disk import Disk\n",
                            "fuse/__init__.py": "from ..core.pack import x\nimport pyfuse3\n"})
    assert violations(root) == []


def test_the_check_finds_a_cycle_within_a_layer(tmp_path):
    root = _tree(tmp_path, {**LAYERED, "store/volumes.py": "from . import records\n",
                            "store/records.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                "    from .volumes import Volumes\n"})
    assert violations(root) == []
    assert import_cycle(root) == ["packfs.store.records", "packfs.store.volumes", "packfs.store.records"]
