"""A server program the suite starts on a free loopback port, and restarts if it died.

moto's S3 (``tests.conftest.MotoServer``) and Azurite (``tests.azurite.AzuriteServer``) are
both this: a child in its own session that dies with the pytest process that started it, up
once its port accepts connections.
"""

from __future__ import annotations

import socket
import subprocess
import time

import pytest


class LoopbackServer:
    """A server subprocess on 127.0.0.1; subclasses say its :meth:`command`.

    Attributes:
        name: What errors call it ("moto's server").
        stop_grace: Seconds :meth:`stop` waits after SIGTERM before SIGKILL.
    """

    name = "the server"
    stop_grace = 20.0

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def start_if_down(self) -> bool:
        """Start it, or start it again on a new port if it died; True when it was (re)started."""
        if self.proc is not None and self.proc.poll() is None and self._accepts():
            return False
        self.stop()
        self._start()
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=self.stop_grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def _accepts(self, timeout: float = 5.0) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=timeout).close()
            return True
        except OSError:
            return False

    def _start(self) -> None:
        from tests.conftest import _die_with_parent

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            self.command(self.port),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent(),
        )
        deadline = time.monotonic() + 60
        while not self._accepts(timeout=1):
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited at start (code {self.proc.returncode})")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"{self.name} did not start within 60 s")
            time.sleep(0.2)
