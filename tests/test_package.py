"""The package as users meet it: imports, public names, the console script."""

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import fpipe

PACKAGE = Path(fpipe.__file__).parent
HEAVY = ("torch", "lightning", "pytorch_lightning", "dask", "PIL", "fsspec", "s3fs", "botocore")


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


def test_top_level_reexports_every_public_name_of_its_modules():
    for module in fpipe._PUBLIC_MODULES:
        absent = [n for n in module.__all__ if getattr(fpipe, n, None) is not getattr(module, n)]
        assert absent == [], (module.__name__, absent)
    assert fpipe.__all__ == sorted(fpipe.__all__)
    assert all(hasattr(fpipe, name) for name in fpipe.__all__)


def _needs_example(obj) -> bool:
    is_exception = isinstance(obj, type) and issubclass(obj, BaseException)
    return callable(obj) and obj.__module__.startswith("fpipe") and not is_exception


def test_every_public_function_has_a_docstring_with_an_example():
    lacking = [name for name in fpipe.__all__ if _needs_example(getattr(fpipe, name))
               and ">>>" not in (getattr(fpipe, name).__doc__ or "")]
    assert lacking == [], f"public names without a runnable example: {lacking}"


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
                 if p.name != "torch.py" and "torch" in _top_level_imports(p)]
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
