"""HTTP servers that lie about sizes: an index file whose Content-Length claims 100 GiB, one
sent without a length that never ends, sizes in HEAD answers past what the format allows. The
client refuses them at once with a RemoteError that says so, in bounded memory."""

from __future__ import annotations

import contextlib
import threading
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fpipe.dataset import MsgpackReader
from fpipe.remote import RemoteOptions
from fpipe.remote.urls import RemoteError

from ..cli.conftest import fpipe
from .conftest import BLOCK, sample

HUGE = 100 << 30
ZEROS = bytes(1 << 20)
STREAMED = 64 << 20  # what a lying server sends at most before it closes


class _Liar(BaseHTTPRequestHandler):
    """Serves the files of ``server.root``, except those whose names end with ``server.lies``:
    for those, HEAD and GET claim ``HUGE`` bytes (or, with ``server.chunked``, GET sends
    zeros without a length), and a GET streams up to ``STREAMED`` bytes of zeros."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _lies(self) -> bool:
        return any(self.path.endswith(suffix) for suffix in self.server.lies)

    def do_HEAD(self) -> None:
        path = self.server.root / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(HUGE if self._lies() else path.stat().st_size))
        self.end_headers()

    def do_GET(self) -> None:
        path = self.server.root / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        if self._lies():
            self._stream_zeros()
            return
        data, ranged = path.read_bytes(), self.headers.get("Range")
        if ranged:
            start, end = (int(x) for x in ranged.removeprefix("bytes=").split("-"))
            if start >= len(data):
                self.send_error(416)
                return
            data = data[start:end + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{start + len(data) - 1}/{path.stat().st_size}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream_zeros(self) -> None:
        self.send_response(200)
        if self.server.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(HUGE))
        self.end_headers()
        with contextlib.suppress(OSError):
            for _ in range(STREAMED // len(ZEROS)):
                if self.server.chunked:
                    self.wfile.write(f"{len(ZEROS):x}\r\n".encode() + ZEROS + b"\r\n")
                else:
                    self.wfile.write(ZEROS)
        self.close_connection = True


@pytest.fixture
def liar(served):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Liar)
    server.daemon_threads = True
    server.root, server.lies, server.chunked = served, (), False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}/train.msgpack"
    yield server
    server.shutdown()
    server.server_close()


def _open_in_bounded_memory(url: str, cache: Path, match: str) -> None:
    """Opening the reader at ``url`` raises a RemoteError matching ``match``, having held
    less than 16 MiB at any time."""
    tracemalloc.start()
    try:
        with pytest.raises(RemoteError, match=match):
            MsgpackReader(url, remote=RemoteOptions(cache_dir=cache, block_size=BLOCK, retries=1))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


def test_an_index_file_that_claims_100_gib_is_refused_at_once(liar, cache):
    liar.lies = (".keys",)
    _open_in_bounded_memory(liar.url, cache, r"train\.msgpack\.keys: the server claims "
                                              rf"{HUGE} bytes; the format allows at most \d+ here")


def test_an_index_file_without_a_length_that_never_ends_is_refused(liar, cache):
    liar.lies, liar.chunked = (".key_hashes",), True
    _open_in_bounded_memory(liar.url, cache, r"train\.msgpack\.key_hashes: the server sent more "
                                              r"than 24008 bytes")


def test_offsets_past_what_the_data_file_can_hold_are_refused(liar, cache):
    liar.lies = (".offsets",)
    _open_in_bounded_memory(liar.url, cache, r"train\.msgpack\.offsets: the server claims")


def test_the_honest_files_of_the_same_server_read(liar, cache):
    assert MsgpackReader(liar.url,
                         remote=RemoteOptions(cache_dir=cache, block_size=BLOCK)).get(7) == sample(7)


@pytest.mark.parametrize("suffix", [".keys", ".md5", ".classes.json", ".filter"])
def test_cp_refuses_sizes_past_the_format_before_downloading(liar, served, tmp_path, suffix):
    (served / "train.msgpack.classes.json").write_text('{"classes": []}')
    liar.lies = (suffix,)
    try:
        result = fpipe("cp", liar.url, tmp_path / "copy.msgpack",
                       env={"FPIPE_CACHE_DIR": str(tmp_path / "cache")})
    finally:
        (served / "train.msgpack.classes.json").unlink()
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"train.msgpack{suffix}: the server claims {HUGE} bytes" in result.stderr
    assert not list(tmp_path.glob("copy.msgpack*"))
