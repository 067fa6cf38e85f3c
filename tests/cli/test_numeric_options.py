"""Every numeric option of every subcommand is checked when the command line is parsed: NaN,
infinities, fractions where a count is meant and counts that would start millions of threads
are refused with exit status 2 and a message naming the option, never a traceback or a value
quietly rounded."""

from __future__ import annotations

import argparse

import pytest

from fpipe.cli import _common, build_parser

from .conftest import make_dataset, mistake, ok

INTEGERS = (_common.positive_int, _common.non_negative_int)
NUMBERS = (_common.fraction, _common.positive_number, _common.buffer_size)


def numeric_options() -> list[tuple[str, argparse.Action]]:
    commands = build_parser()._subparsers._group_actions[0].choices
    return [(name, action) for name, parser in commands.items() for action in parser._actions
            if action.option_strings and action.type is not None]


def test_no_option_takes_a_bare_int_or_float():
    for name, action in numeric_options():
        assert action.type not in (int, float), (name, action.option_strings)


@pytest.mark.parametrize("name, action", numeric_options(),
                         ids=[f"{n} {a.option_strings[-1]}" for n, a in numeric_options()])
def test_every_numeric_option_refuses_what_is_not_its_kind(capsys, name, action):
    whole = action.type in INTEGERS or action.type.__name__.startswith("integer")
    bad = ["nan", "inf", "-inf", "1e400", "x", ""] + (["2.5", "1e3"] if whole else ["-1"])
    for value in bad:
        given = f"{action.option_strings[-1]}={value}"  # "-inf" alone would read as an option
        last = mistake(capsys, 2, name, given).strip().splitlines()[-1]
        assert last.startswith(f"fpipe {name}: error: argument {'/'.join(action.option_strings)}"
                               ": must be"), (value, last)


@pytest.mark.parametrize("value, message", [
    ("inf", "must be a finite number > 0; got 'inf'"), ("nan", "must be a number; got 'nan'"),
    ("2.5", "must be a fraction below 1 or a whole number of samples; got '2.5'"),
    ("0", "must be a finite number > 0; got '0'")])
def test_shuffle_buffer_size_is_a_fraction_or_a_whole_count(tmp_path, capsys, value, message):
    dataset = make_dataset(tmp_path / "set.msgpack", 20)
    assert message in mistake(capsys, 2, "shuffle", dataset, tmp_path / "out.msgpack",
                              "--mode", "quasi", "--buf-size", value)
    assert not (tmp_path / "out.msgpack").exists()


def test_shuffle_buffer_size_as_a_whole_number_written_as_a_float(tmp_path):
    dataset = make_dataset(tmp_path / "set.msgpack", 20)
    ok("shuffle", dataset, tmp_path / "out.msgpack", "--mode", "quasi", "--buf-size", "8.0", "-q")
    assert _common.buffer_size("8.0") == 8 and isinstance(_common.buffer_size("8.0"), int)


@pytest.mark.parametrize("argv, message", [
    (["write", "in", "out", "--workers", "100000000"], "must be between 1 and 256"),
    (["write", "in", "out", "--resize", "100000000"], "must be between 1 and 16384"),
    (["bench", "x", "--seconds", "nan"], "must be a number"),
    (["bench", "x", "--seed", "-1"], "must be >= 0"),
    (["split", "x", "--fractions", "0.5", "nan", "-o", "a", "b"], "must be a number"),
    (["demo", "--size", "1000000"], "must be between 1 and 1024")])
def test_options_that_would_hang_or_exhaust_memory(capsys, argv, message):
    assert message in mistake(capsys, 2, *argv)
