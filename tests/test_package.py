"""The package as users meet it: imports, public names, the console script."""

import ast
import builtins
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fpipe

from .import_graph import imports, module_name

PACKAGE = Path(fpipe.__file__).parent
HEAVY = ("torch", "lightning", "pytorch_lightning", "dask", "PIL", "fsspec", "s3fs", "botocore",
         "pyarrow", "crc32c", "google_crc32c")


def test_import_fpipe_imports_no_heavy_dependency():
    code = "import fpipe, sys; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    heavy = [name for name in loaded if name.split(".")[0] in HEAVY]
    assert heavy == [], heavy


def _public_modules():
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="fpipe."):
        leaf = info.name.rsplit(".", 1)[-1]
        if not leaf.startswith("_") and info.name not in ("fpipe.cli", "fpipe.torch"):
            yield info.name


@pytest.mark.parametrize("name", sorted(_public_modules()))
def test_every_module_declares_a_sorted_all_of_existing_names(name):
    module = importlib.import_module(name)
    assert list(module.__all__) == sorted(module.__all__), name
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == [], missing


PACKAGES = ("fpipe.dataset", "fpipe.formats", "fpipe.orderings", "fpipe.stream")

# dpipe's batch-iterator names (ported code imports them from fpipe) and datadings' reader,
# writer and torch names (from fpipe.storage and fpipe.torch)
DPIPE_NAMES = ("ExpirationPool", "Infinite", "Iterator", "Loky", "Threads", "apply_at",
               "combine_batches", "combine_pad", "combine_to_arrays", "expiration_pool",
               "load_by_random_id", "multiply", "pad_batch_equal", "random_apply", "sample",
               "sample_args", "unpack_args", "zip_apply")
DATADINGS_NAMES = {
    "fpipe.storage": ("Cycler", "DirectoryReader", "FileWriter", "ListReader", "MsgpackReader",
                      "QuasiShuffler", "Range", "RawWriter", "Reader", "Repeater",
                      "ShardedReader", "Shuffler", "Writer", "ZipFileReader"),
    "fpipe.torch": ("Compose", "CompressedToPIL", "Dataset", "DatasetBase", "IterableDataset",
                    "dict2tuple", "get_worker_info", "no_rng"),
}


def test_the_top_level_is_a_short_curated_list():
    assert len(fpipe.__all__) <= 60
    assert fpipe.__all__ == sorted(fpipe.__all__)
    assert all(hasattr(fpipe, name) for name in fpipe.__all__)
    # no name at the top shadows a builtin (the stages map and filter live in fpipe.stream)
    assert {"map", "filter"} & set(fpipe.__all__) == set()
    assert all(not hasattr(builtins, name) for name in fpipe.__all__ if name != "__version__")


def test_each_package_reexports_every_public_name_of_its_modules():
    for package in map(importlib.import_module, PACKAGES):
        for module in package._PUBLIC_MODULES:
            absent = [n for n in module.__all__ if getattr(package, n, None) is not getattr(module, n)]
            assert absent == [], (package.__name__, module.__name__, absent)
        assert package.__all__ == sorted(package.__all__)


def test_the_seeds_names_are_where_ported_code_imports_them():
    assert set(DPIPE_NAMES) <= set(fpipe.__all__)
    for module, names in DATADINGS_NAMES.items():
        assert all(hasattr(importlib.import_module(module), name) for name in names), module


SURFACE = ("fpipe", "fpipe.dataset", "fpipe.formats", "fpipe.orderings", "fpipe.stream",
           "fpipe.remote", "fpipe.image", "fpipe.infinite", "fpipe.functional", "fpipe.random",
           "fpipe.sharding", "fpipe.skipping", "fpipe.stateful", "fpipe.files", "fpipe.storage",
           "fpipe.prepare")


def _public_objects():
    """``label: object`` for every public name of fpipe and of its packages and core modules
    (what users import), labelled by the first module that exports it."""
    found, seen = {}, set()
    for name in SURFACE:
        module = importlib.import_module(name)
        for attribute in module.__all__:
            value = getattr(module, attribute)
            if id(value) not in seen:
                seen.add(id(value))
                found[f"{name}.{attribute}"] = value
    return found


def _needs_example(obj) -> bool:
    is_exception = isinstance(obj, type) and issubclass(obj, BaseException)
    return callable(obj) and obj.__module__.startswith("fpipe") and not is_exception


def test_every_public_function_has_a_docstring_with_an_example():
    lacking = [label for label, obj in _public_objects().items()
               if _needs_example(obj) and ">>>" not in (obj.__doc__ or "")]
    assert lacking == [], f"public names without a runnable example: {lacking}"


def _parameters(func, bound: bool = False) -> int | None:
    """How many parameters ``func`` takes, ``*args`` and ``**kwargs`` not counted (nor the
    ``self`` of a method, ``bound``); None where Python cannot tell (a builtin's)."""
    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return None
    if bound and parameters and parameters[0].kind is not parameters[0].VAR_POSITIONAL:
        parameters = parameters[1:]
    return sum(p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters)


def _signatures():
    """``label: parameters`` for every public callable of the surface and fpipe.torch, and for
    the public methods (and ``__call__``) that fpipe's public classes define."""
    import fpipe.torch

    objects = _public_objects()
    seen = {id(obj) for obj in objects.values()}
    objects.update((f"fpipe.torch.{name}", getattr(fpipe.torch, name))
                   for name in fpipe.torch.__all__ if id(getattr(fpipe.torch, name)) not in seen)
    counts = {}
    for label, obj in objects.items():
        if not callable(obj):
            continue
        counts[label] = _parameters(obj)
        if not isinstance(obj, type):
            continue
        for klass in obj.__mro__:
            if not klass.__module__.startswith("fpipe"):
                continue
            for name, member in vars(klass).items():
                if (name.startswith("_") and name != "__call__") or f"{label}.{name}" in counts:
                    continue
                if isinstance(member, (staticmethod, classmethod)):
                    counts[f"{label}.{name}"] = _parameters(member.__func__, isinstance(member, classmethod))
                elif inspect.isfunction(member):
                    counts[f"{label}.{name}"] = _parameters(member, bound=True)
    return counts


def test_no_public_signature_has_more_than_ten_parameters():
    """Options come as values (frozen option classes, keyword-only parameters) rather than as
    long signatures; every parameter counts but ``*args``, ``**kwargs`` and ``self``, the seeds'
    own ones too (datadings's IterableDataset has 8)."""
    counts = _signatures()
    assert {"fpipe.torch.IterableDataset", "fpipe.torch.Samples", "fpipe.processes",
            "fpipe.threads", "fpipe.MsgpackReader"} <= set(counts)
    wide = {label: n for label, n in counts.items() if n is not None and n > 10}
    assert wide == {}, f"public signatures over 10 parameters: {wide}"


def test_py_typed_is_shipped():
    assert (PACKAGE / "py.typed").exists()


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_torch_adapter_imports_torch_at_module_level():
    offenders = [str(p) for p in PACKAGE.rglob("*.py")
                 if p.parent != PACKAGE / "torch" and "torch" in _top_level_imports(p)]
    assert offenders == []


def test_no_module_imports_another_modules_private_names():
    # a module that another one needs offers it without an underscore (outside __all__ if
    # users do not need it); renaming a private helper never breaks a neighbour
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("fpipe")):
                offenders += [f"{path.relative_to(PACKAGE)}: {alias.name}" for alias in node.names
                              if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert offenders == []


CONSOLE_SCRIPT = Path(sys.executable).with_name("fpipe")


@pytest.mark.parametrize("command", [[str(CONSOLE_SCRIPT)], [sys.executable, "-m", "fpipe"]],
                         ids=["console-script", "python-m"])
def test_version_and_help(command):
    version = subprocess.run([*command, "--version"], capture_output=True, text=True,
                             check=True).stdout
    assert version.strip() == f"fpipe {fpipe.__version__}"
    helped = subprocess.run([*command, "--help"], capture_output=True, text=True, check=True).stdout
    assert "usage: fpipe" in helped


def test_command_without_subcommand_is_a_usage_error():
    result = subprocess.run([sys.executable, "-m", "fpipe"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage: fpipe" in result.stderr


# --- layers (docs/architecture.md): an import reaches only the rows its own row may import -----

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def layer_table(page: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """``({top-level module: row}, {row: rows it may import})`` from the table under
    "## Layers" of the architecture page: a row's first cell is its rank and name ("3
    dataset"), its second the modules in backticks, its third the rows it may import ("every
    layer" for all)."""
    section = page.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows, allowed = {}, {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0][:1].isdigit():
            continue  # the prose, the header and its rule
        row = cells[0].partition(" ")[2]
        rows.update({module: row for module in re.findall(r"`([\w.]+)`", cells[1])})
        allowed[row] = {name.strip() for name in cells[2].split(",")}
    every = set(allowed)
    return rows, {row: every if names == {"every layer"} else names
                  for row, names in allowed.items()}


ROWS, ALLOWED = layer_table(ARCHITECTURE.read_text(encoding="utf-8"))


def _row(module: str) -> str:
    """The row of a module named relative to the package (its top-level name's row)."""
    return ROWS[module.split(".")[0]]


def test_every_module_of_fpipe_has_a_row_in_the_layer_table():
    tops = {module_name(path).split(".")[1] for path in PACKAGE.rglob("*.py")
            if module_name(path) != "fpipe"}
    assert tops - set(ROWS) == set(), "add these modules to docs/architecture.md's table"
    assert set(ROWS) - tops == set(), "the layer table names modules that do not exist"
    assert set().union(*ALLOWED.values()) <= set(ALLOWED), "a row may import a row that is not there"


def _fpipe_imports(path: Path) -> set[str]:
    """The fpipe modules that ``path`` imports anywhere (also inside functions), named
    relative to the package."""
    return {edge.target.partition(".")[2] for edge in imports(path)} - {""}


def test_imports_reach_only_the_rows_their_row_may_import():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        module = module_name(path).partition(".")[2]
        if not module:
            continue  # the package's __init__ gathers the everyday names
        offenders += [f"{module} imports {target}" for target in _fpipe_imports(path)
                      if _crosses(module, target)]
    assert offenders == [], "\n".join(sorted(offenders))


def _crosses(module: str, target: str) -> bool:
    return _row(target) not in {_row(module), *ALLOWED[_row(module)]}


def test_the_layer_check_sees_what_it_must():
    assert _crosses("stream.sources", "dataset.reader")
    assert _crosses("dataset._staging", "stream") and _crosses("remote.urls", "dataset.format")
    assert _crosses("sharding", "stream.core") and _crosses("stream.simple", "torch")
    assert _crosses("dataset.reader", "formats.parquet") and _crosses("orderings.order", "dataset")
    assert not _crosses("torch", "orderings.order") and not _crosses("stream.parallel", "errors")
    assert not _crosses("formats.parquet", "dataset.sharded") and not _crosses("cli", "torch")
    # relative imports at any depth, and imports inside functions, are seen
    assert "dataset.shuffling" in _fpipe_imports(PACKAGE / "torch" / "__init__.py")
    assert {"stream.core", "errors"} <= _fpipe_imports(PACKAGE / "stream" / "parallel" / "stages.py")
    assert "torch" in _fpipe_imports(PACKAGE / "cli" / "demo.py")


def test_only_the_joblib_module_imports_joblib():
    offenders = [str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                 if path.name != "_joblib.py" and "joblib" in _imported_roots(path)]
    assert offenders == []


def test_only_the_remote_module_imports_fsspec():
    offenders = [str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                 if path != PACKAGE / "remote" / "urls.py" and "fsspec" in _imported_roots(path)]
    assert offenders == []
    assert "fsspec" in _imported_roots(PACKAGE / "remote" / "urls.py")  # imports inside functions count


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def _stream_private_names() -> set[str]:
    """The underscore attributes of the Stream base class, except the hooks a subclass writes."""
    stream = fpipe.as_stream([])
    names = {name for name in [*vars(fpipe.Stream), *vars(stream)] if name.startswith("_")
             and not name.startswith("__")}
    return names - {"_pull", "_close", "_own_state", "_own_loader"}


def _stream_classes(trees: list) -> set[str]:
    bases = {node.name: {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
             for tree in trees for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    streams, grown = {"Stream"}, True
    while grown:
        more = {name for name, of in bases.items() if of & streams} - streams
        streams, grown = streams | more, bool(more)
    return streams


def test_nothing_outside_the_stream_core_touches_a_streams_private_attributes():
    private = _stream_private_names()
    assert {"_buffer", "_error", "_meter", "_reader"} <= private
    paths = [p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "stream" / "core.py"]
    trees = {path: ast.parse(path.read_text()) for path in paths}
    streams = _stream_classes(list(trees.values()))
    offenders = []
    for path, tree in trees.items():
        for cls in [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]:
            if cls.name in streams:
                offenders += [f"{path.name}: {cls.name}.{node.attr}" for node in ast.walk(cls)
                              if isinstance(node, ast.Attribute) and node.attr in private]
        offenders += [f"{path.name}: {ast.unparse(node)}" for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and node.attr in private
                      and not (isinstance(node.value, ast.Name) and node.value.id == "self")]
    assert offenders == []


def test_no_two_classes_of_fpipe_share_a_name():
    # two KeyIndex and two Plan classes once made a reader of one module misread another's
    homes: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                homes.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    assert {name: where for name, where in homes.items() if len(where) > 1} == {}
