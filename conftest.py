"""Loaded for every test under the repository (tests, property tests, doctests): the guard that
fails a test which leaves the test process handling a signal differently (``tests/signals.py``),
and one temporary folder for the whole run, removed at its end.

Doctests make folders with ``tempfile.mkdtemp()``, servers put their sockets in the temporary
folder, and worker processes make theirs: each run of the suite used to leave a hundred entries
in ``/tmp``. So the run sets ``TMPDIR`` (inherited by every process it starts) and
``tempfile.tempdir`` to a folder of its own, with pytest's ``tmp_path`` folders in it (paths
short enough for the sockets of worker processes), and removes it when the run is over, with
the empty folders that libraries make at fixed paths in ``/tmp`` during the run.
"""

import os
import shutil
import tempfile

import pytest

pytest_plugins = ["pytester", "tests.signals"]

_SAVED = "_fpipe_saved_tmpdir"
# folders that libraries make at a fixed path whatever TMPDIR says: wids makes this one when it
# is imported (a default argument); removed at the end if the run made it and it is empty
_FIXED_FOLDERS = ("/tmp/_wids_cache",)


@pytest.hookimpl(tryfirst=True)  # before pytest's tmp_path factory reads --basetemp
def pytest_configure(config):
    folder = tempfile.mkdtemp(prefix="fp-")
    made_by_others = [path for path in _FIXED_FOLDERS if os.path.exists(path)]
    setattr(config, _SAVED, (folder, os.environ.get("TMPDIR"), tempfile.tempdir, made_by_others))
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    if config.option.basetemp is None:
        # short paths: a worker's socket under a test's tmp_path must fit in 108 bytes
        config.option.basetemp = os.path.join(folder, "t")


def pytest_unconfigure(config):
    saved = getattr(config, _SAVED, None)
    if saved is None:
        return
    folder, environ, tempdir, made_by_others = saved
    if environ is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = environ
    tempfile.tempdir = tempdir
    shutil.rmtree(folder, ignore_errors=True)
    for path in set(_FIXED_FOLDERS) - set(made_by_others):
        try:
            os.rmdir(path)  # only if empty
        except OSError:
            pass
