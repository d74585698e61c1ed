// sb.files against the real daemon.
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { Readable } from "node:stream";
import { ConflictError, InvalidArgumentError, NotFoundError, StreamCutError } from "forkd";
import { TAG, needsDaemon, Tracker } from "./helpers/env.mjs";

describe("files", needsDaemon, () => {
  const t = new Tracker();
  let sb;
  before(async () => {
    sb = await t.create(TAG);
  });
  after(() => t.cleanup());

  test("write and read text (UTF-8)", async () => {
    const info = await sb.files.write("/tmp/hello.txt", "héllo wörld ✓\n");
    assert.equal(info.path, "/tmp/hello.txt");
    assert.equal(info.name, "hello.txt");
    assert.equal(info.size, Buffer.byteLength("héllo wörld ✓\n"));
    assert.equal(info.isDir, false);
    assert.equal(info.type, "file");
    assert.ok(info.modTime instanceof Date && !Number.isNaN(info.modTime.getTime()));
    assert.equal(await sb.files.read("/tmp/hello.txt"), "héllo wörld ✓\n");
    // The file is there for processes too.
    assert.equal((await sb.commands.run("cat /tmp/hello.txt")).stdout, "héllo wörld ✓\n");
  });

  test("write and read bytes; mode; empty files", async () => {
    const data = randomBytes(4096);
    const info = await sb.files.write("/tmp/bin.dat", data, { mode: 0o600 });
    assert.equal(info.mode, 0o600);
    const back = await sb.files.read("/tmp/bin.dat", { format: "bytes" });
    assert.ok(back instanceof Uint8Array);
    assert.deepEqual(Buffer.from(back), data);
    await sb.files.write("/tmp/empty", new Uint8Array(0));
    assert.equal(await sb.files.read("/tmp/empty"), "");
    await sb.files.write("/tmp/ab.dat", new Uint8Array([1, 2, 3]).buffer);
    assert.deepEqual([...(await sb.files.read("/tmp/ab.dat", { format: "bytes" }))], [1, 2, 3]);
  });

  test("write creates missing parent directories (bytes and streams)", async () => {
    await sb.files.write("/tmp/deep/er/file.txt", "x");
    assert.equal(await sb.files.read("/tmp/deep/er/file.txt"), "x");
    await sb.files.write("/tmp/deeper/still/file.txt", Readable.from([Buffer.from("y")]));
    assert.equal(await sb.files.read("/tmp/deeper/still/file.txt"), "y");
  });

  test("write several files at once", async () => {
    const infos = await sb.files.write([
      { path: "/tmp/multi/a", data: "A" },
      { path: "/tmp/multi/b", data: new Uint8Array([66]) },
    ]);
    assert.deepEqual(infos.map((i) => i.name), ["a", "b"]);
    assert.equal(await sb.files.read("/tmp/multi/b"), "B");
  });

  test("20 MB streamed round trip, never buffered whole", async () => {
    const size = 20 * 1024 * 1024;
    const chunk = 256 * 1024;
    const up = createHash("sha256");
    let produced = 0;
    async function* source() {
      for (let off = 0; off < size; off += chunk) {
        const b = randomBytes(chunk);
        up.update(b);
        produced += b.length;
        yield b;
      }
    }
    const info = await sb.files.write("/tmp/big.bin", source());
    assert.equal(produced, size);
    assert.equal(info.size, size);
    const stream = await sb.files.read("/tmp/big.bin", { format: "stream" });
    assert.ok(stream instanceof Readable);
    const down = createHash("sha256");
    let got = 0;
    let maxChunk = 0;
    for await (const c of stream) {
      down.update(c);
      got += c.length;
      maxChunk = Math.max(maxChunk, c.length);
    }
    assert.equal(got, size);
    const digest = down.digest("hex");
    assert.equal(digest, up.digest("hex"));
    assert.ok(maxChunk < size / 4, `a chunk of ${maxChunk} bytes: the file was buffered`);
    // The guest agrees on the content.
    const r = await sb.commands.run("sha256sum /tmp/big.bin");
    assert.equal(r.stdout.split(" ")[0], digest);
    await sb.files.remove("/tmp/big.bin");
  });

  test("list, exists, getInfo", async () => {
    await sb.files.makeDir("/tmp/ls/sub");
    await sb.files.write("/tmp/ls/f1", "1");
    const entries = await sb.files.list("/tmp/ls");
    assert.deepEqual(entries.map((e) => [e.name, e.type]).sort(), [["f1", "file"], ["sub", "dir"]]);
    assert.equal(entries.find((e) => e.name === "sub").isDir, true);
    assert.deepEqual(await sb.files.list("/tmp/ls/sub"), []);
    assert.equal(await sb.files.exists("/tmp/ls/f1"), true);
    assert.equal(await sb.files.exists("/tmp/ls/nope"), false);
    const info = await sb.files.getInfo("/tmp/ls");
    assert.equal(info.isDir, true);
  });

  test("makeDir: true when created, false when it existed, ConflictError on a file", async () => {
    assert.equal(await sb.files.makeDir("/tmp/md/a/b"), true);
    assert.equal(await sb.files.makeDir("/tmp/md/a/b"), false);
    assert.equal(await sb.files.makeDir("/tmp/md/c"), true);
    await sb.files.write("/tmp/md/file", "x");
    await assert.rejects(sb.files.makeDir("/tmp/md/file"), ConflictError);
  });

  test("remove: files, directories (recursive by default), missing paths", async () => {
    await sb.files.write("/tmp/rm/a/b", "x");
    await assert.rejects(sb.files.remove("/tmp/rm", { recursive: false }), (err) => err instanceof ConflictError && /not empty/.test(err.message));
    await sb.files.remove("/tmp/rm/a/b");
    assert.equal(await sb.files.exists("/tmp/rm/a/b"), false);
    await sb.files.write("/tmp/rm/a/c", "x");
    await sb.files.remove("/tmp/rm");
    assert.equal(await sb.files.exists("/tmp/rm"), false);
    await assert.rejects(sb.files.remove("/tmp/rm"), NotFoundError);
  });

  test("typed errors carry the daemon's message and request id", async () => {
    await assert.rejects(sb.files.read("/no/such/file"), (err) => {
      assert.ok(err instanceof NotFoundError);
      assert.equal(err.status, 404);
      assert.equal(err.code, "not_found");
      assert.match(err.message, /\/no\/such\/file/);
      assert.match(err.requestId, /^[0-9a-f]+$/);
      return true;
    });
    await assert.rejects(sb.files.read("relative/path"), (err) => {
      assert.ok(err instanceof InvalidArgumentError);
      assert.equal(err.status, 400);
      assert.match(err.message, /relative/); // the server's own words
      return true;
    });
    await assert.rejects(sb.files.write("/tmp", "x"), (err) => err instanceof InvalidArgumentError && /is a directory/.test(err.message));
    await assert.rejects(sb.files.read("/tmp"), InvalidArgumentError);
    await assert.rejects(sb.files.list("/no/such/dir"), NotFoundError);
  });

  test("a read stream closed early does not break later calls", async () => {
    await sb.files.write("/tmp/early.bin", new Uint8Array(2 * 1024 * 1024));
    const s = await sb.files.read("/tmp/early.bin", { format: "stream" });
    for await (const c of s) {
      assert.ok(c.length > 0);
      break;
    }
    assert.equal(await sb.files.read("/tmp/hello.txt"), "héllo wörld ✓\n");
  });

  test("a file read cut by the sandbox's death rejects", async () => {
    const victim = await t.create(TAG);
    await victim.commands.run("head -c 30000000 /dev/urandom > /tmp/huge");
    const s = await victim.files.read("/tmp/huge", { format: "stream" });
    let got = 0;
    let killed = false;
    await assert.rejects(
      (async () => {
        for await (const c of s) {
          got += c.length;
          if (!killed) {
            killed = true;
            await victim.kill();
          }
        }
      })(),
      (err) => {
        assert.ok(err instanceof StreamCutError, `${err?.name}: ${err?.message}`);
        return true;
      },
    );
    assert.ok(got < 30_000_000, "the whole file arrived despite the kill");
  });
});
