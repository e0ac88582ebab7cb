"""A fault-injecting HTTP proxy in front of an S3 endpoint, for the tests: the store stays real,
only the network between js-etl and it is faulted.

It forwards each request as it came (the ``Host`` header too: a SigV4 signature covers it) to
the upstream store and its answer back, one upstream connection per client connection, except
for requests a *rule* matches. A rule names a method and a regular expression searched in the
request target (path and query), how many matching requests it lets pass first (``skip``) and
how many it faults (``times``), and what it does to them:

* ``error`` — answer ``status`` with S3's XML error body (``SlowDown`` for 503,
  ``InternalError`` for 500, else ``code``); the request never reaches the store;
* ``error_after`` — forward it, let the store answer, and answer ``status`` instead: the request
  *did* reach the store, the client learns otherwise;
* ``reset_before`` — close the client's connection with a TCP reset once its headers are read
  (its body, if any, read too): the request never reaches the store;
* ``reset_mid_body`` — forward the headers and half of the body, then reset both connections:
  the upload is cut in the middle, the store sees it end early;
* ``reset_after`` — forward it, read the store's answer, then reset the client's connection:
  the request reached the store, its answer is lost;
* ``delay`` — forward it, and hold the store's answer ``seconds`` before passing it on.

It runs as its own process (``python tools/fault_proxy.py --upstream URL``), so a client in the
test's process that holds the GIL while it waits for an answer cannot stall it. It listens on a
free 127.0.0.1 port, prints ``listening <port>`` on stdout, and is stopped by its pid. It is
driven over HTTP on the same port, under ``/__faults__/`` (no S3 bucket name starts with ``_``):
``POST /__faults__/rules`` adds a rule (JSON), ``DELETE /__faults__/rules`` removes them all,
``GET /__faults__/log`` returns every request seen (method, target, what was done) as JSON.

    with FaultProxy(s3_server.endpoint) as proxy:
        proxy.add("PUT", r"/_delta_log/\\d+\\.json", "reset_after")
        env["AWS_ENDPOINT_URL"] = proxy.endpoint
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Self
from urllib.parse import urlparse

CONTROL = "/__faults__/"
ACTIONS = ("error", "error_after", "reset_before", "reset_mid_body", "reset_after", "delay")
ERROR_CODES = {503: "SlowDown", 500: "InternalError"}


@dataclass
class Rule:
    method: str  # "PUT", "GET", ... or "*"
    target: str  # a regular expression searched in the request target (path?query)
    action: str  # one of ACTIONS
    times: int = 1  # how many matching requests are faulted (after ``skip``)
    skip: int = 0  # how many matching requests pass first
    status: int = 503
    code: str | None = None
    seconds: float = 0.0  # for ``delay``
    matched: int = field(default=0)

    def applies(self, method: str, target: str) -> bool:
        """Whether this rule faults this request (counting it as matched)."""
        if self.method not in ("*", method) or not re.search(self.target, target):
            return False
        self.matched += 1
        return self.skip < self.matched <= self.skip + self.times


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rules: list[Rule] = []
        self.log: list[dict[str, Any]] = []

    def decide(self, method: str, target: str) -> Rule | None:
        with self.lock:
            for rule in self.rules:
                if rule.applies(method, target):
                    return rule
            return None

    def record(self, method: str, target: str, action: str, **extra: Any) -> None:
        with self.lock:
            self.log.append({"method": method, "target": target, "action": action,
                             "time": time.time(), **extra})


class _Request:
    def __init__(self, line: bytes, headers: list[tuple[str, str]], raw_head: bytes) -> None:
        self.method, self.target, _ = line.decode("latin-1").split(" ", 2)
        self.headers = headers
        self.raw_head = raw_head

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name), None)


def _read_head(stream: IO[bytes]) -> tuple[bytes, list[tuple[str, str]], bytes] | None:
    """The start line, headers and raw bytes of a message's head; None at a clean EOF."""
    line = stream.readline()
    if not line:
        return None
    raw = [line]
    headers = []
    while True:
        h = stream.readline()
        if not h:
            raise ConnectionError("connection closed inside a message head")
        raw.append(h)
        if h in (b"\r\n", b"\n"):
            break
        name, _, value = h.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    return line.rstrip(b"\r\n"), headers, b"".join(raw)


def _read_body(stream: IO[bytes], headers: list[tuple[str, str]], *, until_close: bool
               ) -> bytes:
    """A message's body as it came on the wire (chunks kept as chunks)."""
    values = {k.lower(): v for k, v in headers}
    if "chunked" in values.get("transfer-encoding", "").lower():
        out = []
        while True:
            size_line = stream.readline()
            out.append(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, up to the empty line
                    t = stream.readline()
                    out.append(t)
                    if t in (b"\r\n", b"\n", b""):
                        return b"".join(out)
            out.append(_exactly(stream, size + 2))
    if "content-length" in values:
        return _exactly(stream, int(values["content-length"]))
    return stream.read() if until_close else b""


def _exactly(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise ConnectionError("connection closed inside a message body")
    return data


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dropped connection looks to its peer."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def _error_answer(status: int, code: str, target: str) -> bytes:
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>injected by the fault proxy</Message><Resource>{target}</Resource>"
            "<RequestId>fault-proxy</RequestId></Error>").encode()
    reason = {503: "Slow Down", 500: "Internal Server Error"}.get(status, "Error")
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class _Connection:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: tuple[str, int], state: _State) -> None:
        self.client = client
        self.cin = client.makefile("rb")
        self.upstream_address = upstream
        self.state = state
        self.up: socket.socket | None = None
        self.uin: IO[bytes] | None = None

    def _upstream(self) -> tuple[socket.socket, IO[bytes]]:
        if self.up is None:
            self.up = socket.create_connection(self.upstream_address, timeout=120)
            self.uin = self.up.makefile("rb")
        assert self.uin is not None
        return self.up, self.uin

    def _drop_upstream(self, reset: bool = False) -> None:
        if self.up is not None:
            _reset(self.up) if reset else self.up.close()
        self.up = self.uin = None

    def serve(self) -> None:
        try:
            while self._one():
                pass
        except (OSError, ConnectionError, ValueError):
            pass
        finally:
            self._drop_upstream()
            try:
                self.client.close()
            except OSError:
                pass

    def _one(self) -> bool:
        head = _read_head(self.cin)
        if head is None:
            return False
        request = _Request(*head)
        if request.target.startswith(CONTROL):
            return self._control(request)
        rule = self.state.decide(request.method, request.target)
        action = rule.action if rule else "pass"
        expect = (request.header("expect") or "").lower() == "100-continue"
        if action == "reset_before" and not expect:
            _read_body(self.cin, request.headers, until_close=False)
        if action == "reset_before":
            self.state.record(request.method, request.target, action)
            _reset(self.client)
            return False
        if action == "error":
            if not expect:  # a client waiting for 100 Continue sends no body
                _read_body(self.cin, request.headers, until_close=False)
            assert rule is not None
            self.state.record(request.method, request.target, action, status=rule.status)
            self.client.sendall(_error_answer(rule.status, rule.code or
                                              ERROR_CODES.get(rule.status, "InternalError"),
                                              request.target))
            return not expect
        if expect:
            self.client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = _read_body(self.cin, request.headers, until_close=False)
        up, uin = self._upstream()
        if action == "reset_mid_body":
            up.sendall(request.raw_head + body[: len(body) // 2])
            self.state.record(request.method, request.target, action, sent=len(body) // 2,
                              of=len(body))
            self._drop_upstream(reset=True)
            _reset(self.client)
            return False
        up.sendall(request.raw_head + body)
        answer, keep = self._answer(uin, request.method)
        if action == "reset_after":
            self.state.record(request.method, request.target, action,
                              upstream_status=_status(answer))
            self._drop_upstream()
            _reset(self.client)
            return False
        if action == "error_after":
            assert rule is not None
            self.state.record(request.method, request.target, action, status=rule.status,
                              upstream_status=_status(answer))
            self.client.sendall(_error_answer(rule.status, rule.code or
                                              ERROR_CODES.get(rule.status, "InternalError"),
                                              request.target))
            if not keep:
                self._drop_upstream()
            return True
        if action == "delay":
            assert rule is not None
            time.sleep(rule.seconds)
        self.state.record(request.method, request.target, action,
                          upstream_status=_status(answer))
        self.client.sendall(answer)
        if not keep:
            self._drop_upstream()
            return False
        return True

    def _answer(self, uin: IO[bytes], method: str) -> tuple[bytes, bool]:
        """The store's final answer (interim 1xx ones skipped) and whether its connection stays
        open."""
        while True:
            head = _read_head(uin)
            if head is None:
                raise ConnectionError("the store closed the connection without an answer")
            line, headers, raw = head
            status = int(line.split(b" ", 2)[1])
            if status >= 200:
                break
        values = {k.lower(): v.lower() for k, v in headers}
        bodiless = method == "HEAD" or status in (204, 304)
        framed = "content-length" in values or "chunked" in values.get("transfer-encoding", "")
        body = b"" if bodiless else _read_body(uin, headers, until_close=not framed)
        keep = values.get("connection") != "close" and (bodiless or framed)
        return raw + body, keep

    def _control(self, request: _Request) -> bool:
        body = _read_body(self.cin, request.headers, until_close=False)
        what = request.target[len(CONTROL):]
        state = self.state
        answer: Any = {"ok": True}
        with state.lock:
            if what == "rules" and request.method == "POST":
                rule = Rule(**json.loads(body))
                if rule.action not in ACTIONS:
                    raise ValueError(rule.action)
                state.rules.append(rule)
            elif what == "rules" and request.method == "DELETE":
                state.rules.clear()
            elif what == "rules":
                answer = [asdict(r) for r in state.rules]
            elif what == "log":
                answer = list(state.log)
        data = json.dumps(answer).encode()
        self.client.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                            + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        return True


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def serve(upstream: str, port: int = 0) -> None:
    parsed = urlparse(upstream)
    address = (parsed.hostname or "127.0.0.1", parsed.port or 80)
    state = _State()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    print(f"listening {listener.getsockname()[1]}", flush=True)
    while True:
        client, _ = listener.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_Connection(client, address, state).serve, daemon=True).start()


class FaultProxy:
    """The proxy as a process of its own, for the tests: started on a free port, driven over
    HTTP, stopped by its pid."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.port = 0
        self._proc: subprocess.Popen[str] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout: float = 20.0) -> Self:
        self._proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--upstream", self.upstream],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        stdout = self._proc.stdout
        assert stdout is not None
        ready: list[str] = []
        reader = threading.Thread(target=lambda: ready.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)  # the line it prints once it listens
        if not ready or not ready[0].startswith("listening "):
            self.stop()
            raise RuntimeError(f"the fault proxy did not start: {ready}")
        self.port = int(ready[0].split()[1])
        return self

    def _call(self, method: str, what: str, payload: Any = None) -> Any:
        data = json.dumps(payload).encode() if payload is not None else None
        request = urllib.request.Request(f"{self.endpoint}{CONTROL}{what}", data=data,
                                         method=method)
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def add(self, method: str, target: str, action: str, **options: Any) -> None:
        """Add a rule (:class:`Rule`); rules are tried in the order they were added."""
        self._call("POST", "rules", {"method": method, "target": target, "action": action,
                                     **options})

    def clear(self) -> None:
        self._call("DELETE", "rules")

    def log(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "log"))

    def faults(self) -> list[dict[str, Any]]:
        """The requests a rule acted on."""
        return [entry for entry in self.log() if entry["action"] != "pass"]

    def stop(self, timeout: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="the store's URL, http://host:port")
    parser.add_argument("--port", type=int, default=0, help="0: a free one (printed)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    serve(args.upstream, args.port)


if __name__ == "__main__":
    main()
