"""Examples and error messages of the combinators in fpipe.functional."""

import pickle

import numpy as np
import pytest
import toolz

import fpipe
from fpipe import apply_at, compose, multiply, random_apply, sample_args, unpack_args, zip_apply
from fpipe.errors import MissingParameterError
from fpipe.functional import Compose
from fpipe.random import item_rng, uniform, using_rng


def add(x, number):
    return x + number


def sub(x, value):
    return x - value


def resize(x, size, fill=0):
    return (x, size, fill)


def test_compose_runs_first_to_last_unlike_toolz_compose():
    assert compose(str, len)(12345) == 5
    assert toolz.compose(len, str)(12345) == 5


def test_compose_routes_prefixed_parameters_under_their_own_names():
    masked = Compose(resize, prefix="mask_")
    assert masked("m", {"mask_size": 4, "size": 99}) == ("m", 4, 0)
    assert masked("m", {"mask_size": 4, "mask_fill": 1}) == ("m", 4, 1)


def test_datadings_compose_example_runs():
    transforms = {"a": Compose(add), "b": Compose(sub), "c": Compose((add, sub))}
    params = {"number": 3, "value": 5}
    sample = {k: 0 for k in transforms}
    assert {k: t(sample[k], params) for k, t in transforms.items()} == {"a": 3, "b": -5, "c": -2}


def test_missing_parameter_names_parameter_key_and_function():
    with pytest.raises(MissingParameterError) as info:
        Compose(resize, prefix="mask_")("m", {"size": 4})
    assert isinstance(info.value, KeyError)
    assert str(info.value) == "resize needs parameter 'size': key 'mask_size' is missing from params"
    assert (info.value.parameter, info.value.key) == ("size", "mask_size")


def test_missing_parameter_without_params_mapping():
    with pytest.raises(MissingParameterError, match="add needs parameter 'number'"):
        compose(add)(1)


def test_function_without_parameters_is_rejected_when_composing():
    def constant():
        return 1

    with pytest.raises(ValueError, match="constant takes no positional parameter"):
        compose(constant)


def test_keyword_only_function_is_rejected_when_composing():
    def only(*, x):
        return x

    with pytest.raises(ValueError, match="only takes no positional parameter"):
        compose(only)


def test_compose_rejects_non_callables_and_bad_prefix():
    with pytest.raises(TypeError, match="transform must be callable; got transform=3"):
        compose(abs, 3)
    with pytest.raises(TypeError, match="prefix must be a str; got prefix=1"):
        compose(abs, prefix=1)


def test_compose_accepts_ufuncs_and_builtins_as_value_only():
    assert compose(np.square, int)(3) == 9


def test_compose_flattens_and_prefixes_nest():
    inner = Compose(resize, prefix="in_")
    outer = Compose(abs, inner, prefix="out_")
    assert outer.funcs == (abs, resize)
    assert outer(-2, {"out_in_size": 7}) == (2, 7, 0)


def test_compose_repr_and_pickle():
    c = Compose(abs, Compose(resize, prefix="mask_"))
    assert repr(c) == "Compose(abs, Compose(resize, prefix='mask_'))"
    clone = pickle.loads(pickle.dumps(c))
    assert clone == c and clone(-1, {"mask_size": 2}) == (1, 2, 0)


def test_wrappers_put_call_time_arguments_before_bound_ones():
    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        return args

    unpack_args(record, "bound")([1, 2], "call")
    multiply(record, "bound")([1], "call")
    apply_at(0, record, "bound")([1], "call")
    assert [c[0] for c in calls] == [(1, 2, "call", "bound"), (1, "call", "bound"),
                                     (1, "call", "bound")]


def test_apply_at_errors_name_the_index():
    with pytest.raises(IndexError, match="index 3 is out of range for an input of length 3"):
        apply_at(3, abs)([1, 2, 3])
    with pytest.raises(IndexError, match="index -4"):
        apply_at([0, -4], abs)([1, 2, 3])
    with pytest.raises(KeyError, match="'image' is not a key"):
        apply_at("image", abs)({"label": 1})
    with pytest.raises(ValueError, match="index must name at least one position"):
        apply_at([], abs)


def test_apply_at_applies_once_to_coinciding_positions():
    assert apply_at([0, -3], lambda x: x + 1)([1, 2, 3]) == (2, 2, 3)


def test_zip_apply_refuses_length_mismatch_instead_of_truncating():
    with pytest.raises(ValueError, match="zip_apply has 2 functions but the input has 3 values"):
        zip_apply(abs, abs)([1, 2, 3])
    with pytest.raises(TypeError, match=r"functions\[1\] must be callable"):
        zip_apply(abs, 2)


def test_zip_apply_passes_keywords_to_every_function():
    assert zip_apply(round, round, ndigits=1)([1.26, 2.71]) == (1.3, 2.7)


def test_random_apply_checks_p_at_construction():
    for p in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="p must be a probability in"):
            random_apply(p, abs)
    for p in ("0.5", None, True):
        with pytest.raises(TypeError, match="p must be a real number; got p="):
            random_apply(p, abs)


def test_random_apply_returns_inputs_unchanged_when_not_applied():
    assert random_apply(0.0, max)(1, 2) == (1, 2)
    assert random_apply(0.0, abs)(-1) == -1


def test_random_apply_does_not_touch_global_numpy_state():
    before = np.random.get_state()[1].copy()
    for _ in range(20):
        random_apply(0.5, abs)(-1)
        sample_args(add, number=fpipe.random.uniform())(1)
    assert (np.random.get_state()[1] == before).all()


def test_sample_args_accepts_dpipe_and_fpipe_samplers():
    shifted = sample_args(add, number=lambda: 10)
    assert shifted(1) == 11
    with using_rng(item_rng(3, 0, 0)):
        first = sample_args(add, number=lambda rng: int(rng.integers(1000)))(0)
    with using_rng(item_rng(3, 0, 0)):
        assert sample_args(add, number=fpipe.random.integers(1000))(0) == first


def test_sample_args_rejects_non_callable_samplers():
    with pytest.raises(TypeError, match="number must be callable; got number=3"):
        sample_args(add, number=3)
    # a name the function does not take is that error first, whatever its value
    with pytest.raises(TypeError, match="^sample_args got an unexpected keyword argument 'angle'"):
        sample_args(add, angle=3)


def test_combinators_reject_non_callable_functions():
    for factory in (unpack_args, multiply):
        with pytest.raises(TypeError, match="func must be callable; got func=1"):
            factory(1)


def test_reprs_are_readable():
    assert repr(apply_at(0, abs)) == "apply_at(0, abs)"
    assert repr(random_apply(0.5, abs)) == "random_apply(0.5, abs)"
    assert repr(sample_args(add, number=uniform(0, 2))) == "sample_args(add, number=uniform(0, 2))"
    assert repr(zip_apply(abs, str)) == "zip_apply(abs, str)"
    assert repr(unpack_args(pow, 2)) == "unpack_args(pow, 2)"
