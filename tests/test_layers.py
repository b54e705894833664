"""The architecture the folders show: each package imports only the layers below it, and no
module imports itself back through another (no cycles). Read from the source with `ast`,
so an import added anywhere, even inside a function, is checked; imports for type
annotations alone (`if TYPE_CHECKING:`) are not run, and are left out."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "steward"

# a package may import its own modules and those of the layers listed for it
BELOW = {
    "model": {"errors"},
    "wire": {"model"},
    "worker": {"model", "wire"},
    "ranks": {"model", "wire"},
    "supervisor": {"config", "errors", "model", "wire", "ranks"},
    "pool": {"config", "errors", "model", "wire", "supervisor", "ranks"},
    "ops": {"supervisor", "wire", "pool"},
    "front": {"config", "errors", "model", "wire", "supervisor", "pool", "ops"},
}


def imports() -> dict[str, set[str]]:
    """Module -> the steward modules it imports."""
    found: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(("steward", *path.relative_to(ROOT).with_suffix("").parts))
        name = name.removesuffix(".__init__")
        targets: set[str] = set()
        tree = ast.parse(path.read_text())
        typing_only = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
            for n in ast.walk(block)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
        found[name] = {t for t in targets if t.startswith("steward")}
    return found


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_each_package_imports_only_the_layers_below_it() -> None:
    known = imports()
    wrong = [
        f"{module} imports {target}"
        for module, targets in known.items()
        if package(module) in BELOW
        for target in targets
        if target in known
        and package(target) not in (package(module), "")  # the root: its version
        and package(target) not in BELOW[package(module)]
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_module_imports_itself_back() -> None:
    known = imports()
    graph = {m: {t for t in ts if t in known and t != m} for m, ts in known.items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as cycle:
        raise AssertionError(f"an import cycle: {cycle.args[1]}") from None
