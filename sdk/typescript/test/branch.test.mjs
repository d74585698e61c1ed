// Branches, snapshot chains, delete cascade/force, compact, pack/unpack.
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { createReadStream, createWriteStream, mkdtempSync, rmSync, statSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ConflictError, InvalidArgumentError, NotFoundError, Sandbox } from "forkd";
import { TAG, needsDaemon, Tracker, getClient, until } from "./helpers/env.mjs";

describe("branch and snapshots", needsDaemon, () => {
  const t = new Tracker();
  const dir = mkdtempSync(join(tmpdir(), "forkd-ts-branch-"));
  let sb;
  let branchTag;
  before(async () => {
    sb = await t.create(TAG);
    await sb.files.write("/root/state.txt", "before the branch");
    // A process that keeps running: a branch captures it too.
    await sb.commands.run("sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/tick; sleep 0.2; done' >/dev/null 2>&1 &", { timeoutMs: 60_000 });
    await until(() => sb.files.exists("/tmp/tick"), "the tick loop to start");
  });
  after(async () => {
    await t.cleanup();
    rmSync(dir, { recursive: true, force: true });
  });
  const c = () => getClient();

  test("branch (diff, wait): ready snapshot, chain fields, pause cost", async () => {
    branchTag = t.tag("ts-br");
    const b = await sb.branch({ tag: branchTag });
    assert.equal(b.tag, branchTag);
    assert.equal(b.snapshot.tag, branchTag);
    assert.equal(b.snapshot.state, "ready");
    assert.equal(typeof b.pauseMs, "number");
    assert.ok(b.bytesWritten > 0);
    assert.ok(b.totalMs >= b.pauseMs);
    const base = await c().snapshots.get(TAG);
    assert.equal(b.snapshot.depth, base.depth + 1);
    assert.equal(b.snapshot.parent.tag, TAG);
    assert.equal(b.snapshot.ancestors[0], TAG);
    assert.ok((await c().snapshots.get(TAG)).dependents.includes(branchTag));
    // The source keeps running and is unchanged.
    assert.equal(await sb.files.read("/root/state.txt"), "before the branch");
  });

  test("fork from the branch: files and running processes are there, apart from the source", async () => {
    await sb.files.write("/root/state.txt", "changed after the branch");
    const [child] = await t.fork(branchTag, 1);
    assert.equal(await child.files.read("/root/state.txt"), "before the branch");
    // The loop started before the branch runs on in the child.
    const t1 = (await child.files.read("/tmp/tick")).trim();
    await until(async () => (await child.files.read("/tmp/tick")).trim() !== t1, "the tick loop to run on in the child");
    await child.kill();
  });

  test("branch with a generated tag", async () => {
    const b = await sb.branch();
    t.tags.add(b.tag);
    assert.ok(b.tag.startsWith(`${TAG}-br-`), b.tag);
    assert.equal(b.snapshot.state, "ready");
  });

  test("branch with wait: false returns at once; waitReady polls to ready", async () => {
    const tag = t.tag("ts-nowait");
    const b = await sb.branch({ tag, wait: false });
    assert.equal(b.tag, tag);
    assert.ok(["writing", "ready"].includes(b.snapshot.state), b.snapshot.state);
    const ready = await b.waitReady({ timeoutMs: 60_000 });
    assert.equal(ready.state, "ready");
    assert.equal(ready.tag, tag);
    const child = await t.create(tag);
    assert.equal(await child.files.read("/root/state.txt"), "changed after the branch");
    await child.kill();
  });

  test("live branch: ready, or refused with a ConflictError saying why", async () => {
    const tag = t.tag("ts-live");
    try {
      const b = await sb.branch({ tag, mode: "live", wait: false });
      assert.equal((await b.waitReady({ timeoutMs: 60_000 })).state, "ready");
    } catch (err) {
      // The snapshot's memory is not on tmpfs/hugetlbfs on this host.
      assert.ok(err instanceof ConflictError, `${err.name}: ${err.message}`);
      assert.match(err.message, /tmpfs|hugetlb/);
      assert.equal(await c().snapshots.exists(tag), false, "a refused branch left a tag");
    }
  });

  test("a taken tag and a bad tag are refused", async () => {
    await assert.rejects(sb.branch({ tag: branchTag }), ConflictError);
    await assert.rejects(sb.branch({ tag: "Not A Tag" }), InvalidArgumentError);
  });

  test("chains: delete refuses a base with dependents, force breaks them, cascade removes them", async () => {
    const base = t.tag("ts-chain");
    await sb.branch({ tag: base });
    const [child] = await t.fork(base, 1);
    const head = t.tag("ts-head");
    const hb = await child.branch({ tag: head });
    assert.deepEqual(hb.snapshot.ancestors.slice(0, 2), [base, TAG]);
    assert.equal(hb.snapshot.depth, (await c().snapshots.get(base)).depth + 1);

    // compact: a flat copy of the head forks without its chain.
    const flat = t.tag("ts-flat");
    const fs = await c().snapshots.compact(head, flat);
    assert.equal(fs.depth, 0);
    assert.equal(fs.parent, undefined);

    await assert.rejects(c().snapshots.delete(base), (err) => {
      assert.ok(err instanceof ConflictError, `${err.name}: ${err.message}`);
      assert.equal(err.status, 409);
      assert.ok(err.message.includes(head), `the message names the dependent: ${err.message}`);
      return true;
    });
    await c().snapshots.delete(base, { force: true });
    assert.equal(await c().snapshots.exists(base), false);
    const broken = await c().snapshots.get(head);
    assert.equal(broken.state, "failed");
    assert.ok(broken.error);
    await assert.rejects(Sandbox.create(head), (err) => err.status >= 400);

    const flatChild = await t.create(flat);
    assert.equal(await flatChild.files.read("/root/state.txt"), "changed after the branch");
    await flatChild.kill();
    await child.kill();

    // cascade
    const base2 = t.tag("ts-casc");
    await sb.branch({ tag: base2 });
    const [child2] = await t.fork(base2, 1);
    const head2 = t.tag("ts-casc-head");
    await child2.branch({ tag: head2 });
    await child2.kill();
    assert.deepEqual(await c().snapshots.delete(base2, { cascade: true }), [head2, base2]);
    assert.equal(await c().snapshots.exists(base2), false);
    assert.equal(await c().snapshots.exists(head2), false);
  });

  test("pack to a file and a stream; unpack from a path and a stream; fork from it", async () => {
    const file = join(dir, "branch.forkd.tar.zst");
    const packed = await c().snapshots.pack(branchTag, file, { image: false });
    assert.equal(packed.tag, branchTag);
    assert.equal(statSync(file).size, packed.bytes);
    assert.ok(packed.bytes > 0);

    const file2 = join(dir, "branch2.forkd.tar.zst");
    const viaStream = await c().snapshots.pack(branchTag, createWriteStream(file2), { image: false });
    assert.ok(viaStream.bytes > 0);

    const tagA = t.tag("ts-unpacked");
    const a = await c().snapshots.unpack(file, { tag: tagA });
    assert.equal(a.tag, tagA);
    assert.equal(a.state, "ready");
    const tagB = t.tag("ts-unpacked-s");
    const b = await c().snapshots.unpack(createReadStream(file2), { tag: tagB });
    assert.equal(b.tag, tagB);
    await assert.rejects(c().snapshots.unpack(file, { tag: tagA }), ConflictError);
    await c().snapshots.unpack(file, { tag: tagA, force: true });

    const child = await t.create(tagA);
    assert.equal(await child.files.read("/root/state.txt"), "before the branch");
    await child.kill();
  });

  test("pack and unpack errors", async () => {
    const missing = join(dir, "missing.forkd.tar.zst");
    await assert.rejects(c().snapshots.pack("no-such-tag-xyz", missing), NotFoundError);
    assert.equal(existsSync(missing), false);
    await assert.rejects(c().snapshots.unpack(Buffer.from("this is not an archive")), (err) => {
      assert.ok(err instanceof InvalidArgumentError, `${err.name}: ${err.message}`);
      return true;
    });
    await assert.rejects(c().snapshots.unpack(join(dir, "nope.tar.zst")), InvalidArgumentError);
  });
});
