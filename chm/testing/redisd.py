"""A real ``redis-server`` for tests and benchmarks, started and stopped here.

    with RedisServer() as srv:           # a free port on 127.0.0.1, no persistence
        master = RedisMaster(srv.url)
        srv.kill()                       # SIGKILL: the Master becomes unreachable
        srv.start()                      # the same port again (an empty database)

``prefix`` (a list of argv words such as ``["ip", "netns", "exec", "ns1"]``)
runs the server inside a network namespace; ``host`` is then the address it
binds. Raises :class:`chm.errors.NotFound` when ``redis-server`` is not
installed (``apt-get install redis-server``), and ``ChmError`` when it does
not answer within ``timeout`` seconds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence

from chm.errors import ChmError, NotFound

__all__ = ["RedisServer", "free_port", "redis_server_path"]


def redis_server_path() -> str | None:
    """Where ``redis-server`` is, or None."""
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server process on ``host:port`` (port 0: a free one)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        prefix: Sequence[str] = (),
        timeout: float = 10.0,
    ) -> None:
        exe = redis_server_path()
        if exe is None:
            raise NotFound(None, "redis-server is not installed (apt-get install redis-server)")
        self.exe = exe
        self.host = host
        self.port = port or free_port(host if not prefix else "127.0.0.1")
        self.prefix = list(prefix)
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="chm-redis-")

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> RedisServer:
        """Starts the server (again) and waits until it answers PING."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        argv = [
            *self.prefix,
            self.exe,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            self._dir,
            "--logfile",
            os.path.join(self._dir, "redis.log"),
        ]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ChmError(
                    None, f"redis-server exited with {self.proc.returncode}: {self._log()}"
                )
            if self._answers():
                return self
            time.sleep(0.02)
        self.kill()
        raise ChmError(None, f"redis-server did not answer on {self.host}:{self.port}")

    def _answers(self) -> bool:
        if self.prefix:  # inside a namespace: ask it with its own client there
            cli = shutil.which("redis-cli") or "redis-cli"
            r = subprocess.run(
                [*self.prefix, cli, "-h", self.host, "-p", str(self.port), "PING"],
                capture_output=True,
                timeout=5,
                check=False,
            )
            return r.stdout.strip() == b"PONG"
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def _log(self) -> str:
        with contextlib.suppress(OSError), open(os.path.join(self._dir, "redis.log")) as f:
            return f.read()[-400:]
        return ""

    def kill(self) -> None:
        """SIGKILL (no shutdown, no save): the server is gone at once."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
