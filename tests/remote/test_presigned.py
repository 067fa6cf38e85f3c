"""Presigned URLs: a dataset whose URL carries its credentials in the query string (AWS's
X-Amz-Signature and X-Amz-Credential, a token) is read through it, side files come from the
objects they name (the suffix goes into the path, before the query), and no message, repr
or command output shows the secrets, on the way that works and on those that fail (a
refused signature, a missing object)."""

from __future__ import annotations

import threading
import urllib.parse
from http.server import ThreadingHTTPServer

import pytest

from fpipe.cli import main
from fpipe.dataset import MsgpackReader, ShardedReader, ShardedWriter
from fpipe.errors import redacted_url
from fpipe.formats import WebDatasetReader, write_webdataset
from fpipe.remote import RemoteOptions
from fpipe.remote.urls import RemoteError, sibling_url

from ..cli.conftest import fpipe
from .conftest import BLOCK, N, sample, write_dataset
from .servers import Faults, _Handler

CREDENTIAL = "AKIAPRESIGNED42/20261206/us-east-1/s3/aws4_request"
SIGNATURE = "5ec7e75f1a9e0c4b2d7f36a8e91c0b4d"
TOKEN = "t0k3n-FwoGZXIvYXdzE"
QUERY = urllib.parse.urlencode({"X-Amz-Algorithm": "AWS4-HMAC-SHA256",
                                "X-Amz-Credential": CREDENTIAL, "X-Amz-Signature": SIGNATURE,
                                "X-Amz-Security-Token": TOKEN, "token": TOKEN, "v": "2"})
SECRETS = (SIGNATURE, TOKEN, "AKIAPRESIGNED42", urllib.parse.quote(CREDENTIAL, safe=""))


def shows_no_secret(*texts: str) -> bool:
    return not any(secret in text for secret in SECRETS for text in texts)


class _Presigned(_Handler):
    """The test server's handler, answering only requests that carry the signature in their
    query (403 otherwise, as S3 does); records the path of each request."""

    def _allowed(self) -> bool:
        path, _, query = self.path.partition("?")
        self.server.paths.append(path)
        if urllib.parse.parse_qs(query).get("X-Amz-Signature") == [SIGNATURE]:
            return True
        self._send(403, b"<Error><Code>SignatureDoesNotMatch</Code></Error>", {})
        return False

    def do_HEAD(self) -> None:
        if self._allowed():
            super().do_HEAD()

    def do_GET(self) -> None:
        if self._allowed():
            super().do_GET()


@pytest.fixture(scope="module")
def presigned(tmp_path_factory):
    root = tmp_path_factory.mktemp("presigned")
    write_dataset(root / "train.msgpack")
    write_webdataset(({"key": f"{i:03d}", "cls": i} for i in range(5)), str(root / "shard-%d.tar"))
    with ShardedWriter(root / "many", shard_size=4) as writer:
        for i in range(10):
            writer.write(sample(i))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Presigned)
    server.daemon_threads = True
    server.root, server.faults, server.paths = root, Faults(), []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def presigned_url(server, name: str = "train.msgpack", query: str = QUERY) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/{name}?{query}"


def test_side_files_go_into_the_path_before_the_query():
    url = presigned_url_on(8000)
    assert sibling_url(url, ".offsets") == url.replace(".msgpack?", ".msgpack.offsets?")
    assert sibling_url("http://h/x.msgpack#part", ".md5") == "http://h/x.msgpack.md5#part"
    assert sibling_url("http://h/x.msgpack", ".md5") == "http://h/x.msgpack.md5"
    # only http(s) URLs have a query: an object storage key may hold a "?"
    assert sibling_url("s3://b/what?.msgpack", ".md5") == "s3://b/what?.msgpack.md5"


def presigned_url_on(port: int) -> str:
    return f"http://127.0.0.1:{port}/train.msgpack?{QUERY}"


def test_credentials_in_a_query_are_redacted_in_any_text():
    text = f"{presigned_url_on(8000)}: HTTP 403 (for 'http://u:pw@h/x?sig=abc&n=1')"
    shown = redacted_url(text)
    assert shows_no_secret(shown) and "pw" not in shown and "abc" not in shown
    assert "X-Amz-Algorithm=***&" in shown and "&v=2: HTTP 403" in shown
    assert "X-Amz-Signature=***&" in shown and "sig=***&n=1'" in shown


def test_a_presigned_dataset_reads_its_side_files_from_their_own_objects(presigned, cache):
    presigned.paths.clear()
    reader = MsgpackReader(presigned_url(presigned), remote=RemoteOptions(cache_dir=cache, block_size=BLOCK))
    assert len(reader) == N and reader.get(N - 1) == sample(N - 1)
    assert reader.find_index(sample(17)["key"]) == 17 and reader.verify_data()
    assert {"/train.msgpack.offsets", "/train.msgpack.md5", "/train.msgpack.key_hashes"} <= set(
        presigned.paths)
    assert not any("?" in path or "X-Amz" in path for path in presigned.paths)
    assert shows_no_secret(repr(reader), reader.url, repr(reader._bytes.remote.source))


def test_refused_and_missing_presigned_objects_show_no_secret(presigned, cache):
    refused = QUERY.replace(SIGNATURE, SIGNATURE[::-1])
    with pytest.raises(RemoteError, match="HTTP 403") as caught:
        MsgpackReader(presigned_url(presigned, query=refused), remote=RemoteOptions(cache_dir=cache))
    with pytest.raises(FileNotFoundError) as missing:
        MsgpackReader(presigned_url(presigned, "absent.msgpack"), remote=RemoteOptions(cache_dir=cache))
    texts = [str(caught.value), str(missing.value)]
    assert shows_no_secret(*texts) and SIGNATURE[::-1] not in texts[0]
    assert "X-Amz-Signature=***" in texts[0] and "absent.msgpack" in texts[1]


def test_presigned_shards_and_tar_files_are_known_by_their_paths(presigned, cache):
    tar = WebDatasetReader(presigned_url(presigned, "shard-0.tar"), remote=RemoteOptions(cache_dir=cache))
    assert len(tar) == 5 and tar.readers[0].source.name == "shard-0.tar"
    presigned.paths.clear()
    sharded = ShardedReader(presigned_url(presigned, "many.shards"), remote=RemoteOptions(cache_dir=cache))
    assert len(sharded) == 10 and sharded.get(9) == sample(9)
    assert "/many-00002.msgpack.offsets" in presigned.paths  # the query went with each shard
    texts = [repr(tar), repr(sharded), *(r.source.path for r in tar.readers)]
    assert shows_no_secret(*texts), texts


def _run(capsys, *argv) -> tuple[int, str, str]:
    """``fpipe argv`` in this process (an interpreter per command would cost seconds each)."""
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return code, captured.out, captured.err


def test_the_commands_show_no_presigned_secret(presigned, tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.setenv("FPIPE_CACHE_DIR", str(tmp_path / "cache"))
    url = presigned_url(presigned)
    runs = [_run(capsys, *argv) for argv in (
        ["info", url], ["info", url, "--json"], ["verify", url], ["cat", url, "-n", "2", "--keys"],
        ["cp", url, tmp_path / "copy.msgpack"],
        ["write", presigned_url(presigned, "shard-0.tar"), tmp_path / "from-tar.msgpack"])]
    assert [code for code, _, _ in runs] == [0] * 6, runs
    assert len(MsgpackReader(tmp_path / "from-tar.msgpack")) == 5  # a tar file by its path
    assert "X-Amz-Signature=***" in runs[0][1] and runs[3][1].split() == ["000000", "000001"]
    assert MsgpackReader(tmp_path / "copy.msgpack").get(5) == sample(5)
    refused = presigned_url(presigned, query=QUERY.replace(SIGNATURE, "0" * 32))
    absent = presigned_url(presigned, "absent.msgpack")
    failed = [_run(capsys, *argv) for argv in (
        ["info", refused], ["verify", refused], ["cat", refused],
        ["cp", refused, tmp_path / "again.msgpack"], ["info", absent],
        ["cp", absent, tmp_path / "none.msgpack"])]
    assert all(code != 0 and err.strip() for code, _, err in failed), failed
    assert "HTTP 403" in failed[0][2] and "absent.msgpack" in failed[4][2]
    outputs = [text for _, *texts in runs + failed for text in texts] + [caplog.text]
    assert shows_no_secret(*outputs), [text for text in outputs if not shows_no_secret(text)]


def test_a_refused_presigned_url_is_one_line_without_secrets_from_the_command(presigned, tmp_path):
    result = fpipe("info", presigned_url(presigned, query=QUERY.replace(SIGNATURE, "0" * 32)),
                   env={"FPIPE_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "HTTP 403" in result.stderr and shows_no_secret(result.stdout, result.stderr)
