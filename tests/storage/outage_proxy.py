"""A loopback TCP proxy in front of a test store that takes the store away at an exact moment.

``OutageProxy(port)`` forwards 127.0.0.1:proxy.port to 127.0.0.1:port. Once armed with
``proxy.arm(trigger, seconds)``, the first HTTP request whose request line matches ``trigger``
(a regex over ``METHOD /path``) starts an outage of ``seconds``: that request never reaches the
store (or, armed with ``landed=True``, it does, and its reply is lost), and for the outage every connection (the client's pooled ones, and new ones) is reset as
soon as it sends anything, as a store that restarts or drops off the network does. Then it
forwards again. So an outage lands exactly when the path under test starts, not after a guessed
sleep, and it fails the store's calls at once (a paused server only delays them: the SDKs' own
timeouts and retries hide a pause of a few seconds).

It runs in a process of its own (``python -I outage_proxy.py PORT``, commanded on its stdin):
deltalake's calls hold the interpreter lock while they wait for the store, so a proxy on threads
of the test's process would never answer them. It listens on 127.0.0.1 only, and ends when its
parent closes its stdin.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time

_CHUNK = 1 << 16
_REQUEST = re.compile(rb"(?:^|\r\n)([A-Z]+ [^ \r\n]+) HTTP/1\.[01]\r\n")


class OutageProxy:
    """The proxy's process, seen from the test (see the module)."""

    def __init__(self, target_port: int):
        self._proc = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), str(target_port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lock = threading.Lock()
        self.trigger = None
        self.port = int(self._proc.stdout.readline())
        self.url = f"http://127.0.0.1:{self.port}"

    def arm(self, trigger: str, seconds: float, landed: bool = False) -> None:
        """Start an outage of ``seconds`` at the next request matching ``trigger`` (which
        reaches the store, and whose reply is lost, with ``landed``)."""
        self.trigger = trigger
        self._ask(json.dumps({"trigger": trigger, "seconds": seconds, "landed": landed}))

    def state(self) -> dict:
        """``fired`` (the trigger matched), ``refused`` (requests the outage turned away),
        ``down_for`` (seconds the outage still lasts) and ``requests`` (request lines seen since
        it was armed)."""
        return json.loads(self._ask("state"))

    def wait_back(self) -> None:
        """Return once the outage (if it started) is over."""
        time.sleep(self.state()["down_for"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _ask(self, line: str) -> str:
        with self._lock:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
            return self._proc.stdout.readline()


class _Outage:
    """The proxy process's trigger and outage, shared by its threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.trigger, self.seconds, self.landed = None, 0.0, False
        self.fired, self.refused, self.down_until = False, 0, 0.0
        self.requests: list[str] = []

    def arm(self, trigger: str, seconds: float, landed: bool) -> None:
        with self.lock:
            self.trigger, self.seconds = re.compile(trigger.encode()), seconds
            self.landed = landed
            self.fired, self.refused, self.requests = False, 0, []

    def state(self) -> dict:
        with self.lock:
            down_for = max(0.0, self.down_until - time.time())
            return {"fired": self.fired, "refused": self.refused, "down_for": down_for,
                    "requests": self.requests[-50:]}  # fmt: skip

    def turned_away(self, chunk: bytes) -> bool | str:
        """Whether this chunk from a client is turned away (it may start the outage): True,
        False, or "landed" (it is sent on, and the reply to it is lost)."""
        lines = _REQUEST.findall(chunk)
        with self.lock:
            self.requests += [line.decode(errors="replace") for line in lines]
            now = time.time()
            if self.trigger is not None and not self.fired:
                if any(self.trigger.search(line) for line in lines):
                    self.fired, self.down_until = True, now + self.seconds
                    if self.landed:
                        return "landed"
            down = now < self.down_until
            self.refused += len(lines) if down else 0
            return down


def main(argv: list[str]) -> None:
    target_port, outage = int(argv[0]), _Outage()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    _thread(_accept, listener, target_port, outage)
    print(listener.getsockname()[1], flush=True)
    for line in sys.stdin:  # the parent's commands; its exit closes stdin and ends this
        if line.strip() == "state":
            print(json.dumps(outage.state()), flush=True)
        else:
            armed = json.loads(line)
            outage.arm(armed["trigger"], armed["seconds"], armed["landed"])
            print("ok", flush=True)


def _accept(listener: socket.socket, target_port: int, outage: _Outage) -> None:
    while True:
        client, _ = listener.accept()
        try:
            server = socket.create_connection(("127.0.0.1", target_port))
        except OSError:
            _reset(client)
            continue
        link = _Link(client, server)
        _thread(_pipe, server, client, None, link)
        _thread(_pipe, client, server, outage, link)


class _Link:
    """One client's connection and the proxy's to the server."""

    def __init__(self, *sockets: socket.socket):
        self.sockets, self.cut, self.ended = sockets, threading.Event(), 0
        self.lock = threading.Lock()

    def end(self, reset: bool) -> None:
        """One direction ended: with a reset, both close at once; at an end of stream, both
        close once the other direction has ended too (its end passed on, as a server's close)."""
        with self.lock:
            self.ended += 1
            last = self.ended == 2
        if reset or last:
            for sock in self.sockets:
                _reset(sock) if reset else _close(sock)


def _pipe(src: socket.socket, dst: socket.socket, outage: _Outage | None, link: _Link) -> None:
    try:
        while chunk := src.recv(_CHUNK):
            if outage is None:  # the server's reply
                if link.cut.is_set():
                    break
            elif (away := outage.turned_away(chunk)) == "landed":
                link.cut.set()
            elif away:
                break
            dst.sendall(chunk)
        else:  # the end of its stream, passed on
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            link.end(reset=False)
            return
    except OSError:
        pass
    link.end(reset=True)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset (SO_LINGER 0), as a vanished server's host answers.

    Shutting its reading side first wakes the other thread's ``recv`` on it: until that returns,
    the kernel would keep the socket open, and the client would wait on it instead."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


def _thread(target, *args) -> None:
    threading.Thread(target=target, args=args, daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1:])
