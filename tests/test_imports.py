"""The package's modules import one another without a cycle, lazy (function-level) and type-checking imports
included: each module depends only on modules below it, so it can be read, tested and changed without the ones above
it.

The graph is read from the source with ``ast``: an edge for every ``import lightformer.x`` and ``from lightformer.x
import y`` (relative ones resolved), wherever it stands in the module, under ``if TYPE_CHECKING:`` too (a type a
module needs is a dependency all the same), and for every ``importlib.import_module("lightformer.x")`` of a written
name. ``from lightformer.x import y`` is an edge to the submodule ``lightformer.x.y`` when there is one, else to the
package ``lightformer.x``, whose ``__init__.py`` has edges to the submodules it re-exports. Importing a submodule
runs its parent packages' ``__init__.py`` too, but those are not edges: a package that re-exports a module that
imports a sibling is the usual layout, not a cycle.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "lightformer"


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name → file, for every module of the package at ``root`` (a package is its ``__init__``)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _import_module_call(node: ast.AST) -> ast.Import | None:
    """``importlib.import_module("a.b")`` (or ``import_module("a.b")``) as the ``import a.b`` it does; None for
    another node, or a name computed at run time."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
        return None
    function = node.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
    if name != "import_module" or not isinstance(node.args[0].value, str):
        return None
    return ast.Import(names=[ast.alias(name=node.args[0].value)])


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import of ``tree``, at any depth (``if TYPE_CHECKING:`` included), and every ``import_module`` of a
    written name."""
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif (call := _import_module_call(node)) is not None:
            found.append(call)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module → the package's modules it imports (see the module docstring for what counts)."""
    modules = module_names(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parent = package.split(".")
                    parent = parent[: len(parent) - node.level + 1]
                    base = ".".join([*parent, *([base] if base else [])])
                submodules = [f"{base}.{alias.name}" for alias in node.names]
                targets = [submodule if submodule in modules else base for submodule in submodules]
            for target in targets:
                while target and target not in modules and target.startswith(f"{root.name}."):
                    target = target.rpartition(".")[0]  # `import pkg.mod.attr`-style names: the module holding it
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (its path, first module repeated at the end) per strongly connected component of ``graph`` that
    has one (Tarjan's algorithm, then a breadth-first search inside the component)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    found = []
    for component in components:
        if len(component) < 2:
            continue
        members, start = set(component), min(component)
        previous, queue = {start: None}, [start]
        while queue:  # the shortest way back to start
            node = queue.pop(0)
            if start in graph[node]:
                path = [node]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                found.append([*reversed(path), start])
                break
            for target in sorted(graph[node] & members):
                if target not in previous:
                    previous[target] = node
                    queue.append(target)
    return found


def test_lightformer_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 40 and graph["lightformer.cli.main"], "the graph was not read"
    found = cycles(graph)
    assert not found, "import cycles inside lightformer (lazy and type-checking imports included):\n" + "\n".join(
        " → ".join(cycle) for cycle in found
    )


def test_the_registry_and_the_commands_are_in_no_import_cycle():
    """The registry imports no task, and the tasks take what their commands share from ``command_support``, which
    imports no task's module: the tasks → commands → registry → ``lightformer.tasks`` circle is gone."""
    graph = import_graph(PACKAGE)
    assert "lightformer.tasks" in graph["lightformer.cli.commands"]  # the commands import the tasks, not the other way
    in_cycles = {module for cycle in cycles(graph) for module in cycle}
    apart = {
        "lightformer.registry",
        "lightformer.cli.commands",
        "lightformer.tasks.command_support",
        "lightformer.tasks",
    }
    assert not in_cycles & apart, f"in an import cycle: {sorted(in_cycles & apart)}"


def test_the_cycle_check_sees_lazy_package_and_type_checking_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    load = "def load(name):\n    importlib.import_module('pkg.i')\n    importlib.import_module(name)\n"
    files = {
        "__init__.py": "",
        "a.py": "from pkg.b import thing\n",
        "b.py": "def thing():\n    from . import c\n",  # lazy, relative
        "c.py": "import pkg.a\n",
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.e import E\n",
        "e.py": "from pkg import d\n",
        "sub/__init__.py": "from .f import F\n",  # a re-export: the package's edge to its submodule
        "sub/f.py": "def F():\n    from pkg.g import G\n",
        "g.py": "from pkg.sub import F\n",  # an edge to the package, so through its __init__ to f
        "h.py": f"import importlib\n{load}",  # a written name, and one computed at run time
        "i.py": "from pkg.h import load\n",
    }
    for name, text in files.items():
        (package / name).write_text(textwrap.dedent(text))
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"} and graph["pkg.d"] == {"pkg.e"}
    assert graph["pkg.e"] == {"pkg.d"} and graph["pkg.sub"] == {"pkg.sub.f"} and graph["pkg.g"] == {"pkg.sub"}
    assert graph["pkg.h"] == {"pkg.i"}  # the written name only: a computed one is not known before run time
    assert sorted(cycles(graph)) == [
        ["pkg.a", "pkg.b", "pkg.c", "pkg.a"],
        ["pkg.d", "pkg.e", "pkg.d"],
        ["pkg.g", "pkg.sub", "pkg.sub.f", "pkg.g"],
        ["pkg.h", "pkg.i", "pkg.h"],
    ]


def test_a_module_that_moved_into_a_sub_package_imports_under_its_old_name_with_a_warning():
    """A config or script written before the root package was grouped (``class_path:
    lightformer.callbacks.ModelCheckpoint``) still runs: the old name is the new module, and the warning names it."""
    import subprocess
    import sys

    from lightformer import MOVED_MODULES

    script = (
        "import importlib, warnings\n"
        "from lightformer import MOVED_MODULES\n"
        "for old, new in MOVED_MODULES.items():\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module(old)\n"
        "    assert module is importlib.import_module(new), old\n"
        "    assert any(new in str(w.message) and w.category is FutureWarning for w in caught), old\n"
        "from lightformer.callbacks import ModelCheckpoint\n"
        "print(ModelCheckpoint.__module__, len(MOVED_MODULES))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["lightformer.training.callbacks", str(len(MOVED_MODULES))]


def test_nothing_below_the_data_imports_it():
    """The tokenizers sit below data/, io/ and facts.py, which all read them (a checkpoint carries its tokenizer, a
    layout writes it, the facts compare it): no arrow runs back up into data/ from io/, facts.py or tokenization/,
    and tokenization/ imports only the package's shared errors and files."""
    graph = import_graph(PACKAGE)
    below = [name for name in graph if name.startswith(("lightformer.io", "lightformer.tokenization"))]
    below.append("lightformer.facts")
    upward = {name: sorted(t for t in graph[name] if t.startswith("lightformer.data")) for name in below}
    assert not {name: targets for name, targets in upward.items() if targets}, upward
    tokenization = {t for name in below if name.startswith("lightformer.tokenization") for t in graph[name]}
    outside = {t for t in tokenization if not t.startswith("lightformer.tokenization")}
    assert outside <= {"lightformer.io.files", "lightformer.errors"}, outside
