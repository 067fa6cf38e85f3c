"""fpipe's module import graph, read from the source with ``ast`` (nothing is imported).

Every ``import`` and ``from ... import`` of every module under ``fpipe/`` is an edge, wherever
it stands: at module level, inside a function or method, or under ``if TYPE_CHECKING:``; each
edge says which. Relative imports are resolved, and ``from package import name`` points at the
submodule ``package.name`` when there is one, else at the package itself. So a package's
``__init__`` that imports its submodules to re-export them has an edge to each, and a
submodule that takes a name from its own package's ``__init__`` has an edge back to it.
Importing ``a.b.c`` also runs ``a`` and ``a.b``; those implicit parent edges are not drawn (every
submodule would then close a loop through its package).

Modules are named in full (``fpipe.dataset.format``); the layer and cycle tests read this graph.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import fpipe

PACKAGE = Path(fpipe.__file__).parent
AT_LOAD, IN_FUNCTION, TYPE_CHECKING = "at load", "in a function", "for type checking"
ImportNode = ast.Import | ast.ImportFrom
FUNCTIONS = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


@dataclass(frozen=True)
class Import:
    """One edge: ``source`` imports ``target`` (on ``line``, ``where`` says when it runs)."""

    source: str
    target: str
    line: int
    where: str

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.where}, line {self.line})"


def module_name(path: Path) -> str:
    """The full dotted name of the module in ``path`` (a package's ``__init__`` is the package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of fpipe by its full name."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path) -> list[Import]:
    """The edges from the module in ``path`` to other fpipe modules, in source order."""
    source = module_name(path)
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    found = []
    for node, where in import_statements(ast.parse(path.read_text())):
        for target in targets(node, package):
            if target != source:
                found.append(Import(source, target, node.lineno, where))
    return found


def import_statements(node: ast.AST, where: str = AT_LOAD) -> Iterator[tuple[ImportNode, str]]:
    """Every import statement in ``node``, with when it runs if ``node`` runs ``where``."""
    if isinstance(node, ImportNode):
        yield node, where
    elif isinstance(node, ast.If) and where == AT_LOAD and _is_type_checking(node.test):
        for child in node.body:
            yield from import_statements(child, TYPE_CHECKING)
        for child in node.orelse:
            yield from import_statements(child, where)
    else:
        inner = IN_FUNCTION if isinstance(node, FUNCTIONS) else where
        for child in ast.iter_child_nodes(node):
            yield from import_statements(child, inner)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def targets(node: ImportNode, package: str) -> list[str]:
    """The fpipe modules that import statement ``node`` of a module in ``package`` names."""
    if isinstance(node, ast.Import):
        return [target for target in (_known(alias.name) for alias in node.names) if target]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, *base.split(".")]).strip(".")
    if not _known(base):
        return []
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules() else _known(base)
            for alias in node.names]


def _known(name: str) -> str:
    """The longest prefix of ``name`` that is an fpipe module, or ``""`` outside fpipe."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules():
            return ".".join(parts[:end])
    return ""


@cache
def graph() -> dict[str, tuple[Import, ...]]:
    """Every fpipe module with its edges to other fpipe modules (one per import statement and
    target, so a module imported twice, at load and in a function, has two edges)."""
    return {name: tuple(dict.fromkeys(imports(path))) for name, path in modules().items()}


def cycles(edges: dict[str, tuple[Import, ...]]) -> list[list[Import]]:
    """The import cycles of ``edges``: for every edge that lies on a cycle, the shortest cycle
    through it, each cycle once (an empty list when the graph has none)."""
    found: dict[frozenset[Import], list[Import]] = {}
    for edge in (edge for out in edges.values() for edge in out):
        back = _shortest_path(edges, edge.target, edge.source)
        if back is not None:
            found.setdefault(frozenset([edge, *back]), _rotated([edge, *back]))
    return sorted(found.values(), key=lambda cycle: (len(cycle), [str(e) for e in cycle]))


def chain(cycle: list[Import]) -> str:
    """A cycle as a chain of module names, each arrow with where the import stands."""
    steps = [f"{edge.source} -[{edge.where}, line {edge.line}]-> " for edge in cycle]
    return "".join(steps) + cycle[0].source


def _shortest_path(edges: dict[str, tuple[Import, ...]], start: str,
                   goal: str) -> list[Import] | None:
    """The fewest edges that lead from ``start`` to ``goal`` (breadth first), or ``None``."""
    paths: dict[str, list[Import]] = {start: []}
    frontier = deque([start])
    while frontier:
        name = frontier.popleft()
        if name == goal:
            return paths[name]
        for edge in edges.get(name, ()):
            if edge.target not in paths:
                paths[edge.target] = [*paths[name], edge]
                frontier.append(edge.target)
    return None


def _rotated(cycle: list[Import]) -> list[Import]:
    """The cycle started at its alphabetically first module, so each reads the same way."""
    first = min(range(len(cycle)), key=lambda i: cycle[i].source)
    return cycle[first:] + cycle[:first]
