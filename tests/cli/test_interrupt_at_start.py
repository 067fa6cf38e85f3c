"""Ctrl-C while the command starts (importing numpy, the layers, the subcommands, building its
parser): exit status 130 and one line, no traceback, for ``python -m fpipe`` and for the
console script.

The interrupt comes at a chosen import, deterministically: a ``sitecustomize`` module on
PYTHONPATH (run by the interpreter at start-up) sends the process SIGINT when that module is
first looked up, so the signal arrives in the middle of its import.
"""

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fpipe

from .conftest import ENV, make_dataset

ROOT = Path(fpipe.__file__).parents[1]

_SIGNAL_AT_IMPORT = """\
import os, signal, sys

class _InterruptAt:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["FPIPE_TEST_INTERRUPT_AT"]:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, _InterruptAt())
"""

# numpy and the layers load in fpipe/__init__.py, the subcommands in fpipe/cli.py, fpipe.sets
# while main() builds the parser, tqdm when 'info' has begun its work.
_POINTS = ["numpy", "fpipe.storage", "fpipe.cli.demo", "fpipe.sets", "tqdm"]


def _console_script(folder: Path) -> Path:
    """A copy of the ``fpipe`` script that pip makes from setup.cfg's entry point."""
    entry = configparser.ConfigParser()
    entry.read(ROOT / "setup.cfg")
    spec = entry["options.entry_points"]["console_scripts"].split("=", 1)[1].strip()
    module, function = spec.split(":")
    script = folder / "fpipe"
    script.write_text(f"import sys\nfrom {module} import {function}\n"
                      f"if __name__ == '__main__':\n    sys.exit({function}())\n")
    return script


@pytest.fixture(scope="module")
def hooks(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("interrupt")
    (folder / "sitecustomize.py").write_text(_SIGNAL_AT_IMPORT)
    _console_script(folder)
    return folder


@pytest.mark.parametrize("form", ["python -m fpipe", "console script"])
@pytest.mark.parametrize("point", _POINTS)
def test_ctrl_c_while_the_command_starts_exits_130_without_a_traceback(hooks, tmp_path, form, point):
    command = ([sys.executable, "-m", "fpipe"] if form == "python -m fpipe"
               else [sys.executable, str(hooks / "fpipe")])
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(hooks), str(ROOT)]),
           "FPIPE_TEST_INTERRUPT_AT": point}
    dataset = make_dataset(tmp_path / "set.msgpack", 3)
    result = subprocess.run([*command, "info", dataset], capture_output=True,
                            text=True, cwd=ROOT, env=env, timeout=120)
    assert result.returncode == 130, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().endswith("interrupted"), result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.parametrize("how", ["-c", "-m"])
def test_a_program_that_imports_fpipe_keeps_its_ctrl_c(tmp_path, how):
    # python -m mytool imports the package mytool, and so fpipe, while sys.argv[0] is "-m",
    # as python -m fpipe does
    code = ("import signal, fpipe.cli\n"
            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n")
    (tmp_path / "mytool").mkdir()
    (tmp_path / "mytool" / "__init__.py").write_text("import fpipe.cli\n")
    (tmp_path / "mytool" / "__main__.py").write_text(code)
    argv = ["-c", code] if how == "-c" else ["-m", "mytool"]
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    result = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                            cwd=tmp_path, env=env, timeout=120, check=True)
    assert result.stdout.split() == ["True"]
