"""The exceptions fpipe raises, and how a worker's exception reaches the consumer whole.

Errors refine the built-in they mean, so ``except ValueError`` keeps working:

>>> issubclass(FormatError, ValueError) and issubclass(FormatError, FpipeError)
True

A worker (thread or process) that fails hands the consumer a :class:`CapturedError`; its
:meth:`~CapturedError.reraise` raises the original exception, with the worker's formatted
traceback chained as the cause:

>>> try:
...     1 / 0
... except ZeroDivisionError as error:
...     captured = capture(error)
>>> try:
...     captured.reraise()
... except ZeroDivisionError as error:
...     print(type(error.__cause__).__name__, "division by zero" in str(error.__cause__))
RemoteTraceback True
"""

from __future__ import annotations

import inspect
import numbers
import os
import pickle
import re
import traceback
import urllib.parse
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

import numpy as np

__all__ = [
    "CapturedError",
    "FormatError",
    "FpipeError",
    "MissingParameterError",
    "RemoteTraceback",
    "WorkerError",
    "capture",
]


class FpipeError(Exception):
    """Base class of every exception that fpipe defines."""


class FormatError(FpipeError, ValueError):
    """A packed dataset is corrupt or truncated.

    Carries ``path`` (the file), ``offset`` (the byte offset, or None) and ``index`` (the
    sample index, or None), and names them in its message.

    >>> error = FormatError("incomplete sample", path="x.msgpack", offset=1024, index=7)
    >>> str(error)
    'x.msgpack: sample 7 at byte 1024: incomplete sample'
    >>> error.offset, error.index
    (1024, 7)
    """

    def __init__(self, message: str, *, path=None, offset: int | None = None,
                 index: int | None = None) -> None:
        self.reason, self.path, self.offset, self.index = message, path, offset, index
        super().__init__(_with_location(message, path, offset, index))

    def __reduce__(self):
        return _rebuild_format_error, (self.reason, self.path, self.offset, self.index)


def _rebuild_format_error(message, path, offset, index) -> FormatError:
    return FormatError(message, path=path, offset=offset, index=index)


def _with_location(message: str, path, offset, index) -> str:
    sample = f"sample {index}" if index is not None else ""
    byte = f"byte {offset}" if offset is not None else ""
    where = " at ".join(filter(None, [sample, byte]))
    parts = (redacted_url(str(path)) if path is not None else None, where, message)
    return ": ".join(str(part) for part in parts if part not in (None, ""))


class MissingParameterError(FpipeError, KeyError):
    """A composed transform needs a parameter that the params mapping does not hold.

    A ``KeyError`` (as in datadings) that names the parameter, the key looked up and the function.

    >>> str(MissingParameterError("size", "mask_size", "resize"))
    "resize needs parameter 'size': key 'mask_size' is missing from params"
    """

    def __init__(self, parameter: str, key: str, function: str) -> None:
        self.parameter, self.key, self.function = parameter, key, function
        super().__init__(parameter, key, function)

    def __str__(self) -> str:
        return (f"{self.function} needs parameter {self.parameter!r}: "
                f"key {self.key!r} is missing from params")


class RemoteTraceback(FpipeError):
    """The formatted traceback of an exception raised in a worker, chained as its cause."""

    def __str__(self) -> str:
        return "\n\n" + str(self.args[0]) if self.args else ""


class WorkerError(FpipeError, RuntimeError):
    """Stands in for a worker's exception that could not be carried back as itself
    (it did not pickle); the message names the original type and message."""


class CapturedError:
    """A worker's exception and its formatted traceback, ready to cross a thread or process.

    Use :func:`capture` to make one and :meth:`reraise` in the consumer. It pickles; an
    exception that does not is carried as a :class:`WorkerError` naming its type and message.

    >>> import pickle
    >>> pickle.loads(pickle.dumps(capture(KeyError("k"))))
    CapturedError(KeyError('k'))
    """

    __slots__ = ("error", "traceback")

    def __init__(self, error: BaseException, traceback_text: str) -> None:
        self.error, self.traceback = error, traceback_text

    def __reduce__(self):
        return CapturedError, (_picklable(self.error), self.traceback)

    def __repr__(self) -> str:
        return f"CapturedError({self.error!r})"

    def reraise(self) -> NoReturn:
        """Raise the original exception, the worker's traceback chained as its cause."""
        raise self.error.with_traceback(None) from RemoteTraceback(self.traceback)


def capture(error: BaseException) -> CapturedError:
    """Wrap ``error`` with its formatted traceback, for :meth:`CapturedError.reraise` elsewhere.

    An error that a worker's :meth:`~CapturedError.reraise` raised, captured again on its
    way (by a background stage that reads a worker stage), keeps the worker's traceback: the
    consumer gets it once, not wrapped in the frames of each hop.

    >>> capture(ValueError("bad")).error
    ValueError('bad')
    """
    if isinstance(error.__cause__, RemoteTraceback) and error.__cause__.args:
        return CapturedError(error, error.__cause__.args[0])
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return CapturedError(error, text)


def close_after(close: Callable[[], object], error: BaseException) -> None:
    """``close()`` what ``error`` ends, without hiding ``error``: an error in closing is chained
    to the end of ``error``'s context, so that ``error`` stays the exception raised and its
    traceback still shows the other. Not in ``__all__``: streams and ``Infinite`` close so.

    >>> def close():
    ...     raise OSError("close failed")
    >>> error = ValueError("the loop failed")
    >>> close_after(close, error)
    >>> error.__context__
    OSError('close failed')
    """
    try:
        close()
    except BaseException as later:
        if later.__context__ is error:  # raised while error was handled: no loop
            later.__context__ = None
        last, seen = error, {id(error)}
        while last.__context__ is not None and id(last.__context__) not in seen:
            last = last.__context__
            seen.add(id(last))
        if id(later) not in seen:
            last.__context__ = later


def _picklable(error: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return WorkerError(f"{type(error).__module__}.{type(error).__qualname__}: {error}")
    return error


def check_integer(name: str, value: Any, low: int | None = None) -> int:
    """``value`` as an int, once it is an integer (``>= low`` if given); otherwise a
    ``TypeError`` or ``ValueError`` that names the argument. Not in ``__all__``: fpipe's
    modules check their arguments with it.

    >>> check_integer("n_workers", 0, 1)
    Traceback (most recent call last):
    ...
    ValueError: n_workers must be >= 1; got n_workers=0
    >>> check_integer("epoch", np.int64(3), 0)
    3
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer; got {name}={value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}; got {name}={value!r}")
    return int(value)


def check_workers(n_workers: Any) -> int:
    """``n_workers`` as an int, once it is an integer >= 1 or -1 (one per core); otherwise a
    ``TypeError`` or ``ValueError`` that names the argument.

    >>> check_workers(-1), check_workers(np.int8(2))
    (-1, 2)
    """
    if n_workers == -1 and not isinstance(n_workers, (bool, np.bool_)):
        return -1
    check_integer("n_workers", n_workers)
    if n_workers < 1:
        raise ValueError(f"n_workers must be >= 1 or -1; got n_workers={n_workers!r}")
    return int(n_workers)


def check_auto(name: str, value: Any, check: Callable[[Any], Any]) -> Any:
    """``"auto"``, or ``value`` once ``check(value)`` accepts it (and what it returns); another
    string is a ``ValueError`` that names the argument.

    >>> check_auto("buffer_size", "auto", int), check_auto("buffer_size", 3, int)
    ('auto', 3)
    >>> check_auto("n_workers", "all", check_workers)
    Traceback (most recent call last):
    ...
    ValueError: n_workers must be an integer or 'auto'; got n_workers='all'
    """
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f"{name} must be an integer or 'auto'; got {name}={value!r}")
        return value
    return check(value)


def check_positive(name: str, value: Any) -> float:
    """``value`` as a float, once it is a real number > 0; otherwise a ``TypeError`` or
    ``ValueError`` that names the argument.

    >>> check_positive("cpu_budget", 1.5)
    1.5
    >>> check_positive("cpu_budget", 0)
    Traceback (most recent call last):
    ...
    ValueError: cpu_budget must be > 0 and finite; got cpu_budget=0
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                     np.floating)):
        raise TypeError(f"{name} must be a number; got {name}={value!r}")
    if not 0 < value < float("inf"):
        raise ValueError(f"{name} must be > 0 and finite; got {name}={value!r}")
    return float(value)


def check_callable(name: str, value: Any) -> Callable:
    """``value``, once it is callable; otherwise a ``TypeError`` that names the argument. Not
    in ``__all__``, like :func:`check_integer`.

    >>> check_callable("func", 3)
    Traceback (most recent call last):
    ...
    TypeError: func must be callable; got func=3
    """
    if not callable(value):
        raise TypeError(f"{name} must be callable; got {name}={value!r}")
    return value


def keyword_names(func: Callable) -> frozenset[str] | None:
    """The names that ``func`` takes as keyword arguments; None when it takes any
    (``**kwargs``) or its signature cannot be read (some built-ins), which leaves the check
    to its call.

    >>> sorted(keyword_names(lambda x, *, scale=1: x))
    ['scale', 'x']
    >>> keyword_names(lambda x, **options: x) is None
    True
    """
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
        return None
    return frozenset(parameter.name for parameter in parameters
                     if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY))


def check_keywords(owner: str, given: Iterable[str], accepted: Iterable[str] | None,
                   target: str = "") -> None:
    """A ``TypeError`` naming the first of the keyword arguments ``given`` to ``owner`` that
    is not among ``accepted`` (None accepts any), before anything is built or created;
    ``target`` says where the keyword arguments go, for the message.

    >>> check_keywords("FileWriter", ["desc", "overwirte"], ["desc", "total"], "tqdm")
    Traceback (most recent call last):
    ...
    TypeError: FileWriter got an unexpected keyword argument 'overwirte' (its other keyword \
arguments go to tqdm, which takes no keyword of that name)
    """
    if accepted is None:
        return
    accepted = set(accepted)
    unknown = [name for name in given if name not in accepted]
    if unknown:
        where = f" (its other keyword arguments go to {target}, which takes no keyword of that name)" \
            if target else ""
        raise TypeError(f"{owner} got an unexpected keyword argument {unknown[0]!r}{where}")


def check_not_path(kind: str, reader: Any) -> None:
    """A ``TypeError`` for a path where a ``kind`` takes a reader, saying which reader to make.

    >>> check_not_path("Dataset", "train.msgpack")
    Traceback (most recent call last):
    ...
    TypeError: Dataset takes a reader, not a path; pass MsgpackReader('train.msgpack') ...
    """
    if isinstance(reader, (str, bytes, os.PathLike)):
        raise TypeError(f"{kind} takes a reader, not a path; pass MsgpackReader({reader!r:.80}) "
                        f"(from fpipe.storage); got reader={reader!r:.80}")


_COMPOSE_HINT = ("wrap a function of the value alone in Compose: Compose(f) passes it only the "
                 "params it names")


def check_two_argument_call(name: str, value: Any, call: str) -> bool:
    """Whether callable ``value``, called as ``name(*call)`` with two arguments (``call``
    names them), was seen to take them: True, or a ``TypeError`` that says how to wrap it;
    False when it has no signature to look at (``int``, say), so that the call will show.

    >>> check_two_argument_call("transforms['image']", lambda image: image, "(value, params)")
    Traceback (most recent call last):
    ...
    TypeError: transforms['image'] is called as f(value, params), but <function <lambda> ...
    >>> check_two_argument_call("transforms['image']", int, "(value, params)")
    False
    """
    check_callable(name, value)
    try:
        signature = inspect.signature(value)
    except (ValueError, TypeError):
        return False
    try:
        signature.bind(None, None)
    except TypeError:
        raise TypeError(f"{name} is called as f{call}, but {value!r:.80} takes {signature}; "
                        f"{_COMPOSE_HINT}") from None
    return True


def note_two_argument_call(error: Exception, name: str, call: str) -> None:
    """Note on ``error`` how ``name`` is called, when the call itself failed with a
    ``TypeError`` (no frame below the caller's: its arguments, not its body). Python 3.10
    has no notes; the error is unchanged there.

    >>> try:
    ...     int(3, {})
    ... except TypeError as error:
    ...     note_two_argument_call(error, "transforms['n']", "(value, params)")
    ...     print(error.__notes__[0][:45])
    transforms['n'] is called as f(value, params)
    """
    if (isinstance(error, TypeError) and error.__traceback__.tb_next is None
            and hasattr(error, "add_note")):
        error.add_note(f"{name} is called as f{call}; {_COMPOSE_HINT}")


def check_bool(name: str, value: Any) -> bool:
    """``value``, once it is True or False; otherwise a ``TypeError`` that names the argument.

    >>> check_bool("ordered", 1)
    Traceback (most recent call last):
    ...
    TypeError: ordered must be True or False; got ordered=1
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {name}={value!r}")
    return bool(value)


def check_choice(name: str, value: Any, choices: tuple) -> Any:
    """``value``, once it is one of ``choices``; otherwise a ``ValueError`` that names the
    argument and the choices.

    >>> check_choice("until", "last", ("first", "all"))
    Traceback (most recent call last):
    ...
    ValueError: until must be 'first' or 'all'; got until='last'
    """
    if not any(value is choice or (type(value) is type(choice) and value == choice)
               for choice in choices):
        *rest, last = map(repr, choices)
        allowed = f"{', '.join(rest)} or {last}" if rest else last
        raise ValueError(f"{name} must be {allowed}; got {name}={value!r}")
    return value


def check_fraction_or_count(name: str, value: Any) -> float:
    """``value`` as a size that is a fraction in (0, 1) of something, or a whole count >= 1.

    >>> check_fraction_or_count("buf_size", 0.25), check_fraction_or_count("buf_size", 8)
    (0.25, 8)
    >>> check_fraction_or_count("buf_size", 1.5)
    Traceback (most recent call last):
    ...
    ValueError: buf_size must be a fraction in (0, 1) or a whole number >= 1; got buf_size=1.5
    """
    number = (int, float, np.integer, np.floating)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, number):
        raise TypeError(f"{name} must be a number; got {name}={value!r}")
    if not (0 < value < 1 or (value >= 1 and float(value).is_integer())):
        raise ValueError(f"{name} must be a fraction in (0, 1) or a whole number >= 1; "
                         f"got {name}={value!r}")
    return value


def check_probability(name: str, value: Any) -> float:
    """``value`` as a float, once it is a real number in [0, 1]; otherwise a ``TypeError`` or
    ``ValueError`` that names the argument.

    >>> check_probability("p", "0.5")
    Traceback (most recent call last):
    ...
    TypeError: p must be a real number; got p='0.5'
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating)):
        raise TypeError(f"{name} must be a real number; got {name}={value!r}")
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must be a probability in [0, 1]; got {name}={value!r}")
    return float(value)


def check_interval(name: str, value: Any, *, positive: bool = False) -> tuple[float, float]:
    """``value`` as ``(low, high)``, once it is a pair of finite real numbers with
    ``0 <= low <= high`` and ``high > 0`` (``low > 0`` too when ``positive``); otherwise a
    ``TypeError`` or ``ValueError`` that names the argument.

    >>> check_interval("scale", (0.08, 1))
    (0.08, 1.0)
    >>> check_interval("ratio", (4 / 3, 3 / 4), positive=True)
    Traceback (most recent call last):
    ...
    ValueError: ratio must be (low, high) with 0 < low <= high; got ratio=(1.33..., 0.75)
    """
    real = (numbers.Real, np.floating)
    if (isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2
            or any(isinstance(v, (bool, np.bool_)) or not isinstance(v, real) for v in value)):
        raise TypeError(f"{name} must be a pair of real numbers (low, high); got {name}={value!r}")
    low, high = float(value[0]), float(value[1])
    bound = "0 < low <= high" if positive else "0 <= low <= high, 0 < high"
    if not (np.isfinite(low) and np.isfinite(high) and (low > 0 if positive else low >= 0)
            and low <= high and high > 0):
        raise ValueError(f"{name} must be (low, high) with {bound}; got {name}={value!r}")
    return low, high


# --- secrets in messages ---------------------------------------------------------------------
# Not in __all__, like the argument checks: fpipe's modules build their messages with them.

# a URL's scheme and user information; greedy up to the last "@" before the path, as
# urllib.parse splits it, so that a password holding "@" goes whole
_USERINFO = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")
# a URL within a message: up to the first space, quote or angle bracket
_URL_IN_TEXT = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")
# one name=value of a query; the value stops before punctuation that ends the URL in a
# message ("...?sig=abc: HTTP 403")
_PARAMETER = re.compile(r"(?:^|(?<=&))([^=&]+)=([^&]*?)(?=[:,.;)\]]*(?:&|$))")
# query parameters whose values are credentials: presigned URLs (AWS's X-Amz-*, Google's
# X-Goog-*, CloudFront's Signature, Policy and Key-Pair-Id, Azure's sig), tokens, keys,
# passwords; a harmless parameter hidden by mistake costs less than a secret shown
_SECRET_PARAMETER = re.compile(r"x-(amz|goog)-.*|.*(sig|token|secret|passw|credential|auth|key"
                               r"|policy|session).*", re.IGNORECASE)
_HIDDEN = "***"
_SHORTEST_SECRET = 3  # shorter strings are too common to scrub from a message


def redacted_url(text: str) -> str:
    """``text`` with the secrets of every URL in it hidden: the user information
    (``user:password@``) and the values of query parameters that carry credentials (those of
    presigned URLs such as ``X-Amz-Signature``, ``X-Amz-Credential``, ``Signature``, ``sig``,
    and any ``token``, ``key``, ``secret`` or ``password``).

    >>> redacted_url("https://ann:p%40ss@example.org/x.msgpack")
    'https://***@example.org/x.msgpack'
    >>> redacted_url("https://b.s3.amazonaws.com/x.msgpack?X-Amz-Credential=AKIA%2F1&"
    ...              "X-Amz-Signature=5eb1&v=2: HTTP 403")
    'https://b.s3.amazonaws.com/x.msgpack?X-Amz-Credential=***&X-Amz-Signature=***&v=2: HTTP 403'
    >>> redacted_url("no URL here, s3://bucket/x, token=abc")
    'no URL here, s3://bucket/x, token=abc'
    """
    return _URL_IN_TEXT.sub(lambda match: _redacted_one(match[0]), text)


def _redacted_one(url: str) -> str:
    url = _USERINFO.sub(rf"\1{_HIDDEN}@", url)
    head, mark, rest = url.partition("?")
    if not mark:
        return url
    query, hash_mark, fragment = rest.partition("#")
    return head + mark + _PARAMETER.sub(_hidden_value, query) + hash_mark + fragment


def _hidden_value(match: re.Match) -> str:
    name, value = match[1], match[2]
    if value and _SECRET_PARAMETER.fullmatch(urllib.parse.unquote(name)):
        return f"{name}={_HIDDEN}"
    return match[0]


def query_secrets(url: str) -> list[str]:
    """The values of ``url``'s query parameters that carry credentials, as given and decoded.

    >>> query_secrets("https://example.org/x.msgpack?sig=a%2Bb&v=2")
    ['a+b', 'a%2Bb']
    """
    query = urllib.parse.urlsplit(url).query if "://" in url else ""
    values = [value for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True)
              if _SECRET_PARAMETER.fullmatch(name)]
    raw = [match[2] for match in _PARAMETER.finditer(query)
           if _SECRET_PARAMETER.fullmatch(urllib.parse.unquote(match[1]))]
    return values + raw


def redacted_options(options: Any) -> str:
    """How ``storage_options`` appear in a message or repr: their keys, every value hidden
    (any value may be a credential); not a dict, only its type.

    >>> redacted_options({"key": "AKIA", "client_kwargs": {"endpoint_url": "http://x"}})
    "{'key': '***', 'client_kwargs': {'endpoint_url': '***'}}"
    >>> redacted_options("key:secret")
    'a str'
    """
    if not isinstance(options, dict):
        return f"a {type(options).__name__}"
    shown = (f"{key!r}: {redacted_options(value) if isinstance(value, dict) else repr(_HIDDEN)}"
             for key, value in options.items())
    return "{" + ", ".join(shown) + "}"


class Secrets:
    """The secrets that come with a URL: its user information, the values of its query
    parameters that carry credentials, and every string among the values of its
    ``storage_options``. :meth:`scrub` takes them out of a text, such as the
    message of a library's exception, which may quote them.

    >>> secrets = Secrets("s3://AKIA42:s3cr3t@bucket/x", {"secret": "s3cr3t", "anon": False})
    >>> secrets.scrub("Invalid bucket name 'AKIA42:s3cr3t@bucket': ...")
    "Invalid bucket name '***@bucket': ..."
    """

    def __init__(self, url: str = "", options: Any = None) -> None:
        found = set(_userinfo_parts(url)) | set(query_secrets(url)) | set(_strings(options))
        self.texts = sorted((text for text in found if len(text) >= _SHORTEST_SECRET),
                            key=len, reverse=True)

    def scrub(self, text: str) -> str:
        """``text`` without the secrets, and without the user information of any URL."""
        for secret in self.texts:
            text = text.replace(secret, _HIDDEN)
        return redacted_url(text)


def _userinfo_parts(url: str) -> list[str]:
    netloc = urllib.parse.urlsplit(url).netloc if "://" in url else ""
    userinfo = netloc.rpartition("@")[0]
    if not userinfo:
        return []
    user, _, password = userinfo.partition(":")
    parts = [userinfo, user, password]
    return parts + [urllib.parse.unquote(part) for part in parts]


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [text for item in value for text in _strings(item)]
    if isinstance(value, bytes):
        return [value.decode("utf-8", "replace")]
    return [value] if isinstance(value, str) else []


# --- saved states ---------------------------------------------------------------------------

STATE_VERSION = 1  # the format of the states fpipe saves: each names what made it


def state_header(kind: str) -> dict:
    """The keys every state begins with: the ``type`` of what made it and the ``version`` of
    the format. Not in ``__all__``: fpipe's ``state_dict()`` methods use it.

    >>> state_header("Shuffler")
    {'type': 'Shuffler', 'version': 1}
    """
    return {"type": kind, "version": STATE_VERSION}


def check_state(state: Any, kind: str, fields: Iterable[str], settings: Mapping[str, Any], *,
                old_keys: Iterable[str] | None = None, name: str = "state") -> Mapping:
    """``state``, once it is a state of a ``kind`` built with ``settings``: a dict of its
    :func:`state_header`, the ``settings`` (equal to these) and the ``fields``, and nothing else.
    Otherwise a ``TypeError`` or ``ValueError`` that names what differs. Not in ``__all__``.

    A state without ``version`` was saved by fpipe 0.1.0, before states named what made them.
    It is accepted when its keys are ``old_keys``, the keys that version saved: the settings it
    has are checked, and a ``UserWarning`` names the ones it lacks, which cannot be.

    >>> check_state({"type": "Range", "version": 1, "start": 0, "position": 3}, "Range",
    ...             ["position"], {"start": 5})
    Traceback (most recent call last):
    ...
    ValueError: state is of a Range with start=0; this one has start=5
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"{name} must be a dict from the state_dict() of {_a(kind)}; "
                        f"got {name}={state!r:.200}")
    if state.get("type", kind) != kind:
        raise ValueError(f"{name} is the state of {_a(repr(state['type']))[:90]}, not of {_a(kind)}")
    if "version" not in state:
        return _check_old_state(state, kind, fields, settings, old_keys, name)
    if state["version"] != STATE_VERSION or isinstance(state["version"], bool):
        raise ValueError(f"{name}['version'] must be {STATE_VERSION}, the version of the states "
                         f"this fpipe reads; got {state['version']!r:.80}")
    _check_keys(state, {"type", "version", *settings, *fields}, kind, name)
    _check_settings(state, settings, kind, name)
    return state


def _check_keys(state: Mapping, keys: set, kind: str, name: str) -> None:
    missing, unknown = sorted(keys - set(state)), sorted(map(str, set(state) - keys))
    if missing or unknown:
        raise TypeError(f"{name} must be a dict from the state_dict() of {_a(kind)}; "
                        + "; ".join(filter(None, [missing and f"it lacks {', '.join(missing)}",
                                                  unknown and f"{', '.join(unknown)} are not "
                                                              f"of such a state"])))


def _check_settings(state: Mapping, settings: Mapping[str, Any], kind: str, name: str) -> None:
    differ = [key for key, value in settings.items() if key in state and not _same(state[key], value)]
    if differ:
        saved = ", ".join(f"{key}={state[key]!r:.80}" for key in differ)
        this = ", ".join(f"{key}={settings[key]!r:.80}" for key in differ)
        raise ValueError(f"{name} is of {_a(kind)} with {saved}; this one has {this}")


def _same(saved: Any, value: Any) -> bool:
    if isinstance(saved, bool) or isinstance(value, bool):
        # a bool is not the number it equals: True would pass for a length of 1
        return type(saved) is type(value) and saved == value
    return saved == value


def _check_old_state(state: Mapping, kind: str, fields: Iterable[str],
                     settings: Mapping[str, Any], old_keys: Iterable[str] | None,
                     name: str) -> Mapping:
    if old_keys is None:
        raise TypeError(f"{name} must be a dict from the state_dict() of {_a(kind)}; it has no "
                        f"'version'; got {name}={state!r:.200}")
    _check_keys(state, set(old_keys), kind, name)
    _check_settings(state, settings, kind, name)
    unchecked = [key for key in settings if key not in state]
    if unchecked:
        warnings.warn(f"{name} was saved by fpipe 0.1.0 (it has no 'version') and does not say "
                      f"the {', '.join(unchecked)} of the {kind} it is of: it is loaded as a "
                      f"state of this one, unchecked; save a new state to have it checked",
                      UserWarning, stacklevel=4)
    return state


def _a(noun: str) -> str:
    return ("an " if noun.lstrip("'\"")[:1] in tuple("AEIOUaeiou") else "a ") + noun
