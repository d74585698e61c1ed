"""AsyncClient's HTTP handling and the pty request shapes (sync and
async), against the fake daemon of test_offline (no forkd needed)."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from typing import Any, AsyncIterator, List

import pytest

import forkd
from forkd import AsyncClient, AsyncSandbox, PtySize, Sandbox, SandboxInfo
from test_offline import DOCKERFILE, _b64, _build_routes, _context_dir, _ev, _Handler, _Server, fake  # noqa: F401 - fixture

EXEC = ("POST", "/v1/sandboxes/sb-1/exec")
WAIT = 30  # generous: the machine may be loaded


def _aclient(srv: _Server, **kw: Any) -> AsyncClient:
    return AsyncClient(socket=srv.sock_path, **kw)  # type: ignore[attr-defined]


def _asb(srv: _Server, **kw: Any) -> AsyncSandbox:
    return AsyncSandbox(_aclient(srv, **kw), SandboxInfo.from_json({"id": "sb-1", "tag": "t", "state": "running"}))


def _read_chunked(r: _Handler) -> bytes:
    out = b""
    while True:
        size = int(r.rfile.readline().split(b";")[0], 16)
        if size == 0:
            r.rfile.readline()
            return out
        out += r.rfile.read(size)
        r.rfile.readline()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, WAIT))


def test_keep_alive_and_json(fake: _Server) -> None:
    fake.routes[("GET", "/v1/healthz")] = lambda h: h.send_json(200, {"status": "ok"})

    async def main() -> None:
        async with _aclient(fake) as c:
            for _ in range(10):
                assert await c.health()

    run(main())
    assert fake.connections == 1


def test_errors_are_typed_and_refusals_retried(fake: _Server) -> None:
    calls: List[int] = []

    def fork(h: _Handler) -> None:
        calls.append(1)
        if len(calls) == 1:
            h.send_json(503, {"title": "Service Unavailable", "status": 503, "detail": "restarting",
                              "code": "unavailable"}, {"Retry-After": "0"})
        else:
            h.send_json(200, {"sandboxes": [{"id": "sb-9", "tag": "t", "state": "running"}]})

    def text_error(h: _Handler) -> None:
        body = b"upstream exploded"
        h.send_response(502)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    fake.routes[("POST", "/v1/sandboxes")] = fork
    fake.routes[("GET", "/v1/version")] = text_error

    async def main() -> None:
        c = _aclient(fake)
        sbs = await c.sandboxes.fork("t", 1)
        assert [s.id for s in sbs] == ["sb-9"] and len(calls) == 2
        with pytest.raises(forkd.NotFound) as ei:
            await c.sandboxes.get("nope")
        assert ei.value.request_id and "no route" in str(ei.value)
        with pytest.raises(forkd.ForkdError) as e2:
            await c.version()
        assert "HTTP 502" in str(e2.value) and "upstream exploded" in str(e2.value)

    run(main())


def test_exec_ndjson_stream_and_async_callbacks(fake: _Server) -> None:
    def h(r: _Handler) -> None:
        r.start_chunked()
        r.chunk(_ev("start", pid=7))
        # A UTF-8 character split across two events, and two events in a chunk.
        r.chunk(_ev("stdout", data="h\u00e9".encode()[:2]))
        r.chunk(_ev("stdout", data="h\u00e9".encode()[2:] + b"\n") + _ev("stderr", data=b"warn"))
        r.chunk(_ev("exit", exit_code=0, duration_us=2000))
        r.end_chunks()

    fake.routes[EXEC] = h
    seen: List[str] = []

    async def on_out(s: str) -> None:
        await asyncio.sleep(0)
        seen.append(s)

    async def main() -> None:
        sb = _asb(fake)
        r = await sb.commands.run(["echo", "hé"], on_stdout=on_out, on_stderr=seen.append)
        assert (r.stdout, r.stderr, r.exit_code, r.pid, r.duration_ms) == ("hé\n", "warn", 0, 7, 2.0)
        r2 = await sb.commands.run("x")  # the connection was read to its end: reused
        assert r2.stdout == "hé\n"

    run(main())
    assert "".join(s for s in seen if s != "warn") == "hé\n" and "warn" in seen
    assert all("\ufffd" not in s for s in seen)
    assert fake.connections == 1
    assert json.loads(fake.requests[0][2]["X-Forkd-Exec"]) == {"argv": ["echo", "hé"]}


def test_chunked_upload_and_full_duplex_stdin(fake: _Server) -> None:
    uploads: List[bytes] = []

    def write(h: _Handler) -> None:
        assert h.headers.get("Transfer-Encoding") == "chunked"
        uploads.append(_read_chunked(h))
        h.send_json(200, {"path": "/f", "name": "f", "size": len(uploads[-1]), "type": "file"})

    def echo(r: _Handler) -> None:
        # Answer before the body ends: the client must read while it writes.
        r.start_chunked()
        r.chunk(_ev("start", pid=3))
        data = _read_chunked(r)
        r.chunk(_ev("stdout", data=data) + _ev("exit", exit_code=0))
        r.end_chunks()

    fake.routes[("PUT", "/v1/sandboxes/sb-1/files")] = write
    fake.routes[EXEC] = echo

    async def gen() -> AsyncIterator[bytes]:
        for i in range(50):
            yield b"%d," % i

    async def main() -> None:
        sb = _asb(fake)
        info = await sb.files.write("/f", gen())
        assert info.size == len(uploads[0])
        r = await sb.commands.run("cat", stdin=b"x" * 300000)
        assert r.stdout_bytes == b"x" * 300000

    run(main())
    assert uploads[0] == b"".join(b"%d," % i for i in range(50))
    assert json.loads(fake.requests[-1][2]["X-Forkd-Exec"]) == {"shell": "cat", "stdin": True}


def test_stream_cut_and_timeout(fake: _Server) -> None:
    release = threading.Event()

    def cut(r: _Handler) -> None:
        r.start_chunked()
        r.chunk(_ev("stdout", data=b"partial"))
        r.close_connection = True
        r.connection.shutdown(2)

    def hang(h: _Handler) -> None:
        release.wait(WAIT)

    fake.routes[EXEC] = cut
    fake.routes[("GET", "/v1/version")] = hang

    async def main() -> None:
        sb = _asb(fake, request_timeout=0.3)
        with pytest.raises(forkd.StreamInterrupted) as ei:
            await sb.commands.run("x")
        assert ei.value.partial.stdout == "partial"
        with pytest.raises(forkd.Timeout):
            await sb.client.version()

    try:
        run(main())
    finally:
        release.set()


def test_cancelled_stream_closes_its_connection(fake: _Server) -> None:
    started = threading.Event()
    gone = threading.Semaphore(0)

    def h(r: _Handler) -> None:
        r.start_chunked()
        r.chunk(_ev("start", pid=5))
        started.set()
        # The client stops reading: the next reads see its close.
        r.connection.settimeout(WAIT)
        try:
            if r.rfile.read(1) == b"":
                gone.release()
        except OSError:
            gone.release()

    fake.routes[EXEC] = h

    async def main() -> None:
        c = _aclient(fake)
        sb = AsyncSandbox(c, SandboxInfo.from_json({"id": "sb-1", "tag": "t"}))
        task = asyncio.ensure_future(sb.commands.run("sleep 1000"))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert c._transport._idle == []  # never pooled
        # The same for a background handle's reader task.
        started.clear()
        handle = await sb.commands.run("sleep 1000", background=True)
        while handle.pid is None:  # the start event is read by its task
            await asyncio.sleep(0.01)
        assert handle.pid == 5
        handle._task.cancel()
        await asyncio.sleep(0)
        with pytest.raises(asyncio.CancelledError):
            await handle._task
        assert c._transport._idle == []

    run(main())
    for what in ("run", "background handle"):
        assert gone.acquire(timeout=WAIT), "the daemon never saw the cancelled %s's connection close" % what


def _pty_routes(fake: _Server, got: List[Any]) -> None:
    def exec_h(r: _Handler) -> None:
        r.send_response(200)
        r.send_header("Content-Type", "application/x-ndjson")
        r.send_header("Transfer-Encoding", "chunked")
        r.send_header("X-Forkd-Pid", "42")
        r.end_headers()
        r.chunk(_ev("start", pid=42) + _ev("stdout", data=b"$ "))
        r.chunk(_ev("exit", exit_code=137, signal="SIGKILL"))
        r.end_chunks()

    def record(status: int) -> Any:
        def h(r: _Handler) -> None:
            got.append((r.path, r.body))
            if status == 204:
                r.send_response(204)
                r.end_headers()
            else:
                r.send_json(status, {})
        return h

    fake.routes[EXEC] = exec_h
    fake.routes[("POST", "/v1/sandboxes/sb-1/processes/42/stdin")] = record(204)
    fake.routes[("POST", "/v1/sandboxes/sb-1/processes/42/resize")] = record(204)
    fake.routes[("POST", "/v1/sandboxes/sb-1/processes/42/signal")] = record(200)


def _check_pty_wire(fake: _Server, got: List[Any], data: List[bytes]) -> None:
    hdr = json.loads([r for r in fake.requests if r[1].endswith("/exec")][0][2]["X-Forkd-Exec"])
    assert hdr["pty"] == {"rows": 30, "cols": 100} and hdr["stdin_open"] is True
    assert hdr["cwd"] == "/tmp" and hdr["env"] == {"A": "1"} and hdr["timeout_ms"] == 60000
    assert "bash" in hdr["shell"] and "stdin" not in hdr
    assert got == [
        ("/v1/sandboxes/sb-1/processes/42/stdin", b"ls\n"),
        ("/v1/sandboxes/sb-1/processes/42/resize", b'{"rows":50,"cols":200}'),
        ("/v1/sandboxes/sb-1/processes/42/signal", b'{"signal":"SIGKILL"}'),
    ]
    assert b"".join(data) == b"$ "


def test_pty_wire_shapes_sync(fake: _Server) -> None:
    got: List[Any] = []
    data: List[bytes] = []
    _pty_routes(fake, got)
    sb = Sandbox("sb-1", client=forkd.Client(socket=fake.sock_path))  # type: ignore[attr-defined]
    h = sb.pty.create(PtySize(rows=30, cols=100), cwd="/tmp", envs={"A": "1"}, on_data=data.append)
    assert h.pid == 42
    sb.pty.send_stdin(42, b"ls\n")
    sb.pty.resize(42, PtySize(rows=50, cols=200))
    assert sb.pty.kill(42)
    with pytest.raises(forkd.CommandExitError):
        h.wait(WAIT)
    _check_pty_wire(fake, got, data)
    with pytest.raises(forkd.InvalidArgument, match=r"pty cols 0: want 1\.\.1000"):
        sb.pty.resize(42, PtySize(rows=5, cols=0))
    with pytest.raises(forkd.InvalidArgument, match="pty rows 1001"):
        sb.pty.create(PtySize(rows=1001, cols=80))


def test_pty_wire_shapes_async(fake: _Server) -> None:
    got: List[Any] = []
    data: List[bytes] = []
    _pty_routes(fake, got)

    async def main() -> None:
        sb = _asb(fake)
        h = await sb.pty.create(PtySize(rows=30, cols=100), cwd="/tmp", envs={"A": "1"}, on_data=data.append)
        assert h.pid == 42
        await sb.pty.send_stdin(42, b"ls\n")
        await sb.pty.resize(42, PtySize(rows=50, cols=200))
        assert await sb.pty.kill(42)
        res = await asyncio.gather(h.wait(), return_exceptions=True)
        assert isinstance(res[0], forkd.CommandExitError) and res[0].result.signal == "SIGKILL"
        with pytest.raises(forkd.InvalidArgument):
            await sb.pty.resize(42, PtySize(rows=0, cols=80))

    run(main())
    _check_pty_wire(fake, got, data)


def test_async_snapshot_create_from_dockerfile(fake: _Server) -> None:
    """AsyncSnapshots.create sends the build source (a context directory
    read off the loop) and follows the operation through a cut stream,
    awaiting a coroutine on_progress; start_create and the validation are
    the sync client's."""
    bodies: List[Any] = []
    _build_routes(fake, bodies)
    events = fake.routes[("GET", "/v1/operations/op-b/events")]
    attaches: List[int] = []

    def cut_once(h: _Handler) -> None:
        attaches.append(1)
        if len(attaches) == 1:
            h.start_chunked()
            h.end_chunks()  # ended before the operation: re-attach
            return
        events(h)

    fake.routes[("GET", "/v1/operations/op-b/events")] = cut_once
    msgs: List[str] = []

    async def progress(m: str) -> None:
        msgs.append(m)

    d = _context_dir()

    async def main() -> None:
        async with _aclient(fake) as c:
            s = await c.snapshots.create(
                "t", dockerfile=DOCKERFILE, build_args={"V": "2"}, context=d, build_network="public",
                on_progress=progress, idempotency_key="k-b",
            )
            assert s.id == "s-b"
            op = await c.snapshots.start_create("t", dockerfile=DOCKERFILE, context={"app/req.txt": "requests\n"})
            assert op.id == "op-b"
            with pytest.raises(forkd.InvalidArgument, match="recipe, recipe_toml, from_image and dockerfile"):
                await c.snapshots.create("t", recipe="minimal", from_image="python:3.12")
            with pytest.raises(forkd.InvalidArgument, match="go with dockerfile"):
                await c.snapshots.start_create("t", recipe="minimal", name="x")

    try:
        run(main())
    finally:
        shutil.rmtree(d)
    assert msgs == ["building"] and len(attaches) == 2
    assert bodies[0] == {
        "tag": "t",
        "dockerfile": DOCKERFILE,
        "build_args": {"V": "2"},
        "context": [
            {"path": "app/req.txt", "mode": 0o640, "data": _b64(b"requests\n")},
            {"path": "app/sub/run.sh", "mode": 0o755, "data": _b64(b"#!/bin/sh\n")},
        ],
        "build_network": {"mode": "public"},
    }
    assert bodies[1] == {"tag": "t", "dockerfile": DOCKERFILE, "context": [{"path": "app/req.txt", "mode": 420, "data": _b64(b"requests\n")}]}
    assert len(bodies) == 2
    hdrs = fake.requests[0][2]
    assert hdrs.get("Prefer") == "respond-async" and hdrs.get("Idempotency-Key") == "k-b"


def test_async_registry_credentials(fake: _Server) -> None:
    """The async fork and snapshot create send registry credentials as the
    sync ones do, and refuse them with a local tag before sending."""
    forks: List[Any] = []

    def fork(r: _Handler) -> None:
        forks.append(json.loads(r.body))
        r.send_json(201, {"sandboxes": [{"id": "sb-1", "tag": "ref--py", "state": "running"}]})

    builds: List[Any] = []
    _build_routes(fake, builds)
    fake.routes[("POST", "/v1/sandboxes")] = fork
    ref = "registry.example:5000/team/py:3.12"

    async def main() -> None:
        async with _aclient(fake) as c:
            sb = await AsyncSandbox.create(ref, client=c, pull_policy="always", registry_username="bob", registry_password="s3cret")
            assert sb.id == "sb-1"
            await AsyncSandbox.fork(ref, 2, client=c, registry_username="bob", registry_password="s3cret")
            await c.sandboxes.fork(ref, 1)
            for call in (lambda: AsyncSandbox.create("py", client=c, registry_username="bob", registry_password="s3cret"),
                         lambda: c.sandboxes.fork("py", 1, registry_password="s3cret")):
                with pytest.raises(forkd.InvalidArgument, match="'py' is a local tag: drop them") as ei:
                    await call()
                assert "s3cret" not in str(ei.value)
            await c.snapshots.create("t", from_image=ref, registry_username="bob", registry_password="s3cret")
            await c.snapshots.start_create("t", dockerfile=DOCKERFILE, registry_password="tok")

    run(main())
    creds = {"registry_username": "bob", "registry_password": "s3cret"}
    assert forks == [
        dict({"tag": ref, "count": 1, "timeout_s": 300, "pull_policy": "always"}, **creds),
        dict({"tag": ref, "count": 2, "timeout_s": 300}, **creds),
        {"tag": ref, "count": 1, "timeout_s": 300},
    ]
    assert builds == [dict({"tag": "t", "from": ref}, **creds), {"tag": "t", "dockerfile": DOCKERFILE, "registry_password": "tok"}]
