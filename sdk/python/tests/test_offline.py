"""Transport and error handling against a fake daemon in this process.

These need no forkd daemon: they cover what a real one rarely does on
demand (429 with Retry-After, a non-JSON error, a connection dropped
between requests, streams cut at exact points, a hung daemon).
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import socketserver
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterator, List

import pytest

import forkd
from forkd import Client, Sandbox


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *a: Any) -> None:  # quiet
        pass

    def address_string(self) -> str:
        return "fake"

    def _route(self) -> None:
        self.server.requests.append((self.command, self.path, dict(self.headers)))
        n = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(n) if n else b""
        fn = self.server.routes.get((self.command, self.path.split("?")[0]))
        if fn is None:
            self.send_json(404, {"title": "Not Found", "status": 404, "detail": "no route", "code": "not_found"})
            return
        fn(self)

    do_GET = do_POST = do_PUT = do_DELETE = _route

    def send_json(self, status: int, obj: Any, headers: Dict[str, str] = {}) -> None:  # noqa: B006
        data = json.dumps(obj).encode()
        self.send_response(status)
        ctype = "application/problem+json" if status >= 400 else "application/json"
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Request-Id", "req-%d" % len(self.server.requests))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def start_chunked(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Request-Id", "stream-1")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, path: str) -> None:
        self.routes: Dict[Any, Callable[[_Handler], None]] = {}
        self.requests: List[Any] = []
        self.connections = 0
        super().__init__(path, _Handler)

    def get_request(self) -> Any:
        self.connections += 1
        return super().get_request()


@pytest.fixture
def fake() -> Iterator[_Server]:
    d = tempfile.mkdtemp(prefix="forkd-fake-")
    path = os.path.join(d, "fake.sock")
    srv = _Server(path)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    srv.sock_path = path  # type: ignore[attr-defined]
    yield srv
    srv.shutdown()
    srv.server_close()
    os.unlink(path)
    os.rmdir(d)


def _client(srv: _Server, **kw: Any) -> Client:
    return Client(socket=srv.sock_path, **kw)  # type: ignore[attr-defined]


def _ev(typ: str, **kw: Any) -> bytes:
    d: Dict[str, Any] = {"type": typ}
    if "data" in kw:
        kw["data"] = base64.b64encode(kw["data"]).decode()
    d.update(kw)
    return json.dumps(d).encode() + b"\n"


def test_keep_alive_reuses_one_connection(fake: _Server) -> None:
    fake.routes[("GET", "/v1/healthz")] = lambda h: h.send_json(200, {"status": "ok"})
    c = _client(fake)
    for _ in range(20):
        assert c.health()
    assert fake.connections == 1
    c.close()


def test_rate_limited_retry_after(fake: _Server) -> None:
    problem = {"type": "https://forkd.dev/problems/resource_exhausted", "title": "Too Many Requests", "status": 429,
               "detail": "64 sandboxes running: resource exhausted", "code": "resource_exhausted", "request_id": "abc"}
    fake.routes[("POST", "/v1/sandboxes")] = lambda h: h.send_json(429, problem, {"Retry-After": "2"})
    with pytest.raises(forkd.RateLimited) as ei:
        Sandbox.create("t", client=_client(fake, retries=0))
    e = ei.value
    assert e.retry_after == 2 and e.status == 429 and e.request_id == "abc" and "64 sandboxes" in str(e)
    assert e.problem == problem


def test_unavailable_and_non_json_error(fake: _Server) -> None:
    def h(r: _Handler) -> None:
        data = b"upstream exploded"
        r.send_response(503)
        r.send_header("Content-Length", str(len(data)))
        r.send_header("Retry-After", "5")
        r.end_headers()
        r.wfile.write(data)

    fake.routes[("GET", "/v1/version")] = h
    with pytest.raises(forkd.Unavailable) as ei:
        _client(fake, retries=0).version()
    assert ei.value.status == 503 and ei.value.retry_after == 5 and "upstream exploded" in str(ei.value)


def test_refusals_with_retry_after_are_retried(fake: _Server) -> None:
    """429/503 with a Retry-After are sent again after the wait, up to
    ``retries`` times; the last refusal is raised with its retry_after."""
    answers = [429, 503, 200]
    problem = {"title": "Too Many Requests", "status": 429, "detail": "64 sandboxes running", "code": "resource_exhausted"}

    def h(r: _Handler) -> None:
        status = answers.pop(0) if answers else 429
        if status == 200:
            r.send_json(200, {"version": "test"})
        else:
            r.send_json(status, dict(problem, status=status), {"Retry-After": "0"})

    fake.routes[("GET", "/v1/version")] = h
    assert _client(fake).version().version == "test"  # two refusals, then the answer
    assert len(fake.requests) == 3
    answers[:] = [429, 429, 429, 200]
    with pytest.raises(forkd.RateLimited) as ei:
        _client(fake, retries=2).version()
    assert ei.value.retry_after == 0 and len(fake.requests) == 6


def test_refusals_not_retried(fake: _Server) -> None:
    """No Retry-After, a wait over 10 s or another status: raised at once."""
    calls = {"n": 0}

    def h(r: _Handler) -> None:
        calls["n"] += 1
        status, headers = {1: (429, {}), 2: (503, {"Retry-After": "60"}), 3: (500, {"Retry-After": "0"})}[calls["n"]]
        r.send_json(status, {"title": "no", "status": status, "detail": "refused %d" % calls["n"]}, headers)

    fake.routes[("GET", "/v1/version")] = h
    c = _client(fake)
    start = time.monotonic()
    for want in (forkd.RateLimited, forkd.Unavailable, forkd.ForkdError):
        with pytest.raises(want):
            c.version()
    assert calls["n"] == 3 and time.monotonic() - start < 30  # not the 60 s Retry-After


def test_unauthenticated_hint(fake: _Server) -> None:
    fake.routes[("GET", "/v1/version")] = lambda h: h.send_json(
        401, {"title": "Unauthorized", "status": 401, "detail": "missing bearer token", "code": "unauthenticated"})
    with pytest.raises(forkd.AuthenticationError) as ei:
        _client(fake).version()
    assert "FORKD_TOKEN" in str(ei.value)


def test_permission_denied(fake: _Server) -> None:
    fake.routes[("GET", "/v1/version")] = lambda h: h.send_json(
        403, {"title": "Forbidden", "status": 403, "detail": "token ro (read-only) may not call it", "code": "permission_denied"})
    with pytest.raises(forkd.PermissionDenied) as ei:
        _client(fake).version()
    assert isinstance(ei.value, PermissionError) and ei.value.status == 403 and ei.value.code == "permission_denied"


def test_token_is_sent(fake: _Server) -> None:
    fake.routes[("GET", "/v1/version")] = lambda h: h.send_json(200, {"version": "x"})
    _client(fake, token="forkd_secret").version()
    assert fake.requests[-1][2].get("Authorization") == "Bearer forkd_secret"


def test_stale_keep_alive_connection_is_retried(fake: _Server) -> None:
    def close_after(h: _Handler) -> None:
        h.send_json(200, {"status": "ok"})
        h.close_connection = True  # no Connection: close header: the client believes it can reuse it

    fake.routes[("GET", "/v1/healthz")] = close_after
    c = _client(fake)
    assert c.health()
    time.sleep(0.1)
    assert c.health()  # the pooled connection is dead; retried on a new one
    assert fake.connections == 2


def test_exec_stream_cut_before_exit(fake: _Server) -> None:
    def h(r: _Handler) -> None:
        r.start_chunked()
        r.chunk(_ev("stdout", data=b"partial out\n"))
        r.close_connection = True
        r.wfile.flush()
        r.connection.shutdown(2)  # no exit event, no final chunk

    fake.routes[("POST", "/v1/sandboxes/sb-1/exec")] = h
    sb = Sandbox("sb-1", client=_client(fake))
    with pytest.raises(forkd.StreamInterrupted) as ei:
        sb.commands.run("x")
    assert ei.value.partial.stdout == "partial out\n"


def test_exec_stream_ends_cleanly_without_exit(fake: _Server) -> None:
    def h(r: _Handler) -> None:
        r.start_chunked()
        r.chunk(_ev("stdout", data=b"x"))
        r.end_chunks()

    fake.routes[("POST", "/v1/sandboxes/sb-1/exec")] = h
    with pytest.raises(forkd.StreamInterrupted) as ei:
        Sandbox("sb-1", client=_client(fake)).commands.run("x")
    assert "before the process exited" in str(ei.value)


def test_exec_exit_event_with_error(fake: _Server) -> None:
    def h(r: _Handler) -> None:
        r.start_chunked()
        r.chunk(_ev("exit", exit_code=-1, error="agent: exec: unexpected EOF: unavailable"))
        r.end_chunks()

    fake.routes[("POST", "/v1/sandboxes/sb-1/exec")] = h
    with pytest.raises(forkd.StreamInterrupted) as ei:
        Sandbox("sb-1", client=_client(fake)).commands.run("x")
    assert ei.value.code == "unavailable" and "unexpected EOF" in str(ei.value)


def test_exec_request_wire_format(fake: _Server) -> None:
    def h(r: _Handler) -> None:
        r.start_chunked()
        r.chunk(_ev("stdout", data=b"o") + _ev("stderr", data=b"e"))
        r.chunk(_ev("exit", exit_code=0, duration_us=1500))
        r.end_chunks()

    fake.routes[("POST", "/v1/sandboxes/sb-1/exec")] = h
    c = _client(fake)
    sb = Sandbox("sb-1", client=c)
    r = sb.commands.run(["ls", "-l"], envs={"A": "é"}, cwd="/w", timeout=2.5)
    assert (r.stdout, r.stderr, r.exit_code, r.duration_ms) == ("o", "e", 0, 1.5)
    hdr = json.loads(fake.requests[-1][2]["X-Forkd-Exec"])
    assert hdr == {"argv": ["ls", "-l"], "env": {"A": "é"}, "cwd": "/w", "timeout_ms": 2500}
    sb.commands.run("echo hi")
    assert json.loads(fake.requests[-1][2]["X-Forkd-Exec"]) == {"shell": "echo hi"}
    assert fake.connections == 1  # streams read to the end are reused


def test_process_control_wire_format(fake: _Server) -> None:
    got: List[bytes] = []
    closed = threading.Event()

    def exec_h(r: _Handler) -> None:
        r.send_response(200)
        r.send_header("Content-Type", "application/x-ndjson")
        r.send_header("Transfer-Encoding", "chunked")
        r.send_header("X-Forkd-Pid", "42")
        r.end_headers()
        r.chunk(_ev("start", pid=42))
        closed.wait(10)
        r.chunk(_ev("stdout", data=b"".join(got)) + _ev("exit", exit_code=0))
        r.end_chunks()

    def stdin_h(r: _Handler) -> None:
        got.append(r.body)
        if "close=true" in r.path:
            closed.set()
        r.send_response(204)
        r.send_header("Content-Length", "0")
        r.end_headers()

    def signal_h(r: _Handler) -> None:
        if json.loads(r.body) != {"signal": "SIGTERM"}:
            r.send_json(400, {"title": "Bad Request", "status": 400, "detail": "bad body", "code": "invalid_argument"})
            return
        r.send_response(204)
        r.send_header("Content-Length", "0")
        r.end_headers()

    procs = [{"pid": 42, "argv": ["/bin/sh", "-c", "cat"], "shell": "cat", "cwd": "/root",
              "started": "2026-01-02T03:04:05.123456789Z", "stdin_open": True}]
    fake.routes[("POST", "/v1/sandboxes/sb-1/exec")] = exec_h
    fake.routes[("POST", "/v1/sandboxes/sb-1/processes/42/stdin")] = stdin_h
    fake.routes[("POST", "/v1/sandboxes/sb-1/processes/42/signal")] = signal_h
    fake.routes[("GET", "/v1/sandboxes/sb-1/processes")] = lambda h: h.send_json(200, procs)
    fake.routes[("POST", "/v1/sandboxes/sb-1/processes/7/signal")] = lambda h: h.send_json(
        404, {"title": "Not Found", "status": 404, "code": "not_found",
              "detail": "agent: signal process 7: no running exec with pid 7: not found"})

    sb = Sandbox("sb-1", client=_client(fake))
    h = sb.commands.run("cat", background=True, stdin=True)
    assert h.pid == 42
    assert json.loads(fake.requests[-1][2]["X-Forkd-Exec"]) == {"shell": "cat", "stdin_open": True}
    h.send_stdin("héllo ")
    h.send_stdin(b"world")
    (p,) = sb.commands.list()
    assert (p.pid, p.cmd, p.argv, p.cwd, p.stdin_open) == (42, "cat", ["/bin/sh", "-c", "cat"], "/root", True)
    assert p.started is not None and p.started.year == 2026
    assert sb.commands.kill(42, "SIGTERM") is True
    assert sb.commands.kill(7) is False  # no such process: E2B's False
    with pytest.raises(forkd.InvalidArgument):
        sb.commands.send_stdin(0, "x")
    h.close_stdin()
    r = h.wait()
    assert r.stdout == "héllo world" and r.pid == 42
    stdin_reqs = [(m, path) for m, path, _ in fake.requests if "/stdin" in path]
    assert stdin_reqs[-1] == ("POST", "/v1/sandboxes/sb-1/processes/42/stdin?close=true")
    assert got[-1] == b""  # close sends no bytes


def test_file_read_cut_midway(fake: _Server) -> None:
    def h(r: _Handler) -> None:
        r.send_response(200)
        r.send_header("Content-Length", "1000")
        r.end_headers()
        r.wfile.write(b"x" * 400)
        r.wfile.flush()
        r.close_connection = True
        r.connection.shutdown(2)

    fake.routes[("GET", "/v1/sandboxes/sb-1/files")] = h
    sb = Sandbox("sb-1", client=_client(fake))
    with pytest.raises(forkd.StreamInterrupted):
        sb.files.read("/f", "bytes")
    with pytest.raises(forkd.StreamInterrupted):
        with sb.files.read("/f", "stream") as st:
            for _ in st:
                pass


def test_request_timeout(fake: _Server) -> None:
    answer = threading.Event()

    def hang(r: _Handler) -> None:
        answer.wait(60)
        r.send_json(200, {})

    fake.routes[("GET", "/v1/version")] = hang
    t0 = time.monotonic()
    try:
        with pytest.raises(forkd.Timeout) as ei:
            _client(fake, request_timeout=0.3).version()
    finally:
        answer.set()
    assert time.monotonic() - t0 < 30 and isinstance(ei.value, TimeoutError)  # it hangs for a minute


def test_run_code_stream_error_event(fake: _Server) -> None:
    def h(r: _Handler) -> None:
        r.start_chunked()
        r.chunk(json.dumps({"type": "stdout", "data": "so far\n"}).encode() + b"\n")
        r.chunk(json.dumps({"type": "error", "error": {
            "title": "Service Unavailable", "status": 503, "code": "unavailable",
            "detail": "agent: the Python session died: unavailable", "request_id": "rq"}}).encode() + b"\n")
        r.end_chunks()

    fake.routes[("POST", "/v1/sandboxes/sb-1/run_code/stream")] = h
    with pytest.raises(forkd.StreamInterrupted) as ei:
        Sandbox("sb-1", client=_client(fake)).run_code("x", on_stdout=lambda s: None)
    assert "session died" in str(ei.value) and ei.value.partial.logs.stdout == ["so far\n"]


def test_run_code_result_mapping(fake: _Server) -> None:
    fake.routes[("POST", "/v1/sandboxes/sb-1/run_code")] = lambda h: h.send_json(200, {
        "stdout": "out", "stderr": "", "duration_us": 2000,
        "display": [{"image/png": base64.b64encode(b"\x89PNG..").decode(), "text/plain": "<Figure>"},
                    {"text/html": "<b>d</b>", "application/json": "{\"a\": 1}", "application/x-custom": "c"}],
        "result": {"text/plain": "3", "text/html": "<p>3</p>"},
    })
    ex = Sandbox("sb-1", client=_client(fake)).run_code("x")
    assert [r.is_main_result for r in ex.results] == [False, False, True]
    fig, d, main = ex.results
    assert fig.png_bytes() == b"\x89PNG.." and fig.formats() == ["text", "png"]
    assert d.html == "<b>d</b>" and d.json == {"a": 1} and d.extra == {"application/x-custom": "c"}
    assert d.formats() == ["html", "json", "application/x-custom"]
    assert ex.text == "3" and main.html == "<p>3</p>" and ex.logs.stdout == ["out"] and ex.duration_ms == 2.0


def test_snapshot_failed_while_waiting(fake: _Server) -> None:
    states = iter(["writing", "failed"])

    def get(h: _Handler) -> None:
        st = next(states)
        h.send_json(200, {"tag": "b", "id": "1", "state": st, "error": "disk full" if st == "failed" else ""})

    fake.routes[("GET", "/v1/snapshots/b")] = get
    with pytest.raises(forkd.ForkdError) as ei:
        _client(fake).snapshots.wait("b", poll_interval=0.01)
    assert ei.value.code == "snapshot_failed" and "disk full" in str(ei.value)


def test_empty_ids_refused() -> None:
    with pytest.raises(forkd.InvalidArgument):
        Sandbox("", client=Client(socket="/nonexistent.sock"))


def test_snapshot_delete_returns_what_was_removed(fake: _Server) -> None:
    fake.routes[("DELETE", "/v1/snapshots/base")] = lambda h: h.send_json(200, {"removed": ["layer", "base"]})

    def old_daemon(h: _Handler) -> None:  # before the list: 204, no body
        h.send_response(204)
        h.end_headers()

    fake.routes[("DELETE", "/v1/snapshots/old")] = old_daemon
    c = _client(fake)
    assert c.snapshots.delete("base", cascade=True) == ["layer", "base"]
    assert fake.requests[-1][1] == "/v1/snapshots/base?cascade=true"
    assert c.snapshots.delete("old") == ["old"]


def test_snapshot_create_follows_its_operation(fake: _Server) -> None:
    """create() starts the operation (Prefer: respond-async, the key sent),
    follows its events through a cut stream (re-attaching) and returns the
    snapshot in its result."""
    op = {"id": "op-1", "kind": "snapshot.create", "target": "t1", "state": "running", "progress": []}
    attaches: List[int] = []

    def start(h: _Handler) -> None:
        h.send_json(202, op, {"Location": "/v1/operations/op-1"})

    def events(h: _Handler) -> None:
        attaches.append(1)
        h.start_chunked()
        if len(attaches) == 1:
            h.chunk(json.dumps({"type": "state", "operation": op}).encode() + b"\n")
            h.chunk(json.dumps({"type": "progress", "message": "booting template"}).encode() + b"\n")
            h.end_chunks()  # cut before the end: the client re-attaches
            return
        now = dict(op, progress=["booting template"])
        h.chunk(json.dumps({"type": "state", "operation": now}).encode() + b"\n")
        snap = {"tag": "t1", "id": "s-1", "state": "ready"}
        h.chunk(json.dumps({"type": "state", "operation": dict(now, state="succeeded", result=snap)}).encode() + b"\n")
        h.end_chunks()

    fake.routes[("POST", "/v1/snapshots")] = start
    fake.routes[("GET", "/v1/operations/op-1/events")] = events
    msgs: List[str] = []
    with _client(fake) as c:
        s = c.snapshots.create("t1", recipe="minimal", on_progress=msgs.append, idempotency_key="k-1")
    assert s.tag == "t1" and s.id == "s-1"
    assert msgs == ["booting template"]
    assert len(attaches) == 2
    _, _, hdrs = fake.requests[0]
    assert hdrs.get("Prefer") == "respond-async" and hdrs.get("Idempotency-Key") == "k-1"


DOCKERFILE = "FROM python:3.12-slim\nARG V=1\nCOPY app /app\nRUN pip install -r /app/req.txt\n"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _build_routes(fake: _Server, bodies: List[Dict[str, Any]]) -> None:
    """A daemon that starts a create (202) and whose operation succeeds at
    once with the snapshot."""
    op = {"id": "op-b", "kind": "snapshot.create", "target": "t", "state": "running", "progress": []}

    def start(h: _Handler) -> None:
        bodies.append(json.loads(h.body))
        h.send_json(202, op, {"Location": "/v1/operations/op-b"})

    def events(h: _Handler) -> None:
        h.start_chunked()
        h.chunk(json.dumps({"type": "progress", "message": "building"}).encode() + b"\n")
        done = dict(op, state="succeeded", progress=["building"], result={"tag": "t", "id": "s-b", "state": "ready"})
        h.chunk(json.dumps({"type": "state", "operation": done}).encode() + b"\n")
        h.end_chunks()

    fake.routes[("POST", "/v1/snapshots")] = start
    fake.routes[("GET", "/v1/operations/op-b/events")] = events


def _context_dir() -> str:
    d = tempfile.mkdtemp(prefix="forkd-ctx-")
    os.makedirs(os.path.join(d, "app", "sub"))
    with open(os.path.join(d, "app", "req.txt"), "wb") as f:
        f.write(b"requests\n")
    with open(os.path.join(d, "app", "sub", "run.sh"), "wb") as f:
        f.write(b"#!/bin/sh\n")
    os.chmod(os.path.join(d, "app", "req.txt"), 0o640)
    os.chmod(os.path.join(d, "app", "sub", "run.sh"), 0o755)
    os.symlink("/etc/passwd", os.path.join(d, "app", "link"))  # left out
    return d


def test_snapshot_create_from_dockerfile_wire_format(fake: _Server) -> None:
    """A Dockerfile, its context (a mapping, then a directory), build args
    and the build VMs' network go in the create body; from_image as from."""
    bodies: List[Dict[str, Any]] = []
    _build_routes(fake, bodies)
    msgs: List[str] = []
    c = _client(fake)
    s = c.snapshots.create(
        "t", dockerfile=DOCKERFILE, name="app", build_args={"V": "2"},
        context={"app/req.txt": b"requests\n", "./app/main.py": "print('hi')\n"},
        build_network="public", network="none", memory_mib=512, on_progress=msgs.append,
    )
    assert s.id == "s-b" and msgs == ["building"]
    assert bodies[-1] == {
        "tag": "t",
        "dockerfile": DOCKERFILE,
        "name": "app",
        "build_args": {"V": "2"},
        "context": [
            {"path": "app/main.py", "mode": 0o644, "data": _b64(b"print('hi')\n")},
            {"path": "app/req.txt", "mode": 420, "data": _b64(b"requests\n")},
        ],
        "build_network": {"mode": "public"},
        "network": {"mode": "none"},
        "memory_mib": 512,
    }

    d = _context_dir()
    try:
        op = c.snapshots.start_create("t", dockerfile=DOCKERFILE, context=d, build_network={"mode": "allow", "allow": ["pypi.org"]})
        assert op.id == "op-b"
    finally:
        shutil.rmtree(d)
    assert bodies[-1] == {
        "tag": "t",
        "dockerfile": DOCKERFILE,
        "context": [
            {"path": "app/req.txt", "mode": 0o640, "data": _b64(b"requests\n")},
            {"path": "app/sub/run.sh", "mode": 0o755, "data": _b64(b"#!/bin/sh\n")},
        ],
        "build_network": {"mode": "allow", "allow": ["pypi.org"]},
    }

    c.snapshots.start_create("t", from_image="registry.example.com/python:3.12-slim", insecure_registry=True)
    assert bodies[-1] == {"tag": "t", "from": "registry.example.com/python:3.12-slim", "insecure_registry": True}
    c.snapshots.start_create("t", recipe_toml="name = 'x'\n", context={"f.txt": b""})
    assert bodies[-1] == {"tag": "t", "recipe_toml": "name = 'x'\n", "context": [{"path": "f.txt", "mode": 420, "data": ""}]}


def test_snapshot_create_build_source_refused_before_sending(fake: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    import forkd._context as ctx

    c = _client(fake)
    four = "recipe, recipe_toml, from_image and dockerfile"
    bad: List[Any] = [
        ({}, four),
        ({"recipe": "minimal", "dockerfile": DOCKERFILE}, four),
        ({"from_image": "python:3.12", "recipe_toml": "x"}, four),
        ({"dockerfile": ""}, "dockerfile must be a non-empty string"),
        ({"recipe": "minimal", "build_args": {"V": "2"}}, "go with dockerfile"),
        ({"from_image": "python:3.12", "name": "x"}, "go with dockerfile"),
        ({"dockerfile": DOCKERFILE, "build_args": {"V": 2}}, "build_args"),
        ({"from_image": "python:3.12", "context": {"a": b""}}, "not with from_image"),
        ({"dockerfile": DOCKERFILE, "context": {"/etc/passwd": b""}}, "relative"),
        ({"dockerfile": DOCKERFILE, "context": {"../x": b""}}, r"without \.\."),
        ({"dockerfile": DOCKERFILE, "context": {"a/../../x": b""}}, r"without \.\."),
        ({"dockerfile": DOCKERFILE, "context": {"": b""}}, "non-empty"),
        ({"dockerfile": DOCKERFILE, "context": {".": b""}}, "the context itself"),
        ({"dockerfile": DOCKERFILE, "context": {"a": b"", "./a": b""}}, "given twice"),
        ({"dockerfile": DOCKERFILE, "context": {"a": 1}}, "bytes or str"),
        ({"dockerfile": DOCKERFILE, "context": 7}, "directory path"),
        ({"dockerfile": DOCKERFILE, "context": "/nonexistent/forkd-ctx"}, "not a directory"),
        ({"dockerfile": DOCKERFILE, "build_network": "internet"}, "network policy .internet."),
    ]
    for kw, msg in bad:
        with pytest.raises(forkd.InvalidArgument, match=msg):
            c.snapshots.create("t", **kw)
        with pytest.raises(forkd.InvalidArgument, match=msg):
            c.snapshots.start_create("t", **kw)

    monkeypatch.setattr(ctx, "MAX_CONTEXT_BYTES", 10)
    with pytest.raises(forkd.InvalidArgument, match="over the daemon's limit of 10 bytes"):
        c.snapshots.start_create("t", dockerfile=DOCKERFILE, context={"a": b"123456", "b": b"123456"})
    d = _context_dir()
    try:
        with pytest.raises(forkd.InvalidArgument, match="over the daemon's limit of 10 bytes"):
            c.snapshots.start_create("t", dockerfile=DOCKERFILE, context=d)
        monkeypatch.setattr(ctx, "MAX_CONTEXT_BYTES", 64 << 20)
        monkeypatch.setattr(ctx, "MAX_CONTEXT_FILES", 1)
        with pytest.raises(forkd.InvalidArgument, match="1 files"):
            c.snapshots.start_create("t", dockerfile=DOCKERFILE, context=d)
    finally:
        shutil.rmtree(d)
    assert fake.requests == []


def test_operation_cancel_and_failed_result(fake: _Server) -> None:
    """cancel() posts to the operation; a cancelled operation's wait result
    raises its problem."""
    ended = {"id": "op-2", "kind": "snapshot.create", "target": "t2", "state": "cancelled",
             "error": {"title": "", "status": 499, "detail": "operation cancelled by request", "code": "canceled"}}
    fake.routes[("POST", "/v1/operations/op-2/cancel")] = lambda h: h.send_json(202, dict(ended, state="running", cancel_requested=True))

    def events(h: _Handler) -> None:
        h.start_chunked()
        h.chunk(json.dumps({"type": "state", "operation": ended}).encode() + b"\n")
        h.end_chunks()

    fake.routes[("GET", "/v1/operations/op-2/events")] = events
    with _client(fake) as c:
        assert c.operations.cancel("op-2").cancel_requested
        op = c.operations.wait("op-2")
        assert op.state == "cancelled" and op.done
        with pytest.raises(forkd.ForkdError, match="cancelled by request"):
            c.operations._result(op)
        with pytest.raises(forkd.InvalidArgument):
            c.sandboxes.fork("x", idempotency_key="k" * 256)


def test_list_follows_cursors(fake: _Server) -> None:
    ids = ["sb-1", "sb-2", "sb-3", "sb-4", "sb-5"]

    def sandboxes(h: _Handler) -> None:
        import urllib.parse as up

        q = up.parse_qs(up.urlparse(h.path).query)
        start = int(q.get("cursor", ["0"])[0])
        end = min(start + 2, len(ids))  # pages of 2, whatever the limit
        page: Dict[str, Any] = {"items": [{"id": i, "tag": q["tag"][0]} for i in ids[start:end]]}
        if end < len(ids):
            page["next_cursor"] = str(end)
        h.send_json(200, page)

    fake.routes[("GET", "/v1/sandboxes")] = sandboxes
    # A daemon from before paging answers a bare array.
    fake.routes[("GET", "/v1/operations")] = lambda h: h.send_json(200, [{"id": "op-1"}, {"id": "op-2"}])
    fake.routes[("GET", "/v1/snapshots")] = lambda h: h.send_json(200, {"items": []})
    c = _client(fake)
    got = c.sandboxes.list(tag="py", labels={"team": "a"})
    assert [s.id for s in got] == ids and all(s.tag == "py" for s in got)
    paths = [p for (m, p, _) in fake.requests if p.startswith("/v1/sandboxes")]
    assert len(paths) == 3 and all("label=team%3Da" in p and "limit=1000" in p for p in paths)
    assert "cursor=2" in paths[1] and "cursor=4" in paths[2]
    assert [o.id for o in c.operations.list()] == ["op-1", "op-2"]
    assert c.snapshots.list() == []


def test_list_stops_on_a_repeated_cursor(fake: _Server) -> None:
    fake.routes[("GET", "/v1/operations")] = lambda h: h.send_json(200, {"items": [{"id": "op-1"}], "next_cursor": "x"})
    with pytest.raises(forkd.ForkdError, match="same next_cursor"):
        _client(fake).operations.list()


def test_fork_by_reference_wire_format(fake: _Server) -> None:
    bodies: List[Dict[str, Any]] = []

    def h(r: _Handler) -> None:
        bodies.append(json.loads(r.body))
        r.send_json(201, {"sandboxes": [{"id": "sb-1", "tag": "ref--py-3.12-0123456789abcdef01234567", "state": "running"}]})

    fake.routes[("POST", "/v1/sandboxes")] = h
    c = _client(fake)
    ref = "registry.example:5000/team/py:3.12"
    sb = Sandbox.create(ref, client=c, pull_policy="always")
    assert sb.id == "sb-1"
    assert bodies[-1]["tag"] == ref and bodies[-1]["pull_policy"] == "always"
    c.sandboxes.fork(ref, 2)
    assert "pull_policy" not in bodies[-1]  # the daemon's default: if_not_present
    with pytest.raises(forkd.InvalidArgument, match="pull_policy"):
        c.sandboxes.fork(ref, 1, pull_policy="never")
    assert len(bodies) == 2


def test_fork_by_reference_registry_credentials(fake: _Server) -> None:
    """registry_username/registry_password go in the fork body only when
    given, and are refused before sending with a local tag; no message
    shows the password."""
    bodies: List[Dict[str, Any]] = []

    def h(r: _Handler) -> None:
        bodies.append(json.loads(r.body))
        r.send_json(201, {"sandboxes": [{"id": "sb-1", "tag": "ref--py-3.12-0123456789abcdef01234567", "state": "running"}]})

    fake.routes[("POST", "/v1/sandboxes")] = h
    c = _client(fake)
    ref = "registry.example:5000/team/py:3.12"
    Sandbox.create(ref, client=c, pull_policy="always", registry_username="bob", registry_password="s3cret")
    assert bodies[-1] == {"tag": ref, "count": 1, "timeout_s": 300, "pull_policy": "always",
                          "registry_username": "bob", "registry_password": "s3cret"}
    Sandbox.fork(ref, 2, client=c, registry_password="tok")
    assert bodies[-1] == {"tag": ref, "count": 2, "timeout_s": 300, "registry_password": "tok"}
    c.sandboxes.fork(ref + "@sha256:" + "0" * 64, 1, registry_username="bob", registry_password="s3cret", timeout=None)
    assert bodies[-1] == {"tag": ref + "@sha256:" + "0" * 64, "count": 1,
                          "registry_username": "bob", "registry_password": "s3cret"}
    c.sandboxes.fork(ref, 1, registry_username=None, registry_password="")  # not given
    assert bodies[-1] == {"tag": ref, "count": 1, "timeout_s": 300}
    n = len(bodies)
    for kw in ({"registry_username": "bob", "registry_password": "s3cret"}, {"registry_password": "s3cret"}):
        for fork in (lambda: Sandbox.create("py", client=c, **kw), lambda: c.sandboxes.fork("py", 2, **kw)):
            with pytest.raises(forkd.InvalidArgument, match="registry reference.*'py' is a local tag: drop them") as ei:
                fork()
            assert "s3cret" not in str(ei.value) and "s3cret" not in repr(ei.value)
    with pytest.raises(forkd.InvalidArgument, match="registry_password must be a str, not bytes") as ei:
        c.sandboxes.fork(ref, 1, registry_password=b"s3cret")  # type: ignore[arg-type]
    assert "s3cret" not in str(ei.value)
    assert len(bodies) == n


def test_snapshot_create_registry_credentials(fake: _Server) -> None:
    """registry_username/registry_password go in the create body with any
    build source, only when given."""
    bodies: List[Dict[str, Any]] = []
    _build_routes(fake, bodies)
    c = _client(fake)
    img = "registry.example.com/team/python:3.12-slim"
    s = c.snapshots.create("t", from_image=img, registry_username="bob", registry_password="s3cret")
    assert s.id == "s-b"
    assert bodies[-1] == {"tag": "t", "from": img, "registry_username": "bob", "registry_password": "s3cret"}
    c.snapshots.start_create("t", dockerfile=DOCKERFILE, registry_username="bob", registry_password="s3cret")
    assert bodies[-1] == {"tag": "t", "dockerfile": DOCKERFILE, "registry_username": "bob", "registry_password": "s3cret"}
    c.snapshots.start_create("t", recipe_toml="from = '%s'\n" % img, registry_password="tok")
    assert bodies[-1] == {"tag": "t", "recipe_toml": "from = '%s'\n" % img, "registry_password": "tok"}
    c.snapshots.start_create("t", recipe="minimal", registry_username="bob")
    assert bodies[-1] == {"tag": "t", "recipe": "minimal", "registry_username": "bob"}
    c.snapshots.start_create("t", from_image=img)
    assert bodies[-1] == {"tag": "t", "from": img}
    n = len(bodies)
    with pytest.raises(forkd.InvalidArgument, match="registry_username must be a str, not int"):
        c.snapshots.start_create("t", from_image=img, registry_username=7, registry_password="s3cret")  # type: ignore[arg-type]
    assert len(bodies) == n
