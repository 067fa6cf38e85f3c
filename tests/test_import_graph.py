"""No import cycles among fpipe's modules: at load time, inside functions, or for type checking.

A cycle held together by an import inside a function still ties two modules into one: neither
can be read, moved or tested without the other. The graph (``tests/import_graph.py``) is read
from the source; a package's ``__init__`` has an edge to each submodule it re-exports, so a
submodule that takes a name from its own package's ``__init__`` closes a cycle (take it from the
submodule that defines it instead).
"""

import ast

import pytest

from .import_graph import (
    AT_LOAD,
    IN_FUNCTION,
    TYPE_CHECKING,
    Import,
    chain,
    cycles,
    graph,
    import_statements,
    modules,
    targets,
)


def test_no_module_of_fpipe_imports_itself_in_a_circle():
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(chain(cycle) for cycle in found)


def _edges(*pairs: str) -> dict[str, tuple[Import, ...]]:
    edges: dict[str, list[Import]] = {}
    for line, pair in enumerate(pairs, 1):
        source, target = pair.split(" -> ")
        edges.setdefault(source, []).append(Import(source, target, line, AT_LOAD))
    return {name: tuple(out) for name, out in edges.items()}


def test_every_cycle_is_told_once_as_a_chain_from_its_first_module():
    edges = _edges("c -> a", "a -> b", "b -> c", "b -> d", "d -> b", "e -> a")
    found = cycles(edges)
    assert [[edge.source for edge in cycle] for cycle in found] == [["b", "d"], ["a", "b", "c"]]
    assert chain(found[0]) == "b -[at load, line 4]-> d -[at load, line 5]-> b"
    assert cycles(_edges("a -> b", "b -> c", "a -> c")) == []


def test_the_graph_sees_every_kind_of_import():
    edges = graph()
    def imported(module, where=None):
        return {e.target for e in edges[module] if where in (None, e.where)}
    # a package's __init__ points at the submodules it re-exports ("from . import x")
    assert {"fpipe.storage.format", "fpipe.storage.reader"} <= imported("fpipe.storage")
    assert {"fpipe.storage", "fpipe.streaming", "fpipe.image"} <= imported("fpipe")
    # relative imports at any depth, "from package import module", imports inside functions
    assert "fpipe.storage.shuffling" in imported("fpipe.torch")
    assert "fpipe.storage.writer" in imported("fpipe.storage.recovery", AT_LOAD)
    assert "fpipe.storage.remote" in imported("fpipe.storage._foreign", IN_FUNCTION)
    assert "fpipe.torch" in imported("fpipe._commands.demo", IN_FUNCTION)
    assert "fpipe.sets" in imported("fpipe._commands.write", TYPE_CHECKING)
    assert set(edges) == set(modules()) and "fpipe" in edges


@pytest.mark.parametrize(("statement", "named"), [
    ("from . import format", ["fpipe.storage.format"]),
    # a name from the package's __init__: an edge to the package, which imports its submodules
    ("from . import Budget, reader", ["fpipe.storage", "fpipe.storage.reader"]),
    ("from .. import errors", ["fpipe.errors"]),
    ("from ..streaming._core import Stream", ["fpipe.streaming._core"]),
    ("from fpipe.storage.format import pack_sample", ["fpipe.storage.format"]),
    ("import fpipe.storage.remote as remote", ["fpipe.storage.remote"]),
    ("import numpy, fpipe", ["fpipe"]),
    ("from msgpack import packb", []),
])
def test_an_import_names_the_module_it_runs(statement, named):
    assert targets(ast.parse(statement).body[0], "fpipe.storage") == named


def test_imports_are_told_apart_by_when_they_run():
    source = (
        "import fpipe.errors\n"
        "if TYPE_CHECKING:\n    from . import remote\nelse:\n    from . import writer\n"
        "def f():\n    from .format import x\n"
        "class C:\n    def m(self):\n        import fpipe.random\n"
    )
    found = [(ast.unparse(node), where) for node, where in import_statements(ast.parse(source))]
    assert found == [("import fpipe.errors", AT_LOAD), ("from . import remote", TYPE_CHECKING),
                     ("from . import writer", AT_LOAD), ("from .format import x", IN_FUNCTION),
                     ("import fpipe.random", IN_FUNCTION)]
