"""A misspelled keyword argument, where fpipe passes keyword arguments on to another library
(tqdm's progress bar) or to the user's function, is a TypeError that names it, raised before
anything is created; a retry with the right spelling then works."""

from __future__ import annotations

import os
import pickle

import pytest

import fpipe
from fpipe.random import Sampler, _integers
from fpipe.storage import FileWriter, MsgpackReader, RawWriter, ShardedWriter, pack_sample


def _tree(folder) -> list[str]:
    return sorted(os.path.relpath(os.path.join(top, name), folder)
                  for top, folders, files in os.walk(folder) for name in folders + files)


WRITERS = {
    "FileWriter": lambda folder, **options: FileWriter(folder / "x.msgpack", **options),
    "RawWriter": lambda folder, **options: RawWriter(folder / "x.msgpack", **options),
    "ShardedWriter": lambda folder, **options: ShardedWriter(folder / "x", 2, **options),
}


@pytest.mark.parametrize("name", WRITERS)
def test_a_misspelled_writer_option_creates_nothing(name, tmp_path):
    (tmp_path / "other.txt").write_text("mine")
    before = _tree(tmp_path)
    with pytest.raises(TypeError, match=rf"^{name} got an unexpected keyword argument 'overwirte'"):
        WRITERS[name](tmp_path, overwirte=True)
    assert _tree(tmp_path) == before
    with WRITERS[name](tmp_path, overwrite=True, desc="retry", disable=True) as writer:
        if name == "RawWriter":
            writer.write("a", pack_sample({"key": "a"}))
        else:
            writer.write({"key": "a"})


@pytest.mark.parametrize("options", [{"ncols": "wide"}, {"file": 3}])
def test_a_bad_progress_bar_value_creates_nothing(options, tmp_path, capsys):
    before = _tree(tmp_path)
    name = next(iter(options))
    with pytest.raises(TypeError, match=rf"tqdm refused the progress bar options {name}="):
        FileWriter(tmp_path / "x.msgpack", **options)
    assert _tree(tmp_path) == before


def test_tqdm_options_still_reach_the_bar(tmp_path, capsys):
    with FileWriter(tmp_path / "x.msgpack", 0, False, desc="packing", total=2, ncols=60) as writer:
        writer.write({"key": "a"})
        writer.write({"key": "b"})
    assert "packing" in capsys.readouterr().err
    assert len(MsgpackReader(tmp_path / "x.msgpack")) == 2


def scale(x, factor=1):
    return x * factor


def pair(x, y, factor=1):
    return (x + y) * factor


COMBINATORS = {
    "unpack_args": lambda **kw: fpipe.unpack_args(pair, **kw),
    "multiply": lambda **kw: fpipe.multiply(scale, **kw),
    "apply_at": lambda **kw: fpipe.apply_at(0, scale, **kw),
    "zip_apply": lambda **kw: fpipe.zip_apply(scale, scale, **kw),
    "random_apply": lambda **kw: fpipe.random_apply(1.0, scale, **kw),
    "sample_args": lambda **kw: fpipe.sample_args(scale, **{k: fpipe.integers(v, v + 1)
                                                              for k, v in kw.items()}),
}
CALLS = {"unpack_args": ((1, 2), 9), "multiply": ((1, 2), (3, 6)), "apply_at": ((1, 2), (3, 2)),
         "zip_apply": ((1, 2), (3, 6)), "random_apply": (1, 3), "sample_args": (1, 3)}


@pytest.mark.parametrize("name", COMBINATORS)
def test_a_combinator_refuses_a_keyword_its_function_lacks(name):
    with pytest.raises(TypeError, match=rf"^{name} got an unexpected keyword argument 'factr' "
                                        r"\(.*go to (scale|pair)"):
        COMBINATORS[name](factr=3)
    transform = COMBINATORS[name](factor=3)
    given, expected = CALLS[name]
    assert transform(given) == expected
    assert pickle.loads(pickle.dumps(transform))(given) == expected


def test_functions_that_take_any_keyword_or_hide_their_signature_are_left_to_their_call():
    assert fpipe.multiply(lambda x, **kw: x + kw["n"], n=1)([1]) == (2,)
    assert fpipe.multiply(max, key=abs)([(-3, 2)]) == (-3,)  # max has no readable signature


def test_a_sampler_refuses_a_keyword_its_draw_lacks():
    with pytest.raises(TypeError, match="^Sampler got an unexpected keyword argument 'hihg'"):
        Sampler(_integers, 0, hihg=3)
    assert Sampler(_integers, 0, 3)(None) in range(3)
