"""sandbox.commands against a real daemon."""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from typing import List

import pytest

import forkd
from forkd import Sandbox


def test_shell_and_argv(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("echo out; echo err >&2")
    assert (r.stdout, r.stderr, r.exit_code, r.ok) == ("out\n", "err\n", 0, True)
    assert r.duration_ms > 0 and r.signal is None and not r.timed_out
    # argv never goes through a shell: no expansion, no word splitting.
    r = sandbox.commands.run(["echo", "$HOME", "a  b", ";", "*"])
    assert r.stdout == "$HOME a  b ; *\n"


def test_envs_and_cwd(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("echo $FOO-$BAR; pwd", envs={"FOO": "x y", "BAR": "é"}, cwd="/tmp")
    assert r.stdout == "x y-é\n/tmp\n"


def test_non_zero_exit_raises_by_default(sandbox: Sandbox) -> None:
    with pytest.raises(forkd.CommandExitError) as ei:
        sandbox.commands.run("echo partial; echo boom >&2; exit 3")
    e = ei.value
    assert (e.exit_code, e.stdout, e.stderr) == (3, "partial\n", "boom\n")
    assert "boom" in str(e) and e.result.exit_code == 3
    assert forkd.CommandExitException is forkd.CommandExitError
    r = sandbox.commands.run("exit 4", check=False)
    assert r.exit_code == 4 and not r.ok


def test_missing_executable_and_cwd(sandbox: Sandbox) -> None:
    with pytest.raises(forkd.NotFound) as ei:
        sandbox.commands.run(["/no/such/binary"])
    assert "/no/such/binary" in str(ei.value)
    with pytest.raises(forkd.ForkdError):
        sandbox.commands.run("true", cwd="/no/such/dir")


def test_empty_command_refused(sandbox: Sandbox) -> None:
    with pytest.raises(forkd.InvalidArgument):
        sandbox.commands.run("  ")
    with pytest.raises(forkd.InvalidArgument):
        sandbox.commands.run([])


def test_timeout(sandbox: Sandbox) -> None:
    t0 = time.monotonic()
    # Seconds: "started" is out before the timeout on a loaded host too.
    with pytest.raises(forkd.Timeout) as ei:
        sandbox.commands.run("echo started; sleep 120", timeout=3)
    assert time.monotonic() - t0 < 60
    res = ei.value.result
    assert res is not None and res.timed_out and res.stdout == "started\n" and res.signal == "SIGKILL"
    assert isinstance(ei.value, TimeoutError)
    r = sandbox.commands.run("sleep 30", timeout=0.3, check=False)
    assert r.timed_out and r.exit_code == 137
    # The sandbox is fine afterwards.
    assert sandbox.commands.run("echo ok").stdout == "ok\n"


def test_stdin_forms(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("cat", stdin="héllo").stdout == "héllo"
    assert sandbox.commands.run("wc -c", stdin=b"").stdout.strip() == "0"
    assert sandbox.commands.run(["sh", "-c", "tr a-z A-Z"], stdin=(b"ab%d" % i for i in range(3))).stdout == "AB0AB1AB2"
    assert sandbox.commands.run("cat", stdin=io.BytesIO(b"from a file")).stdout == "from a file"
    # Without stdin the process reads /dev/null.
    assert sandbox.commands.run("cat").stdout == ""


def test_stdin_big_full_duplex(sandbox: Sandbox) -> None:
    # cat echoes as it reads: 8 MB through stdin and back only works when
    # stdin is sent while the output is read.
    data = os.urandom(8 << 20)
    r = sandbox.commands.run("cat", stdin=data)
    assert r.stdout_bytes == data
    r = sandbox.commands.run("sha256sum", stdin=data)
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()


def _gate() -> str:
    return "/tmp/gate-" + os.urandom(4).hex()


def _wait_for(gate: str) -> str:
    """Shell that waits (a minute at most) until gate exists."""
    return "i=0; while [ ! -e %s ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done" % gate


def test_streaming_callbacks_as_output_arrives(sandbox: Sandbox) -> None:
    seen: List[tuple] = []
    got_one = threading.Event()
    gate = _gate()

    def on_stdout(s: str) -> None:
        seen.append(("out", s))
        if "one" in s:
            got_one.set()

    # The command goes on past "one" only once "one" reached the callback
    # (a thread opens the gate): it was streamed, however slow the host.
    def release() -> None:
        if got_one.wait(60):
            sandbox.commands.run(["touch", gate])

    opener = threading.Thread(target=release, daemon=True)
    opener.start()
    r = sandbox.commands.run(
        "echo one; %s; [ -e %s ] || echo 'one was not streamed' >&2; echo two >&2; echo three" % (_wait_for(gate), gate),
        on_stdout=on_stdout,
        on_stderr=lambda s: seen.append(("err", s)),
    )
    opener.join()
    assert r.stdout == "one\nthree\n" and r.stderr == "two\n"
    assert "".join(s for k, s in seen if k == "out") == "one\nthree\n"
    assert "".join(s for k, s in seen if k == "err") == "two\n"
    assert seen[0] == ("out", "one\n")


def test_callback_never_splits_utf8(sandbox: Sandbox) -> None:
    chunks: List[str] = []
    # printf writes the two bytes of "é" in separate writes.
    r = sandbox.commands.run(r"printf '\303'; sleep 0.3; printf '\251\n'", on_stdout=chunks.append)
    assert "".join(chunks) == "é\n" == r.stdout


def test_binary_and_big_output(sandbox: Sandbox) -> None:
    r = sandbox.commands.run(r"printf '\377\376ok'")
    assert r.stdout_bytes == b"\xff\xfeok" and r.stdout.endswith("ok")
    r = sandbox.commands.run("head -c 5000000 /dev/zero")
    assert len(r.stdout_bytes) == 5000000


def test_background_wait_and_output_so_far(sandbox: Sandbox) -> None:
    got: List[str] = []
    # The command runs on until the test opens the gate, however slow the host.
    gate = _gate()
    h = sandbox.commands.run("echo first; %s; echo second" % _wait_for(gate), background=True, on_stdout=got.append)
    assert isinstance(h, forkd.CommandHandle)
    deadline = time.monotonic() + 60
    while "first" not in h.stdout and time.monotonic() < deadline:
        time.sleep(0.02)
    assert h.stdout == "first\n" and h.is_running() and h.exit_code is None
    with pytest.raises(forkd.Timeout):
        h.wait(timeout=0.05)  # still running
    sandbox.commands.run(["touch", gate])
    r = h.wait()
    assert r.stdout == "first\nsecond\n" and r.exit_code == 0 and h.exit_code == 0 and h.done
    assert "".join(got) == r.stdout
    assert h.kill() is False  # already ended


def test_background_kill(sandbox: Sandbox) -> None:
    h = sandbox.commands.run("echo up; sleep 60", background=True)
    deadline = time.monotonic() + 60
    while "up" not in h.stdout and time.monotonic() < deadline:
        time.sleep(0.02)
    t0 = time.monotonic()
    assert h.kill() is True
    with pytest.raises(forkd.CommandExitError) as ei:
        h.wait()
    assert time.monotonic() - t0 < 30  # not the minute of sleep 60
    assert ei.value.exit_code == 137 and ei.value.stdout == "up\n"
    # The agent killed the process group: no sleep 60 left behind.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ps = sandbox.commands.run("ps -o args 2>/dev/null || ps").stdout
        if "sleep 60" not in ps:
            break
        time.sleep(0.1)
    assert "sleep 60" not in ps


def test_background_errors_surface_on_wait(sandbox: Sandbox) -> None:
    h = sandbox.commands.run("exit 7", background=True)
    with pytest.raises(forkd.CommandExitError):
        h.wait()
    assert sandbox.commands.run("exit 7", background=True, check=False).wait().exit_code == 7


def test_stream_cut_when_sandbox_killed(client: forkd.Client, test_tag: str) -> None:
    sb = Sandbox.create(test_tag, client=client)
    try:
        # Killed once output arrived, so that there is some before the cut.
        ticked = threading.Event()

        def kill_after_tick() -> None:
            ticked.wait(60)
            sb.kill()

        killer = threading.Thread(target=kill_after_tick, daemon=True)
        killer.start()
        t0 = time.monotonic()
        with pytest.raises(forkd.StreamInterrupted) as ei:
            sb.commands.run("while true; do echo tick; sleep 0.2; done", on_stdout=lambda s: ticked.set())
        assert time.monotonic() - t0 < 120
        partial = ei.value.partial
        assert partial is not None and "tick" in partial.stdout  # what came before the cut
        assert sb.id in str(ei.value)
        killer.join()
    finally:
        sb.kill()


def test_stream_cut_background(client: forkd.Client, test_tag: str) -> None:
    sb = Sandbox.create(test_tag, client=client)
    try:
        # run returns once the command started (its pid came with the 200).
        h = sb.commands.run("sleep 60", background=True)
        sb.kill()
        with pytest.raises(forkd.StreamInterrupted):
            h.wait(timeout=60)
    finally:
        sb.kill()


def test_callback_exception_propagates_and_stops_command(sandbox: Sandbox) -> None:
    class Stop(Exception):
        pass

    def cb(s: str) -> None:
        raise Stop(s)

    with pytest.raises(Stop):
        sandbox.commands.run("echo x; sleep 60", on_stdout=cb, timeout=120)
    assert sandbox.commands.run("echo still-ok").stdout == "still-ok\n"


def test_concurrent_commands_from_threads(client: forkd.Client, test_tag: str) -> None:
    sbs = Sandbox.fork(test_tag, 2, client=client)
    try:
        errors: List[BaseException] = []
        results: List[str] = []
        lock = threading.Lock()

        def work(i: int) -> None:
            sb = sbs[i % 2]
            try:
                for j in range(5):
                    r = sb.commands.run(["sh", "-c", "echo $0-$1", str(i), str(j)])
                    with lock:
                        results.append(r.stdout.strip())
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert errors == []
        assert sorted(results) == sorted("%d-%d" % (i, j) for i in range(8) for j in range(5))
        # Each sandbox saw its own commands.
        assert sbs[0].files.exists("/tmp") and sbs[1].files.exists("/tmp")
    finally:
        for sb in sbs:
            sb.kill()


def test_background_stdin_send_and_close(sandbox: Sandbox) -> None:
    got: List[str] = []
    h = sandbox.commands.run("cat", background=True, stdin=True, on_stdout=got.append)
    assert isinstance(h.pid, int) and h.pid > 0
    h.send_stdin("one\n")
    deadline = time.monotonic() + 60
    while "one" not in h.stdout and time.monotonic() < deadline:
        time.sleep(0.02)
    assert h.stdout == "one\n" and h.is_running()  # output while stdin is still open
    h.send_stdin(b"two\n")
    h.close_stdin()
    h.close_stdin()  # closing twice is fine
    r = h.wait()
    assert r.stdout == "one\ntwo\n" and r.exit_code == 0 and r.pid == h.pid
    assert "".join(got) == r.stdout
    with pytest.raises(forkd.NotFound):
        h.send_stdin("late")  # the process has exited


def test_commands_list_and_kill_by_pid(sandbox: Sandbox) -> None:
    h = sandbox.commands.run("sleep 60", background=True, stdin=True)
    other = sandbox.commands.run(["sleep", "61"], background=True)
    procs = {p.pid: p for p in sandbox.commands.list()}
    assert h.pid in procs and other.pid in procs
    p = procs[h.pid]
    assert p.cmd == "sleep 60" and p.argv == ["/bin/sh", "-c", "sleep 60"] and p.stdin_open
    assert procs[other.pid].argv == ["sleep", "61"] and not procs[other.pid].stdin_open
    assert p.started is not None
    # stdin was not kept open for the argv command.
    with pytest.raises(forkd.Conflict):
        sandbox.commands.send_stdin(other.pid, "x")
    assert sandbox.commands.kill(other.pid, "SIGTERM") is True
    with pytest.raises(forkd.CommandExitError) as ei:
        other.wait(timeout=60)
    assert ei.value.exit_code == 143 and ei.value.result.signal == "SIGTERM"
    assert h.kill() is True
    with pytest.raises(forkd.CommandExitError) as ei:
        h.wait(timeout=60)
    assert ei.value.exit_code == 137
    assert sandbox.commands.kill(h.pid) is False  # gone
    assert all(q.pid not in (h.pid, other.pid) for q in sandbox.commands.list())


def test_send_stdin_to_unknown_pid(sandbox: Sandbox) -> None:
    with pytest.raises(forkd.NotFound):
        sandbox.commands.send_stdin(999999, "x")
    with pytest.raises(forkd.InvalidArgument):
        sandbox.commands.close_stdin(-1)
