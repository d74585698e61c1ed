"""Branch, snapshot chains, create, delete, pack and unpack against a real daemon."""

from __future__ import annotations

import io
import os
from typing import Callable, List

import pytest

import forkd
from forkd import Client, Sandbox


def test_branch_then_fork_sees_state(client: Client, py_tag: str, new_tag: Callable[[], str]) -> None:
    src = Sandbox.create(py_tag, client=client)
    try:
        src.run_code("x = 41")
        src.files.write("/tmp/state.txt", "from source")
        tag = new_tag()
        b = src.branch(tag)
        assert isinstance(b, forkd.Branch)
        assert b.tag == tag and b.snapshot.tag == tag and b.ready and b.state == "ready"
        assert b.pause_ms >= 0 and b.bytes_written > 0 and b.total_ms > 0
        assert b.wait() is b.snapshot  # already ready: no request
        assert client.snapshots.get(tag).state == "ready"
        # The source goes on, and changes after the branch stay its own.
        src.run_code("x = 0")
        src.files.write("/tmp/state.txt", "changed after the branch")
        with Sandbox.create(tag, client=client) as child:
            assert child.tag == tag
            assert child.run_code("x + 1").text == "42"
            assert child.files.read("/tmp/state.txt") == "from source"
            child.files.write("/tmp/state.txt", "child")
        assert src.files.read("/tmp/state.txt") == "changed after the branch"
        assert src.run_code("x").text == "0"
    finally:
        src.kill()


def test_branch_chain_fields(client: Client, test_tag: str, new_tag: Callable[[], str]) -> None:
    # Contract: a diff branch is a layer whose parent is the source's snapshot.
    with Sandbox.create(test_tag, client=client) as sb:
        tag = new_tag()
        b = sb.branch(tag, mode="diff")
    s = client.snapshots.get(tag)
    assert s.parent is not None and s.parent.tag == test_tag and s.parent.digest
    assert s.depth >= 1 and s.ancestors and s.ancestors[0] == test_tag
    assert tag in client.snapshots.get(test_tag).dependents
    assert b.snapshot.depth == s.depth


def test_branch_full_mode_is_flat(client: Client, test_tag: str, new_tag: Callable[[], str]) -> None:
    with Sandbox.create(test_tag, client=client) as sb:
        sb.files.write("/tmp/m", "full")
        tag = new_tag()
        b = sb.branch(tag, mode="full")
        assert b.ready
    with Sandbox.create(tag, client=client) as child:
        assert child.files.read("/tmp/m") == "full"
    assert client.snapshots.get(tag).depth == 0


def test_branch_generated_tag_and_conflict(client: Client, test_tag: str) -> None:
    with Sandbox.create(test_tag, client=client) as sb:
        b = sb.branch()
        try:
            assert b.tag.startswith(test_tag.lower() + "-br-") and b.ready
            with pytest.raises(forkd.Conflict) as ei:
                sb.branch(b.tag)  # the tag is taken
            assert ei.value.status == 409 and ei.value.code == "already_exists"
            with pytest.raises(forkd.InvalidArgument):
                sb.branch(mode="sideways")
            with pytest.raises(forkd.InvalidArgument) as ei2:
                sb.branch("Not A Tag")
            assert ei2.value.status == 400  # the daemon's refusal
        finally:
            client.snapshots.delete(b.tag, cascade=True)


def test_branch_no_wait(client: Client, test_tag: str, new_tag: Callable[[], str]) -> None:
    with Sandbox.create(test_tag, client=client) as sb:
        sb.files.write("/tmp/nw", "no wait")
        tag = new_tag()
        try:
            b = sb.branch(tag, mode="live", wait=False)
        except forkd.Conflict as e:
            if "tmpfs" in (e.detail or ""):
                pytest.skip("live branches need the snapshot's memory on tmpfs/hugetlbfs here: %s" % e.detail)
            raise
        assert b.state in ("writing", "ready")
        # The source runs while the snapshot is written.
        assert sb.commands.run("echo alive").stdout == "alive\n"
        try:
            snap = b.wait(timeout=120)
        except forkd.ForkdError as e:
            # The same precondition, found while writing: the snapshot failed.
            assert e.code == "snapshot_failed"
            assert client.snapshots.get(tag).state == "failed"
            if "tmpfs" in str(e):
                pytest.skip("live branches need the snapshot's memory on tmpfs/hugetlbfs here: %s" % e)
            raise
        assert snap.state == "ready" and b.ready
    with Sandbox.create(tag, client=client) as child:
        assert child.files.read("/tmp/nw") == "no wait"


def test_branch_no_wait_diff(client: Client, test_tag: str, new_tag: Callable[[], str]) -> None:
    with Sandbox.create(test_tag, client=client) as sb:
        tag = new_tag()
        b = sb.branch(tag, wait=False)
        assert b.state in ("writing", "ready")
        assert client.snapshots.wait(tag, timeout=120).state == "ready"
        b.refresh()
        assert b.ready


def test_delete_with_dependents(client: Client, test_tag: str, new_tag: Callable[[], str]) -> None:
    # A <- B: B is a diff layer on A, so deleting A needs cascade or force.
    a, b_ = new_tag(), new_tag()
    with Sandbox.create(test_tag, client=client) as sb:
        sb.branch(a)
    with Sandbox.create(a, client=client) as child:
        child.branch(b_)
        sb_b = client.snapshots.get(b_)
        assert sb_b.ancestors[:2] == [a, test_tag] and sb_b.parent and sb_b.parent.tag == a
        assert b_ in client.snapshots.get(a).dependents
        with pytest.raises(forkd.Conflict) as ei:
            client.snapshots.delete(a)
        assert b_ in ei.value.detail  # names the dependents
        assert client.snapshots.exists(a) and client.snapshots.exists(b_)
        assert client.snapshots.delete(a, cascade=True) == [b_, a]
        assert not client.snapshots.exists(a) and not client.snapshots.exists(b_)
        # Running sandboxes keep working when their snapshot goes.
        assert child.commands.run("echo still").stdout == "still\n"


def test_compact(client: Client, test_tag: str, new_tag: Callable[[], str]) -> None:
    layer, flat = new_tag(), new_tag()
    with Sandbox.create(test_tag, client=client) as sb:
        sb.files.write("/tmp/c", "compacted")
        sb.branch(layer)
    s = client.snapshots.compact(layer, flat)
    assert s.tag == flat and s.depth == 0 and s.parent is None and s.ready
    assert client.snapshots.get(layer).depth >= 1  # left as it was
    with Sandbox.create(flat, client=client) as child:
        assert child.files.read("/tmp/c") == "compacted"
    with pytest.raises(forkd.Conflict):
        client.snapshots.compact(layer, flat)


def test_delete_force(client: Client, test_tag: str, new_tag: Callable[[], str]) -> None:
    a, b_ = new_tag(), new_tag()
    with Sandbox.create(test_tag, client=client) as sb:
        sb.branch(a)
    with Sandbox.create(a, client=client) as child:
        child.branch(b_)
    client.snapshots.delete(a, force=True)
    assert not client.snapshots.exists(a)
    # Only A went; B stays, but cannot be forked without its parent.
    assert client.snapshots.exists(b_)
    with pytest.raises(forkd.ForkdError) as ei:
        Sandbox.create(b_, client=client).kill()
    assert ei.value.status is not None and ei.value.status >= 400


def test_delete_missing(client: Client) -> None:
    with pytest.raises(forkd.NotFound):
        client.snapshots.delete("sdkpy-no-such-tag")


def test_create_snapshot_with_progress(client: Client, new_tag: Callable[[], str]) -> None:
    msgs: List[str] = []
    tag = new_tag()
    s = client.snapshots.create(tag, recipe="minimal", on_progress=msgs.append)
    assert s.tag == tag and s.ready and s.recipe == "minimal"
    assert msgs and any("snapshot" in m or "boot" in m for m in msgs)
    with Sandbox.create(tag, client=client) as sb:
        assert sb.commands.run("echo fresh").stdout == "fresh\n"


def test_pack_and_unpack(client: Client, test_tag: str, new_tag: Callable[[], str], tmp_path: "os.PathLike[str]") -> None:
    src_tag, imported = new_tag(), new_tag()
    with Sandbox.create(test_tag, client=client) as sb:
        sb.files.write("/tmp/packed", "travels")
        sb.branch(src_tag, mode="full")
    path = os.path.join(str(tmp_path), "snap.forkd.tar.zst")
    n = client.snapshots.pack(src_tag, path, include_image=False)
    assert n > 0 and os.path.getsize(path) == n and not os.path.exists(path + ".part")
    buf = io.BytesIO()
    assert client.snapshots.pack(src_tag, buf, include_image=False) > 0  # not byte-for-byte stable
    s = client.snapshots.unpack(path, tag=imported)
    assert s.tag == imported and s.ready
    with pytest.raises(forkd.Conflict):
        client.snapshots.unpack(path, tag=imported)
    buf.seek(0)
    assert client.snapshots.unpack(buf, tag=imported, force=True).tag == imported
    with Sandbox.create(imported, client=client) as sb:
        assert sb.files.read("/tmp/packed") == "travels"
    with pytest.raises(forkd.NotFound):
        client.snapshots.pack("sdkpy-no-such-tag", os.path.join(str(tmp_path), "x"))
    assert not os.path.exists(os.path.join(str(tmp_path), "x"))
    with pytest.raises(forkd.InvalidArgument):
        client.snapshots.unpack(io.BytesIO(b"not an archive"), tag=new_tag())
