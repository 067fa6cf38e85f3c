"""Loaded for every test under the repository (tests, property tests, doctests): the guard that
fails a test which leaves the test process handling a signal differently (``tests/signals.py``)."""

pytest_plugins = ["pytester", "tests.signals"]
