"""Servers the remote tests read from: a plain HTTP server with Range support that can be told
to misbehave, and (from the benchmarks, which use it too) a SeaweedFS S3 server."""

from __future__ import annotations

import contextlib
import re
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from benchmarks.s3server import SeaweedS3, free_port

__all__ = ["Faults", "HttpServer", "SeaweedS3", "free_port"]

_RANGE = re.compile(r"bytes=(\d+)-(\d+)$")


class Faults:
    """Misbehaviours for the next requests, taken one per ranged GET, in order.

    ``"500"`` answers 500; ``"short"`` sends half the body and closes; ``"shifted"`` sends the
    bytes 1 KiB later, with a Content-Range that says so; ``"whole"`` ignores the Range header
    (200 and the whole file); ``"stall"`` sends the headers and then nothing until ``release``.
    """

    def __init__(self) -> None:
        self.pending: deque[str] = deque()
        self.whole_pending: deque[str] = deque()  # "500"s for GETs of whole files
        self.release = threading.Event()
        self.ranged_gets = 0

    def add(self, *faults: str) -> None:
        self.pending.extend(faults)

    def take(self) -> str | None:
        self.ranged_gets += 1
        return self.pending.popleft() if self.pending else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _file(self) -> Path | None:
        path = self.server.root / self.path.lstrip("/").split("?")[0]
        return path if path.is_file() else None

    def do_HEAD(self) -> None:
        path = self._file()
        if path is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(path.stat().st_size))
        self.send_header("ETag", f'"{path.stat().st_mtime_ns}"')
        self.end_headers()

    def do_GET(self) -> None:
        path = self._file()
        if path is None:
            self.send_error(404)
            return
        data = path.read_bytes()
        match = _RANGE.match(self.headers.get("Range", ""))
        fault = self.server.faults.take() if match else None
        if match is None and self.server.faults.whole_pending:
            self.server.faults.whole_pending.popleft()
            self._send(500, b"broken", {})
            return
        if match is None or fault == "whole":
            self._send(200, data, {})
            return
        start, end = int(match[1]), int(match[2])
        if fault == "500":
            self._send(500, b"broken", {})
            return
        if fault == "shifted":
            start, end = start + 1024, end + 1024
        body = data[start:end + 1]
        headers = {"Content-Range": f"bytes {start}-{start + len(body) - 1}/{len(data)}"}
        if fault == "short":
            self._send(206, body[:len(body) // 2], headers, length=len(body))
            self.close_connection = True
            return
        if fault == "stall":
            self._send(206, b"", headers, length=len(body))
            self.server.faults.release.wait(60)
            self.close_connection = True
            return
        self._send(206, body, headers)

    def _send(self, status: int, body: bytes, headers: dict, length: int | None = None) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body)


class HttpServer:
    """Serves ``root`` on 127.0.0.1; ``stop()`` and ``start()`` again keep the port."""

    def __init__(self, root: Path) -> None:
        self.root, self.faults, self.port = root, Faults(), free_port()
        self._server: ThreadingHTTPServer | None = None

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def start(self) -> None:
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _Handler)
        server.daemon_threads = True
        server.root, server.faults = self.root, self.faults
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


