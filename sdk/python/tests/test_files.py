"""sandbox.files against a real daemon."""

from __future__ import annotations

import hashlib
import io
import os

import pytest

import forkd
from forkd import Sandbox


def test_write_read_text_and_bytes(sandbox: Sandbox) -> None:
    info = sandbox.files.write("/tmp/t.txt", "héllo\n")
    assert info.path == "/tmp/t.txt" and info.name == "t.txt" and info.size == 7 and info.type == "file"
    assert sandbox.files.read("/tmp/t.txt") == "héllo\n"
    assert sandbox.files.read("/tmp/t.txt", format="bytes") == "héllo\n".encode()
    blob = bytes(range(256))
    sandbox.files.write("/tmp/b.bin", blob)
    assert sandbox.files.read("/tmp/b.bin", "bytes") == blob
    with pytest.raises(forkd.InvalidArgument):
        sandbox.files.read("/tmp/b.bin")  # not UTF-8 text
    # The guest sees the same bytes.
    assert sandbox.commands.run("cat /tmp/t.txt").stdout == "héllo\n"


def test_write_mode_and_file_objects(sandbox: Sandbox, tmp_path: "os.PathLike[str]") -> None:
    info = sandbox.files.write("/tmp/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert info.mode & 0o777 == 0o755
    assert sandbox.commands.run(["/tmp/run.sh"]).stdout == "ran\n"
    sandbox.files.write("/tmp/bio", io.BytesIO(b"bytes io"))
    assert sandbox.files.read("/tmp/bio") == "bytes io"
    sandbox.files.write("/tmp/sio", io.StringIO("text io é"))
    assert sandbox.files.read("/tmp/sio") == "text io é"
    local = os.path.join(str(tmp_path), "local.bin")
    with open(local, "wb") as f:
        f.write(b"x" * 100000)
    with open(local, "rb") as f:
        assert sandbox.files.write("/tmp/local", f).size == 100000
    sandbox.files.write("/tmp/gen", (b"%d," % i for i in range(5)))
    assert sandbox.files.read("/tmp/gen") == "0,1,2,3,4,"


def test_big_file_round_trip_streamed(sandbox: Sandbox) -> None:
    size, block = 20 << 20, 1 << 20
    h = hashlib.sha256()

    def produce():  # type: ignore[no-untyped-def]
        # Deterministic, generated on the fly: never held whole in memory.
        for i in range(size // block):
            b = hashlib.sha256(b"%d" % i).digest() * (block // 32)
            h.update(b)
            yield b

    info = sandbox.files.write("/tmp/big.bin", produce())
    assert info.size == size
    want = h.hexdigest()
    assert sandbox.commands.run("sha256sum /tmp/big.bin").stdout.split()[0] == want
    got = hashlib.sha256()
    n = chunks = 0
    with sandbox.files.read("/tmp/big.bin", format="stream") as st:
        for c in st:
            got.update(c)
            n += len(c)
            chunks += 1
            assert len(c) <= 1 << 20
    assert n == size and chunks > 1 and got.hexdigest() == want
    # FileStream also reads like a file.
    st = sandbox.files.read("/tmp/big.bin", format="stream")
    try:
        head = st.read(10)
        assert len(head) == 10
    finally:
        st.close()  # early close: the connection is dropped, not reused
    assert sandbox.commands.run("echo reused").stdout == "reused\n"


def test_list_exists_info_remove(sandbox: Sandbox) -> None:
    assert sandbox.files.make_dir("/tmp/d1/d2") is True
    assert sandbox.files.make_dir("/tmp/d1/d2") is False  # already there
    sandbox.files.write("/tmp/d1/a", "a")
    sandbox.files.write("/tmp/d1/d2/b", "bb")
    entries = {e.name: e for e in sandbox.files.list("/tmp/d1")}
    assert set(entries) == {"a", "d2"}
    assert entries["d2"].is_dir and entries["d2"].type == "dir" and entries["a"].size == 1
    assert entries["a"].mod_time is not None
    assert sandbox.files.get_info("/tmp/d1/d2/b").size == 2
    assert sandbox.files.exists("/tmp/d1/d2/b") and not sandbox.files.exists("/tmp/d1/zz")
    with pytest.raises(forkd.Conflict):
        sandbox.files.remove("/tmp/d1", recursive=False)  # not empty
    sandbox.files.remove("/tmp/d1/a")
    sandbox.files.remove("/tmp/d1")  # recursive by default, like E2B
    assert not sandbox.files.exists("/tmp/d1")
    assert sandbox.files.make_dir("/tmp/empty") is True
    assert sandbox.files.list("/tmp/empty") == []
    sandbox.files.write("/tmp/f", "x")
    with pytest.raises(forkd.Conflict):
        sandbox.files.make_dir("/tmp/f")  # a file is in the way


def test_file_errors(sandbox: Sandbox) -> None:
    with pytest.raises(forkd.NotFound) as ei:
        sandbox.files.read("/tmp/no-such-file")
    assert ei.value.status == 404 and "/tmp/no-such-file" in ei.value.detail
    with pytest.raises(forkd.NotFound):
        sandbox.files.write("/tmp/no/such/dir/f", "x")  # the parent must exist
    with pytest.raises(forkd.NotFound):
        sandbox.files.remove("/tmp/no-such-file")
    with pytest.raises(forkd.InvalidArgument) as ei2:
        sandbox.files.read("relative/path")
    assert "relative/path" in ei2.value.detail  # the daemon's message
    with pytest.raises(forkd.InvalidArgument):
        sandbox.files.read("/tmp")  # a directory
    with pytest.raises(forkd.InvalidArgument):
        sandbox.files.read("/tmp/x", format="json")  # type: ignore[call-overload]


def test_upload_to_missing_sandbox_reports_404(client: forkd.Client) -> None:
    ghost = Sandbox("sb-doesnotexist", client=client)
    # A streamed upload the daemon refuses early still yields its problem.
    with pytest.raises(forkd.NotFound):
        ghost.files.write("/tmp/x", (b"y" * 65536 for _ in range(64)))
    with pytest.raises(forkd.NotFound):
        ghost.files.write("/tmp/x", b"z" * (4 << 20))
