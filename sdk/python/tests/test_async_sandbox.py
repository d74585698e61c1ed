"""AsyncSandbox against a real daemon: the calls of the sync tests,
awaited, plus concurrency and cancellation. Skipped without
FORKD_TEST_TAG (see conftest.py)."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any, AsyncIterator, Awaitable, Callable, List, TypeVar

import pytest

import forkd
from forkd import AsyncClient, AsyncSandbox, PtySize

T = TypeVar("T")
DEADLINE = 600  # an outer bound for one test on a loaded machine


def arun(test_tag: str, body: Callable[[AsyncSandbox], Awaitable[T]], **kw: Any) -> T:
    """Run body with a fresh sandbox of test_tag, killed afterwards."""

    async def main() -> T:
        async with AsyncClient() as c:
            async with await AsyncSandbox.create(test_tag, client=c, metadata={"suite": "sdk-python-async"}, **kw) as sb:
                return await body(sb)

    return asyncio.run(asyncio.wait_for(main(), DEADLINE))


async def until(cond: Callable[[], Awaitable[bool]], what: str, timeout: float = 60) -> None:
    """Wait for cond, polling; fail after a generous timeout."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not await cond():
        if loop.time() > end:
            pytest.fail("timed out waiting for " + what)
        await asyncio.sleep(0.05)


def test_lifecycle_connect_list_timeout(test_tag: str) -> None:
    async def main() -> None:
        c = AsyncClient()
        assert await c.health()
        label = secrets.token_hex(4)
        sb = await AsyncSandbox.create(test_tag, client=c, metadata={"t": label})
        try:
            assert sb.tag == test_tag and await sb.is_running()
            again = await AsyncSandbox.connect(sb.id, client=c)
            assert (await again.info()).id == sb.id
            assert [i.id for i in await AsyncSandbox.list(labels={"t": label}, client=c)] == [sb.id]
            info = await sb.set_timeout(120)
            assert info.expires_at is not None
            net = await sb.get_network()
            assert net.policy.mode
            port = await sb.get_port(8080)
            assert "/ports/8080" in port.path or port.host
            assert (await sb.get_host(8080)).endswith("/ports/8080/") or port.host
        finally:
            assert await sb.kill()
        assert not await sb.kill()  # already gone
        assert not await sb.is_running()
        with pytest.raises(forkd.NotFound):
            await AsyncSandbox.connect(sb.id, client=c)
        await c.aclose()

    asyncio.run(asyncio.wait_for(main(), DEADLINE))


def test_commands(test_tag: str) -> None:
    async def body(sb: AsyncSandbox) -> None:
        r = await sb.commands.run("echo $A; pwd", envs={"A": "x"}, cwd="/tmp")
        assert r.stdout == "x\n/tmp\n"
        assert (await sb.commands.run(["echo", "a b"])).stdout == "a b\n"
        with pytest.raises(forkd.CommandExitError) as ei:
            await sb.commands.run("echo oops >&2; exit 3")
        assert ei.value.exit_code == 3 and ei.value.stderr == "oops\n"
        assert (await sb.commands.run("exit 4", check=False)).exit_code == 4
        with pytest.raises(forkd.NotFound):
            await sb.commands.run(["/no/such/binary"])
        r = await sb.commands.run("sleep 30", timeout=0.5, check=False)
        assert r.timed_out

    arun(test_tag, body)


def test_stdin_forms_and_full_duplex(test_tag: str) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(100):
            yield b"%d\n" % i

    async def body(sb: AsyncSandbox) -> None:
        assert (await sb.commands.run("cat", stdin="text")).stdout == "text"
        assert (await sb.commands.run("wc -l", stdin=chunks())).stdout.strip() == "100"
        big = secrets.token_bytes(3 << 20)
        r = await sb.commands.run("cat", stdin=big)
        assert r.stdout_bytes == big

    arun(test_tag, body)


def test_streaming_callbacks_and_background(test_tag: str) -> None:
    async def body(sb: AsyncSandbox) -> None:
        got: List[str] = []

        async def on_out(s: str) -> None:
            got.append(s)

        h = await sb.commands.run("echo first; read x; echo got $x", on_stdout=on_out, stdin=True, background=True)
        await until(lambda: _true(bool(got)), "the first line")
        assert "".join(got) == "first\n" and h.is_running()
        await h.send_stdin("hello\n")
        await h.close_stdin()
        r = await h.wait()
        assert r.stdout == "first\ngot hello\n" and "".join(got) == r.stdout
        h2 = await sb.commands.run("sleep 600", background=True)
        await until(lambda: _has_pid(sb, h2.pid), "the process list")
        assert await h2.kill()
        with pytest.raises(forkd.CommandExitError) as ei:
            await h2.wait()
        assert ei.value.exit_code == 137

    arun(test_tag, body)


async def _true(v: bool) -> bool:
    return v


async def _has_pid(sb: AsyncSandbox, pid: Any, present: bool = True) -> bool:
    return (pid in [p.pid for p in await sb.commands.list()]) == present


def test_cancelling_a_command_kills_it(test_tag: str) -> None:
    async def body(sb: AsyncSandbox) -> None:
        started: List[str] = []
        task = asyncio.ensure_future(sb.commands.run("echo up; sleep 600", on_stdout=started.append))
        await until(lambda: _true(bool(started)), "the command to start")
        procs = await sb.commands.list()
        assert len(procs) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: _has_pid(sb, procs[0].pid, present=False), "the cancelled command to be killed")

    arun(test_tag, body)


def test_concurrent_commands_gather(test_tag: str) -> None:
    async def body(sb: AsyncSandbox) -> None:
        rs = await asyncio.gather(*(sb.commands.run("echo %d" % i) for i in range(16)))
        assert [r.stdout for r in rs] == ["%d\n" % i for i in range(16)]

    arun(test_tag, body)


def test_files(test_tag: str) -> None:
    async def body(sb: AsyncSandbox) -> None:
        assert await sb.files.make_dir("/tmp/a/b")
        assert not await sb.files.make_dir("/tmp/a/b")
        info = await sb.files.write("/tmp/a/b/t.txt", "héllo", mode=0o600)
        assert info.size == len("héllo".encode())
        assert await sb.files.read("/tmp/a/b/t.txt") == "héllo"
        data = secrets.token_bytes(1 << 20)
        await sb.files.write("/tmp/a/big", [data[:1000], data[1000:]])
        assert await sb.files.read("/tmp/a/big", "bytes") == data
        async with await sb.files.read("/tmp/a/big", "stream") as st:
            first = await st.read(10)
            rest = b"".join([c async for c in st])
        assert first + rest == data
        names = sorted(f.name for f in await sb.files.list("/tmp/a"))
        assert names == ["b", "big"]
        assert await sb.files.exists("/tmp/a/big")
        await sb.files.remove("/tmp/a")
        assert not await sb.files.exists("/tmp/a")
        with pytest.raises(forkd.NotFound):
            await sb.files.read("/tmp/a/big")

    arun(test_tag, body)


def test_run_code_and_branch(py_tag: str) -> None:
    async def body(sb: AsyncSandbox) -> None:
        ex = await sb.run_code("x = 20\nx + 1")
        assert ex.text == "21"
        out: List[str] = []

        async def on_out(s: str) -> None:
            out.append(s)

        ex = await sb.run_code("print('a'); print('b'); x * 2", on_stdout=on_out)
        assert "".join(out) == "a\nb\n" and ex.text == "40"
        with pytest.raises(forkd.Timeout):
            await sb.run_code("import time; time.sleep(60)", timeout=1)
        assert (await sb.run_code("x")).text == "20"  # the session survived
        b = await sb.branch(wait=False)
        try:
            snap = await b.wait(timeout=300)
            assert snap.state == "ready"
            async with await AsyncSandbox.create(b.tag, client=sb.client) as child:
                assert (await child.run_code("x")).text == "20"
        finally:
            await sb.client.snapshots.delete(b.tag, cascade=True)

    arun(py_tag, body, timeout=1800)


def test_fork_many_with_gather(test_tag: str) -> None:
    async def main() -> None:
        async with AsyncClient() as c:
            sbs = await AsyncSandbox.fork(test_tag, 4, client=c)
            try:
                rs = await asyncio.gather(*(s.commands.run("echo %s" % s.id) for s in sbs))
                assert [r.stdout.strip() for r in rs] == [s.id for s in sbs]
            finally:
                killed = await c.sandboxes.kill(s.id for s in sbs)
            assert sorted(killed) == sorted(s.id for s in sbs)

    asyncio.run(asyncio.wait_for(main(), DEADLINE))


# -- pty: needs a daemon whose /v1/info lists the "pty" feature -------------


@pytest.fixture(scope="module")
def pty_tag(test_tag: str) -> str:
    feats = forkd.Client().info().get("features") or []
    if "pty" not in feats:
        pytest.skip("the daemon does not offer the pty feature (its /v1/info features: %s)" % ", ".join(feats))
    return test_tag


def test_pty_async(pty_tag: str) -> None:
    async def body(sb: AsyncSandbox) -> None:
        seen = bytearray()
        h = await sb.pty.create(PtySize(rows=24, cols=80), on_data=seen.extend, timeout=120, envs={"PS1": "$ "})
        assert h.pid
        await sb.pty.send_stdin(h.pid, b"stty size; tty; echo $TERM\n")
        await until(lambda: _true(b"xterm-256color" in seen and b"24 80" in seen), "stty size from the terminal")
        assert b"/dev/pts/" in seen
        await sb.pty.resize(h.pid, PtySize(rows=40, cols=120))
        await sb.pty.send_stdin(h.pid, b"stty size\n")
        await until(lambda: _true(b"40 120" in seen), "the new size")
        await sb.pty.send_stdin(h.pid, b"sleep 600\n")
        # ^C must reach sleep, not the shell still starting it: wait until
        # it runs (a typed ^C that came first would be the shell's, and
        # the next line would wait 600 s behind sleep).
        async def sleeping() -> bool:
            r = await sb.commands.run("pidof sleep", timeout=30, check=False)
            return r.exit_code == 0

        await until(sleeping, "sleep 600 to run")
        await sb.pty.send_stdin(h.pid, b"\x03echo after-$((40+2))\n")  # ^C stops the job, the shell lives
        # after-42 is the shell's output, not the terminal's echo of the line.
        await until(lambda: _true(b"after-42\r\n" in seen), "the shell after ^C")
        await sb.pty.send_stdin(h.pid, b"exit 0\n")
        r = await h.wait()
        assert r.exit_code == 0 and r.stderr == ""

    arun(pty_tag, body)


def test_pty_sync_kill_and_errors(pty_tag: str, client: forkd.Client) -> None:
    import time

    with forkd.Sandbox.create(pty_tag, client=client) as sb:
        h = sb.pty.create(PtySize(rows=10, cols=20), cmd="cat")
        assert h.pid
        sb.pty.send_stdin(h.pid, b"ping\n")
        end = time.monotonic() + 60
        while "ping\r\nping\r\n" not in h.stdout:  # the echo, then cat's copy
            assert time.monotonic() < end, h.stdout
            time.sleep(0.05)
        assert sb.pty.kill(h.pid)
        with pytest.raises(forkd.CommandExitError):
            h.wait(60)
        assert not sb.pty.kill(h.pid)
        plain = sb.commands.run("sleep 600", background=True)
        with pytest.raises(forkd.Conflict, match="no terminal"):
            sb.pty.resize(plain.pid, PtySize(rows=5, cols=5))  # type: ignore[arg-type]
        plain.kill()
