"""Client, sandboxes and snapshots against a real daemon; connection settings."""

from __future__ import annotations

import os
import threading

import pytest

import forkd
from forkd import Client, Sandbox


# -- connection settings (no daemon needed) ------------------------------------


def test_socket_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORKD_HOST", raising=False)
    monkeypatch.setenv("FORKD_SOCKET", "/x/y.sock")
    assert Client().endpoint == "unix:///x/y.sock"
    monkeypatch.delenv("FORKD_SOCKET")
    monkeypatch.setenv("FORKD_RUN_DIR", "/r")
    assert Client().endpoint == "unix:///r/forkd.sock"
    monkeypatch.delenv("FORKD_RUN_DIR")
    assert Client().endpoint == "unix:///run/forkd/forkd.sock"


def test_host_from_env_and_arguments_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKD_HOST", "http://127.0.0.1:7777")
    monkeypatch.setenv("FORKD_SOCKET", "/ignored.sock")
    assert Client().endpoint == "http://127.0.0.1:7777"
    assert Client(socket="/arg.sock").endpoint == "unix:///arg.sock"
    assert Client("unix:///u.sock").endpoint == "unix:///u.sock"
    assert Client("https://h.example:8443").endpoint == "https://h.example:8443"


@pytest.mark.parametrize("bad", ["h.example:8443", "ftp://x", "https://h/path"])
def test_bad_host(bad: str) -> None:
    with pytest.raises(forkd.InvalidArgument):
        Client(bad)
    with pytest.raises(ValueError):  # InvalidArgument is a ValueError too
        Client(bad)


def test_daemon_not_running(monkeypatch: pytest.MonkeyPatch, tmp_path: "os.PathLike[str]") -> None:
    monkeypatch.delenv("FORKD_HOST", raising=False)
    sock = os.path.join(str(tmp_path), "missing.sock")
    monkeypatch.setenv("FORKD_SOCKET", sock)
    with pytest.raises(forkd.Unavailable) as ei:
        Client().health()
    msg = str(ei.value)
    assert sock in msg and "forkd daemon start" in msg and "forkd serve" in msg
    assert isinstance(ei.value, ConnectionError)
    # The same through Sandbox, with no stack of socket errors.
    with pytest.raises(forkd.Unavailable) as ei:
        Sandbox.create("anything")
    assert sock in str(ei.value)
    # One clear error: the socket error is kept as context, not shown as a cause.
    assert ei.value.__suppress_context__ and isinstance(ei.value.__context__, FileNotFoundError)


def test_tcp_not_listening() -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(forkd.Unavailable) as ei:
        Client("http://127.0.0.1:%d" % port).version()
    assert "127.0.0.1:%d" % port in str(ei.value)


# -- daemon ---------------------------------------------------------------------


def test_health_and_version(client: Client) -> None:
    assert client.health() is True
    v = client.version()
    assert v.version and v.vmm and v.go_version.startswith("go")


def test_snapshots_list_get(client: Client, test_tag: str) -> None:
    tags = [s.tag for s in client.snapshots.list()]
    assert test_tag in tags
    s = client.snapshots.get(test_tag)
    assert s.tag == test_tag and s.ready and s.state == "ready"
    assert s.memory_mib > 0 and s.files and s.created is not None
    assert client.snapshots.info(test_tag).id == s.id
    assert client.snapshots.exists(test_tag)
    assert not client.snapshots.exists("sdkpy-no-such-tag")


def test_not_found_carries_problem(client: Client) -> None:
    with pytest.raises(forkd.NotFound) as ei:
        client.snapshots.get("sdkpy-no-such-tag")
    e = ei.value
    assert e.status == 404 and e.code == "not_found" and e.title == "Not Found"
    assert "sdkpy-no-such-tag" in e.detail
    assert e.request_id and e.request_id in str(e)
    assert e.type and e.type.endswith("/not_found")
    assert isinstance(e, LookupError)


def test_invalid_argument_has_server_message(client: Client) -> None:
    with pytest.raises(forkd.InvalidArgument) as ei:
        Sandbox.create("Bad Tag!", client=client)
    assert ei.value.status == 400 and ei.value.code == "invalid_argument"
    assert "Bad Tag!" in ei.value.detail  # the daemon's own words
    with pytest.raises(forkd.InvalidArgument):
        Sandbox.fork("x", 0, client=client)  # refused before sending


def test_create_snapshot_tag_exists(client: Client, test_tag: str) -> None:
    with pytest.raises(forkd.Conflict) as ei:
        client.snapshots.create(test_tag, recipe="minimal")
    assert ei.value.status == 409 and ei.value.code == "already_exists"


def test_create_snapshot_unknown_recipe(client: Client, new_tag) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(forkd.NotFound):
        client.snapshots.create(new_tag(), recipe="sdkpy-no-such-recipe")


def test_sandbox_lifecycle(client: Client, test_tag: str) -> None:
    with Sandbox.create(test_tag, client=client, metadata={"k": "v"}, timeout=600) as sb:
        assert sb.id.startswith("sb-")
        info = sb.info()
        assert info.id == sb.id and info.tag == test_tag and info.state == "running" and info.running
        assert info.metadata == {"k": "v"} and info.expires_at is not None
        assert sb.tag == test_tag and sb.is_running()
        same = Sandbox.connect(sb.id, client=client)
        assert same.id == sb.id and same.commands.run("echo x").stdout == "x\n"
    # The context manager killed it.
    assert not sb.is_running()
    assert sb.kill() is False
    with pytest.raises(forkd.NotFound):
        Sandbox.connect(sb.id, client=client)
    with pytest.raises(forkd.NotFound):
        sb.commands.run("true")


def test_sandbox_timeouts(client: Client, test_tag: str) -> None:
    """The default lifetime is five minutes, as E2B; 0 is none; set_timeout
    counts from now and is refused with its reason when malformed."""
    import datetime as dt

    with Sandbox.create(test_tag, client=client) as sb:
        info = sb.info()
        assert info.expires_at is not None and info.created is not None
        assert abs((info.expires_at - info.created).total_seconds() - forkd.DEFAULT_SANDBOX_TIMEOUT) < 2
        before = dt.datetime.now(dt.timezone.utc)
        got = sb.set_timeout(7200, idle_timeout=600)
        assert got.expires_at is not None and got.expires_at >= before + dt.timedelta(seconds=7199)
        assert got.idle_timeout_s == 600 and sb.info().expires_at == got.expires_at
        assert sb.set_timeout(0).expires_at is None
        assert sb.set_timeout(0.2).expires_at is not None  # a part of a second is one, not "never"
        sb.set_timeout(3600)
        with pytest.raises(forkd.InvalidArgument):
            sb.set_timeout(-1)
        with pytest.raises(forkd.InvalidArgument, match="168h"):
            sb.set_timeout(8 * 24 * 3600)
    with Sandbox.create(test_tag, client=client, timeout=0) as sb:
        assert sb.info().expires_at is None
    with Sandbox.create(test_tag, client=client, timeout=None) as sb:
        info = sb.info()
        assert info.expires_at is not None and info.created is not None
        assert abs((info.expires_at - info.created).total_seconds() - 3600) < 2  # the daemon's default
    with pytest.raises(forkd.NotFound):
        client.sandboxes.set_timeout(sb.id, 60)


def test_fork_and_list_filters(client: Client, test_tag: str) -> None:
    label = {"sdkpy-run": os.urandom(4).hex()}
    sbs = Sandbox.fork(test_tag, 3, client=client, metadata=label)
    try:
        assert len({s.id for s in sbs}) == 3
        listed = client.sandboxes.list(labels=label)
        assert sorted(s.id for s in listed) == sorted(s.id for s in sbs)
        assert {s.id for s in client.sandboxes.list(tag=test_tag, state="running", labels=label)} == {s.id for s in sbs}
        assert client.sandboxes.list(tag="sdkpy-no-such-tag", labels=label) == []
        assert client.sandboxes.list(state="dead", labels=label) == []
        # The class-level list uses the shared client of the environment.
        assert len(Sandbox.list(labels=label)) == 3
        killed = client.sandboxes.kill(sbs[0].id, [sbs[1].id])
        assert sorted(killed) == sorted([sbs[0].id, sbs[1].id])
        assert [s.id for s in client.sandboxes.list(labels=label)] == [sbs[2].id]
    finally:
        for s in sbs:
            s.kill()


def test_sandbox_default_client_from_env(test_tag: str) -> None:
    # No client argument: FORKD_SOCKET / FORKD_HOST from the environment.
    sb = Sandbox.create(test_tag)
    try:
        assert sb.client is Client.shared()
        assert sb.commands.run(["echo", "env"]).stdout == "env\n"
    finally:
        sb.kill()


def test_client_is_thread_safe(client: Client, test_tag: str) -> None:
    errors = []

    def work() -> None:
        try:
            for _ in range(10):
                assert client.health()
                client.snapshots.get(test_tag)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    assert len(client._transport._idle) <= 16
