"""The import graph of the verispec package: no circle, the server apart from ``bench`` and
``train``, the llama.cpp backend without torch.

The graph is read from the source with ``ast``, not by importing anything. An arrow A -> B
means module A's text imports verispec module B, at the top or inside a function: an import
in a function runs when the function is first called, so a circle through one is still a
circle (the drafter registry's was one) and a server function that imports ``bench`` still
makes the server depend on it. Imports under ``if TYPE_CHECKING:`` never run and are left
out. ``from package import name`` points at the submodule ``package.name`` where there is
one, else at the package. Importing a submodule also runs its parent packages'
``__init__``; those implicit arrows are left out (verispec's ``__init__`` files import
nothing at the top).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import deque
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "verispec"


def module_names(root: Path = PACKAGE_ROOT) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (a package is its ``__init__``)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in a module, in functions too, but not under TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def import_graph(root: Path = PACKAGE_ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(arrows between verispec modules, the outside top-level packages each module imports)."""
    modules = module_names(root)
    arrows: dict[str, set[str]] = {name: set() for name in modules}
    outside: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
                ]
            for target in targets:
                if target.split(".")[0] != root.name:
                    outside[name].add(target.split(".")[0])
                    continue
                while target not in modules:  # ``import verispec.a.b`` where b is a name in a
                    target = target.rpartition(".")[0]
                if target != name:
                    arrows[name].add(target)
    return arrows, outside


def find_circle(arrows: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a list of modules (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for target in sorted(arrows[name]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (circle := visit(target)):
                return circle
        path.pop()
        state[name] = 2
        return None

    for name in sorted(arrows):
        if name not in state and (circle := visit(name)):
            return circle
    return None


def path_to(arrows: dict[str, set[str]], start: str, goal) -> list[str] | None:
    """The shortest chain of imports from ``start`` to a module for which ``goal`` is true."""
    came_from: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        name = queue.popleft()
        if goal(name):
            chain = [name]
            while (previous := came_from[chain[-1]]) is not None:
                chain.append(previous)
            return chain[::-1]
        for target in sorted(arrows[name]):
            if target not in came_from:
                came_from[target] = name
                queue.append(target)
    return None


ARROWS, OUTSIDE = import_graph()


def test_the_graph_sees_known_imports():
    # If parsing lost arrows, the tests below would pass on an empty graph.
    assert len(ARROWS) > 50
    assert {"verispec.accept", "verispec.sampling", "verispec.drafters.base"} <= ARROWS["verispec.engine"]
    assert "verispec.api" in ARROWS["verispec"]  # an import inside ``__getattr__``
    assert "torch" in OUTSIDE["verispec.targets.torch_target"]
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_circle():
    circle = find_circle(ARROWS)
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_server_depends_on_neither_bench_nor_train():
    for name in sorted(ARROWS):
        if name.startswith("verispec.server"):
            chain = path_to(ARROWS, name, lambda m: m.startswith(("verispec.bench", "verispec.train")))
            assert chain is None, "the server reaches bench/train: " + " -> ".join(chain)


def test_llamacpp_backend_never_imports_torch():
    chain = path_to(ARROWS, "verispec.targets.llamacpp", lambda m: "torch" in OUTSIDE[m])
    assert chain is None, "the llama.cpp backend reaches torch: " + " -> ".join(chain)
    code = "import sys, verispec.targets.llamacpp; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"
