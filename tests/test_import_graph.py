"""No import cycles among fpipe's modules: at load time, inside functions, or for type checking.

A cycle held together by an import inside a function still ties two modules into one: neither
can be read, moved or tested without the other. The graph (``tests/import_graph.py``) is read
from the source; a package's ``__init__`` has an edge to each submodule it re-exports, so a
submodule that takes a name from its own package's ``__init__`` closes a cycle (take it from the
submodule that defines it instead).
"""

import ast
import subprocess
import sys

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


def test_every_module_imports_first_in_a_fresh_interpreter():
    # importing a.b.c runs a and a.b first: a package's __init__ that re-exports could close a
    # circle the graph above does not draw, and only the first import in a process shows it
    names = sorted(name for name in modules() if name not in ("fpipe.__main__",))
    code = ("import importlib, sys\n"
            "for name in sys.argv[1:]:\n"
            "    for loaded in [m for m in sys.modules if m == 'fpipe' or m.startswith('fpipe.')]:\n"
            "        del sys.modules[loaded]\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except ImportError as error:\n"
            "        print(name, '->', error)\n")
    result = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "", result.stdout


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
    assert {"fpipe.dataset.format", "fpipe.dataset.reader"} <= imported("fpipe.dataset")
    assert {"fpipe.dataset", "fpipe.stream", "fpipe.image"} <= imported("fpipe")
    # relative imports at any depth, "from package import module", imports inside functions
    assert "fpipe.dataset.shuffling" in imported("fpipe.torch")
    assert "fpipe.dataset.writer" in imported("fpipe.dataset.recovery", AT_LOAD)
    assert "fpipe.remote.urls" in imported("fpipe.formats._foreign", IN_FUNCTION)
    assert "fpipe.torch" in imported("fpipe.cli.demo", IN_FUNCTION)
    assert "fpipe.sets" in imported("fpipe.cli.write", TYPE_CHECKING)
    assert set(edges) == set(modules()) and "fpipe" in edges


@pytest.mark.parametrize(("statement", "named"), [
    ("from . import format", ["fpipe.dataset.format"]),
    # a name from the package's __init__: an edge to the package, which imports its submodules
    ("from . import FileWriter, reader", ["fpipe.dataset", "fpipe.dataset.reader"]),
    ("from .. import errors", ["fpipe.errors"]),
    ("from ..stream.core import Stream", ["fpipe.stream.core"]),
    ("from fpipe.dataset.format import pack_sample", ["fpipe.dataset.format"]),
    ("import fpipe.remote.urls as remote", ["fpipe.remote.urls"]),
    ("import numpy, fpipe", ["fpipe"]),
    ("from msgpack import packb", []),
])
def test_an_import_names_the_module_it_runs(statement, named):
    assert targets(ast.parse(statement).body[0], "fpipe.dataset") == named


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
