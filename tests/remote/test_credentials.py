"""Credentials: an http(s) URL's user:password logs in (HTTP basic authentication), object
storage URLs cannot carry them, and no message, repr or command output shows them or a value
of storage_options. First contact: missing or wrong credentials are one line with a hint, at
once (no retries); an unreachable endpoint is retried within a bound, and the wait reported."""

from __future__ import annotations

import base64
import logging
import socket
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer

import pytest

from fpipe.dataset import FileWriter, MsgpackReader, ShardedReader
from fpipe.remote import RemoteOptions
from fpipe.remote.urls import RemoteError

from ..cli.conftest import ENV, fpipe
from .conftest import BLOCK, sample
from .servers import Faults, _Handler

USER, PASSWORD = "ann-7f3k", "p@ss w0rd:9x"
QUOTED = "ann-7f3k:p%40ss%20w0rd%3A9x"
SECRETS = (USER, PASSWORD, QUOTED, "p%40ss", "w0rd")
KEY, SECRET = "AKIA5EXAMPLEKEY", "s3cr3t-v4lue-42"


def shows_no_secret(*texts: str) -> bool:
    return not any(secret in text for secret in (*SECRETS, KEY, SECRET) for text in texts)


class _Guarded(_Handler):
    """The test server's handler, behind HTTP basic authentication; counts the requests."""

    def _allowed(self) -> bool:
        self.server.requests += 1
        expected = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        if self.headers.get("Authorization") == f"Basic {expected}":
            return True
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="data"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False

    def do_HEAD(self) -> None:
        if self._allowed():
            super().do_HEAD()

    def do_GET(self) -> None:
        if self._allowed():
            super().do_GET()


@pytest.fixture(scope="module")
def guarded(served):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Guarded)
    server.daemon_threads = True
    server.root, server.faults, server.requests = served, Faults(), 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def guarded_url(server, userinfo: str = QUOTED, name: str = "train.msgpack") -> str:
    return f"http://{userinfo}@127.0.0.1:{server.server_address[1]}/{name}"


def test_user_and_password_in_an_http_url_log_in(guarded, cache):
    reader = MsgpackReader(guarded_url(guarded), remote=RemoteOptions(cache_dir=cache, block_size=BLOCK))
    assert reader.get(3) == sample(3) and reader.verify_data()
    assert reader.url == guarded_url(guarded, "***") and repr(reader) == f"MsgpackReader({reader.url!r})"
    assert shows_no_secret(repr(reader), repr(reader._bytes.remote), repr(reader._bytes.remote.source))


def test_wrong_credentials_are_one_refusal_that_shows_them_not(guarded, cache):
    before = guarded.requests
    with pytest.raises(RemoteError, match=r"HTTP 401 Unauthorized: put user:password@ in the URL") as caught:
        MsgpackReader(guarded_url(guarded, "ann-7f3k:w0rdy"),
                      remote=RemoteOptions(cache_dir=cache, retries=5))
    assert guarded.requests == before + 1  # not retried: it cannot heal
    assert shows_no_secret(str(caught.value)) and "w0rdy" not in str(caught.value)


def test_a_failing_server_and_a_missing_dataset_show_no_credentials(http, cache):
    url = http.url("train.msgpack").replace("http://", f"http://{QUOTED}@")
    http.faults.add("500", "500")
    reader = MsgpackReader(url,
                           remote=RemoteOptions(cache_dir=cache, block_size=BLOCK, read_ahead=0, retries=1))
    with pytest.raises(RemoteError) as caught:
        reader.get(0)
    with pytest.raises(FileNotFoundError) as missing:
        MsgpackReader(url.replace("train", "absent"), remote=RemoteOptions(cache_dir=cache))
    assert shows_no_secret(str(caught.value), str(missing.value), repr(reader))
    assert "***@127.0.0.1" in str(caught.value)


def test_the_commands_show_no_credentials(guarded, tmp_path):
    env = {"FPIPE_CACHE_DIR": str(tmp_path / "cache")}
    url = guarded_url(guarded)
    outputs = []
    for argv in (["info", url], ["verify", url], ["cat", url, "-n", "1"],
                 ["cp", url, tmp_path / "copy.msgpack"]):
        result = fpipe(*argv, env=env)
        assert result.returncode == 0, result.stderr
        outputs += [result.stdout, result.stderr]
    assert "***@127.0.0.1" in outputs[0] and "ok" in outputs[2]
    wrong = fpipe("info", guarded_url(guarded, "ann-7f3k:w0rdy"), env=env)
    assert wrong.returncode == 1 and wrong.stderr.count("\n") == 1 and "HTTP 401" in wrong.stderr
    assert shows_no_secret(*outputs, wrong.stdout, wrong.stderr) and "w0rdy" not in wrong.stderr


def test_storage_options_show_their_keys_not_their_values(served, http, cache):
    options = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": "http://h"}}
    errors = []
    for call in (lambda: MsgpackReader(served / "train.msgpack",
                                       remote=RemoteOptions(storage_options=options)),
                 lambda: ShardedReader(str(served / "*.msgpack"),
                                       remote=RemoteOptions(storage_options=options)),
                 lambda: MsgpackReader("s3://data/x.msgpack",
                                       remote=RemoteOptions(storage_options=[KEY, SECRET])),
                 lambda: MsgpackReader(http.url("train.msgpack"),
                                       remote=RemoteOptions(storage_options={**options, "headers": SECRET}))):
        with pytest.raises((TypeError, ValueError)) as caught:
            call()
        errors.append(str(caught.value))
    shown = "{'key': '***', 'secret': '***', 'client_kwargs': {'endpoint_url': '***'}}"
    assert f"remote=RemoteOptions(storage_options={shown}) only applies to URLs" in errors[0]
    assert shown in errors[1]
    assert "got a list" in errors[2] and "['client_kwargs', 'key', 'secret']" in errors[3]
    assert shows_no_secret(*errors)


@pytest.mark.parametrize("make", [
    lambda url: MsgpackReader(url),
    lambda url: FileWriter(url),
    lambda url: ShardedReader(url.replace("x.msgpack", "*.msgpack")),
])
def test_object_storage_urls_with_credentials_are_refused_at_once(make):
    with pytest.raises(ValueError, match=r"s3:// URLs cannot carry credentials; got 's3://\*\*\*@data/.*"
                                         r"AWS_ACCESS_KEY_ID") as caught:
        make(f"s3://{KEY}:{SECRET}@data/x.msgpack")
    assert shows_no_secret(str(caught.value))


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def no_credentials(tmp_path) -> dict:
    """An environment where botocore finds no credentials (no variables, files or instance
    metadata) and the endpoint is a closed port on loopback."""
    return {"AWS_EC2_METADATA_DISABLED": "true", "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{_closed_port()}",
            "FPIPE_CACHE_DIR": str(tmp_path / "cache")}


def fpipe_alone(*argv, env: dict) -> subprocess.CompletedProcess:
    """The fpipe command in an environment of ``env`` and none of the caller's AWS settings."""
    base = {name: value for name, value in ENV.items() if not name.startswith("AWS_")}
    return subprocess.run([sys.executable, "-m", "fpipe", *map(str, argv)], capture_output=True,
                          text=True, env={**base, **env}, timeout=120)


def _one_line_with(result, *words: str) -> None:
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(word in result.stderr for word in words), result.stderr


def test_missing_credentials_are_one_line_with_a_hint_and_no_retries(served, no_credentials, tmp_path):
    url = "s3://data/train.msgpack"
    for argv in (["info", url], ["cat", url], ["verify", url], ["cp", url, tmp_path / "x.msgpack"],
                 ["cp", served / "train.msgpack", url]):
        result = fpipe_alone(*argv, env=no_credentials)
        _one_line_with(result, "no credentials", "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        assert "attempts" not in result.stderr and "retrying" not in result.stderr


def test_wrong_credentials_are_one_line_with_a_hint(s3, tmp_path):
    env = {**s3.env, "AWS_SECRET_ACCESS_KEY": SECRET, "FPIPE_CACHE_DIR": str(tmp_path / "cache")}
    result = fpipe_alone("info", "s3://data/train.msgpack", env=env)
    _one_line_with(result, "access denied", "check the credentials")
    assert "attempts" not in result.stderr and shows_no_secret(result.stderr)


@pytest.mark.slow
def test_an_unreachable_endpoint_is_retried_within_a_bound_and_reported(served, no_credentials):
    env = {**no_credentials, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
    result = fpipe_alone("info", "s3://data/train.msgpack", env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    reported, failed = result.stderr.splitlines()
    assert "retrying, at most 10 more times" in reported
    assert "gave up after 11 attempts" in failed and "AWS_ENDPOINT_URL" in failed
    upload = fpipe_alone("cp", served / "train.msgpack", "s3://data/up.msgpack", env=env)
    _one_line_with(upload, "upload failed after 3 attempts", "AWS_ENDPOINT_URL")
    assert shows_no_secret(result.stderr, upload.stderr)


def test_the_first_retry_of_a_request_is_logged(http, cache, caplog):
    reader = MsgpackReader(http.url("train.msgpack"),
                           remote=RemoteOptions(cache_dir=cache, block_size=BLOCK, read_ahead=0))
    http.faults.add("500", "500")
    with caplog.at_level(logging.WARNING, logger="fpipe.remote"):
        assert reader.get(0) == sample(0)
    (record,) = caplog.records
    assert "HTTP 500 Internal Server Error; retrying, at most 10 more times (each within 30 s)" in (
        record.getMessage())



def test_a_writer_shows_no_credentials(tmp_path):
    with pytest.raises(ValueError, match=r"ftp://\*\*\*@127\.0\.0\.1") as caught:
        FileWriter(f"ftp://{QUOTED}@127.0.0.1:1/x.msgpack", append=True)
    assert shows_no_secret(str(caught.value))
