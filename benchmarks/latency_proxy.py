"""A loopback TCP proxy that adds latency: every client-to-server chunk is held for D ms.

A request to an object store waits about one round trip before its first byte. In front of a
local emulator (moto's S3), holding each chunk the client sends for ``delay_ms`` gives every
request that wait, as a real store's first-byte latency does, while chunks already held keep
flowing (a chunk is due ``delay_ms`` after it arrived, not after the previous one was sent). The
server's replies pass at once. The proxy counts the bytes each way and the HTTP requests, so a
benchmark can say how many bytes a reader fetched.

It runs in a process of its own (``python -I latency_proxy.py PORT DELAY_MS``, told the
delay and asked the counts on its stdin), so its threads never compete with the measured reader
for the interpreter lock. It listens on 127.0.0.1 only, and ends when its parent does.

    with LatencyProxy(target_port=9000, delay_ms=40) as proxy:
        os.environ["AWS_ENDPOINT_URL"] = proxy.url
        ...
        proxy.delay_ms = 0          # applies to connections already open, too
        proxy.counts()              # {"sent": ..., "received": ..., "requests": ..., ...}
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque

_CHUNK = 1 << 16
_NAMES = ("sent", "received", "requests", "connections")


class LatencyProxy:
    """A TCP proxy on ``127.0.0.1`` to ``127.0.0.1:target_port`` (see the module).

    Args:
        target_port: The server's port on 127.0.0.1.
        delay_ms: How long each client-to-server chunk is held. Defaults to 0.
    """

    def __init__(self, target_port: int, delay_ms: float = 0.0):
        # The file itself, isolated (-I: no environment, no script folder on the path): it
        # needs only the standard library, whatever package ``benchmarks`` names here.
        self._proc = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), str(target_port), str(delay_ms)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lock = threading.Lock()
        self._delay = float(delay_ms)
        line = self._proc.stdout.readline()  # its port, once it listens
        if not line:
            self.close()
            raise RuntimeError("the latency proxy did not start")
        self.port = int(line)
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def delay_ms(self) -> float:
        return self._delay

    @delay_ms.setter
    def delay_ms(self, value: float) -> None:
        self._ask(f"delay {float(value)}")
        self._delay = float(value)

    def counts(self) -> dict[str, int]:
        """Bytes ``sent`` (client to server), ``received`` (server to client), HTTP
        ``requests`` and ``connections`` so far."""
        return json.loads(self._ask("counts"))

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> LatencyProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ask(self, command: str) -> str:
        with self._lock:
            self._proc.stdin.write(command + "\n")
            self._proc.stdin.flush()
            return self._proc.stdout.readline().strip()


class _State:
    """The proxy process's delay and counters, shared by its threads."""

    def __init__(self, delay_ms: float):
        self.delay_ms = delay_ms
        self.lock = threading.Lock()
        self.counts = dict.fromkeys(_NAMES, 0)

    def add(self, name: str, n: int) -> None:
        if n:
            with self.lock:
                self.counts[name] += n


def main(argv: list[str]) -> None:
    """The proxy process: serve, and answer ``delay MS`` and ``counts`` on stdin."""
    target_port, state = int(argv[0]), _State(float(argv[1]))
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    _thread(_accept, listener, target_port, state)
    print(listener.getsockname()[1], flush=True)
    for line in sys.stdin:  # the parent's commands; its exit closes stdin and ends this
        command, _, value = line.strip().partition(" ")
        if command == "delay":
            state.delay_ms = float(value)
            print("ok", flush=True)
        elif command == "counts":
            with state.lock:
                print(json.dumps(state.counts), flush=True)
        else:
            print("?", flush=True)


def _accept(listener, target_port: int, state: _State) -> None:
    while True:
        client, _ = listener.accept()
        try:
            server = socket.create_connection(("127.0.0.1", target_port))
        except OSError:
            client.close()
            continue
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state.add("connections", 1)
        _thread(_upstream, client, server, state)
        _thread(_downstream, server, client, state)


def _upstream(client, server, state: _State) -> None:
    """Client to server: each chunk is due ``delay`` ms after it arrived."""
    held: deque = deque()
    wake = threading.Condition()

    def send() -> None:
        while True:
            with wake:
                while not held:
                    wake.wait()
                due, data = held.popleft()
            wait = due + state.delay_ms / 1000 - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if data is None or not _send(server, data):
                _close(server, client)
                return

    _thread(send)
    while True:
        data = _recv(client)
        if data:
            state.add("sent", len(data))
            state.add("requests", data.count(b" HTTP/1.1\r\n"))
        with wake:
            held.append((time.monotonic(), data or None))
            wake.notify()
        if not data:
            return


def _downstream(server, client, state: _State) -> None:
    while True:
        data = _recv(server)
        if not data or not _send(client, data):
            _close(server, client)
            return
        state.add("received", len(data))


def _recv(s) -> bytes:
    try:
        return s.recv(_CHUNK)
    except OSError:
        return b""


def _send(s, data: bytes) -> bool:
    try:
        s.sendall(data)
        return True
    except OSError:
        return False


def _close(*sockets) -> None:
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def _thread(target, *args) -> None:
    threading.Thread(target=target, args=args, daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1:])
