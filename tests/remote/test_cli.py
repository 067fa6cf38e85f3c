"""``fpipe cp`` copies datasets between paths and URLs; ``info``, ``verify`` and ``cat`` take
URLs. Credentials and the endpoint come from AWS_* environment variables, as on a cluster."""

from __future__ import annotations

import json

import pytest

from fpipe.dataset import MsgpackReader
from fpipe.remote.transfer import SIBLINGS

from ..cli.conftest import fpipe
from .conftest import N, sample


@pytest.fixture
def env(s3, tmp_path) -> dict:
    return {**s3.env, "FPIPE_CACHE_DIR": str(tmp_path / "cache")}


def _same_files(first, second) -> None:
    for suffix in ("", *SIBLINGS):
        a, b = first.with_name(first.name + suffix), second.with_name(second.name + suffix)
        assert a.exists() == b.exists(), suffix
        assert not a.exists() or a.read_bytes() == b.read_bytes(), suffix


def _ok(*argv, env) -> str:
    result = fpipe(*argv, env=env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def test_cp_uploads_downloads_and_copies_between_urls(s3, served, env, tmp_path):
    source = served / "shard-1.msgpack"
    assert "copied" in _ok("cp", source, "s3://data/cli/a.msgpack", env=env)
    _ok("cp", "s3://data/cli/a.msgpack", "s3://data/cli/b.msgpack", env=env)
    _ok("cp", "-q", "s3://data/cli/b.msgpack", tmp_path / "back.msgpack", env=env)
    _same_files(source, tmp_path / "back.msgpack")
    again = fpipe("cp", source, "s3://data/cli/a.msgpack", env=env)
    assert again.returncode == 2 and "exists" in again.stderr and "Traceback" not in again.stderr
    _ok("cp", "-y", source, "s3://data/cli/a.msgpack", env=env)


def test_cp_from_an_https_url(http, served, tmp_path):
    _ok("cp", http.url("shard-1.msgpack"), tmp_path / "x.msgpack",
        env={"FPIPE_CACHE_DIR": str(tmp_path / "cache")})
    _same_files(served / "shard-1.msgpack", tmp_path / "x.msgpack")
    assert MsgpackReader(tmp_path / "x.msgpack").get(3) == sample(3)


def test_info_verify_and_cat_take_urls(s3, env):
    url = "s3://data/train.msgpack"
    summary = json.loads(_ok("info", url, "--json", env=env))
    assert summary["path"] == url and summary["samples"] == N
    assert summary["data_bytes"] > 0
    assert "ok" in _ok("verify", url, env=env)
    lines = _ok("cat", url, "--start", "5", "-n", "2", "--keys", env=env).split()
    assert lines == ["000005", "000006"]


def test_a_missing_dataset_is_a_usage_error(s3, env, tmp_path):
    result = fpipe("cp", "s3://data/absent.msgpack", tmp_path / "x.msgpack", env=env)
    assert result.returncode == 2 and "absent.msgpack" in result.stderr
    result = fpipe("cp", tmp_path / "absent.msgpack", "s3://data/x.msgpack", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
