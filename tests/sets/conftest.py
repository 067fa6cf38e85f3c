"""A loopback HTTP server that serves files with Range support and can cut a transfer short."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


class FileServer:
    """Serves ``files`` (name -> bytes) at ``url``; records each request's Range header.

    ``cut[name] = n`` makes the next transfer of ``name`` stop after ``n`` bytes (once);
    ``ignore_range`` makes the server answer every request with the whole file.
    """

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.cut: dict[str, int] = {}
        self.ranges: list[str | None] = []
        self.ignore_range = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    def serve(self, folder: Path) -> FileServer:
        """Serve every file of ``folder`` by its name."""
        self.files.update({path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()})
        return self

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _handler(server: FileServer) -> type:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            name = self.path.lstrip("/")
            server.ranges.append(self.headers.get("Range"))
            if name not in server.files:
                self.send_error(404)
                return
            data, start = server.files[name], self._start()
            if start and start >= len(data):
                self.send_error(416)
                return
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            cut = server.cut.pop(name, None)
            self.wfile.write(data[start:cut])
            self.close_connection = True

        def _start(self) -> int:
            requested = self.headers.get("Range")
            if server.ignore_range or not requested:
                return 0
            return int(requested.removeprefix("bytes=").split("-")[0])

        def log_message(self, *args: object) -> None:
            pass  # keep test output clean

    return Handler


@pytest.fixture
def file_server():
    server = FileServer()
    server.start()
    yield server
    server.stop()
