// Sandbox lifecycle and the Client against the real daemon.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import { Client, Sandbox, ConflictError, InvalidArgumentError, NotFoundError, ForkdError, DEFAULT_SANDBOX_TIMEOUT_S } from "forkd";
import { TAG, needsDaemon, Tracker, getClient, uniqueTag } from "./helpers/env.mjs";

describe("sandbox lifecycle", needsDaemon, () => {
  const t = new Tracker();
  after(() => t.cleanup());

  test("create: id, info, metadata, timeout, kill", async () => {
    const label = uniqueTag("run");
    const sb = await t.create(TAG, { metadata: { suite: "ts", run: label }, timeoutS: 300, idleTimeoutS: 120 });
    assert.match(sb.id, /^sb-/);
    assert.equal(sb.sandboxId, sb.id);
    assert.equal(sb.tag, TAG);
    const info = await sb.info();
    assert.equal(info.id, sb.id);
    assert.equal(info.tag, TAG);
    assert.equal(info.state, "running");
    assert.deepEqual(info.metadata, { suite: "ts", run: label });
    assert.ok(info.created instanceof Date);
    assert.ok(info.expiresAt instanceof Date);
    const ttl = info.expiresAt.getTime() - Date.now();
    assert.ok(ttl > 200_000 && ttl <= 301_000, `expires in ${ttl} ms`);
    assert.equal(info.idleTimeoutS, 120);
    assert.equal(typeof info.readyMs, "number");
    assert.equal(await sb.isRunning(), true);

    assert.equal(await sb.kill(), true);
    assert.equal(await sb.kill(), false, "a second kill finds nothing");
    assert.equal(await sb.isRunning(), false);
  });

  test("timeouts: five minutes by default, 0 for none, setTimeout from now", async () => {
    const ttlOf = (info) => (info.expiresAt ? info.expiresAt.getTime() - info.created.getTime() : undefined);
    const defaulted = await Sandbox.create(TAG, { metadata: { "forkd-sdk-test": "ts" } });
    t.sandboxes.add(defaulted);
    assert.equal(DEFAULT_SANDBOX_TIMEOUT_S, 300);
    const ttl = ttlOf(await defaulted.info());
    assert.ok(Math.abs(ttl - 300_000) < 2_000, `default lifetime ${ttl} ms`);
    const before = Date.now();
    const longer = await defaulted.setTimeout(7200, { idleTimeoutS: 600 });
    assert.ok(longer.expiresAt.getTime() >= before + 7_199_000, `expires ${longer.expiresAt.toISOString()}`);
    assert.equal(longer.idleTimeoutS, 600);
    assert.equal((await defaulted.setTimeout(0)).expiresAt, undefined);
    assert.ok((await defaulted.setTimeout(0.2)).expiresAt instanceof Date, "a part of a second is one, not never");
    await assert.rejects(defaulted.setTimeout(-1), InvalidArgumentError);
    await assert.rejects(defaulted.setTimeout(8 * 24 * 3600), (e) => e instanceof InvalidArgumentError && /168h/.test(e.message));

    const none = await t.create(TAG, { timeoutS: 0 });
    assert.equal((await none.info()).expiresAt, undefined);
    const daemonDefault = await t.create(TAG, { timeoutS: null });
    assert.ok(Math.abs(ttlOf(await daemonDefault.info()) - 3_600_000) < 2_000);
    await none.kill();
    await assert.rejects(none.setTimeout(60), NotFoundError);
  });

  test("fork n: distinct sandboxes, each its own machine", async () => {
    const sbs = await t.fork(TAG, 3);
    assert.equal(sbs.length, 3);
    assert.equal(new Set(sbs.map((s) => s.id)).size, 3);
    const hostnames = await Promise.all(sbs.map((s) => s.commands.run("hostname").then((r) => r.stdout.trim())));
    assert.equal(new Set(hostnames).size, 3);
    // Copy-on-write: a file written in one is not in the others.
    await sbs[0].files.write("/tmp/mine", "0");
    assert.equal(await sbs[1].files.exists("/tmp/mine"), false);
    await Promise.all(sbs.map((s) => s.kill()));
  });

  test("connect by id; list with filters; Sandbox.kill(id)", async () => {
    const label = uniqueTag("lst");
    const [a, b] = await t.fork(TAG, 2, { metadata: { lst: label } });
    const again = await Sandbox.connect(a.id);
    assert.equal(again.id, a.id);
    assert.equal((await again.commands.run("echo via connect")).stdout, "via connect\n");

    const listed = await Sandbox.list({ metadata: { lst: label } });
    assert.deepEqual(listed.map((s) => s.id).sort(), [a.id, b.id].sort());
    const byTag = await getClient().sandboxes.list({ tag: TAG, state: "running", metadata: { lst: label } });
    assert.equal(byTag.length, 2);
    assert.deepEqual(await getClient().sandboxes.list({ tag: "no-such-tag", metadata: { lst: label } }), []);

    assert.equal(await Sandbox.kill(b.id), true);
    assert.equal(await Sandbox.kill(b.id), false);
    assert.deepEqual((await Sandbox.list({ metadata: { lst: label } })).map((s) => s.id), [a.id]);
    assert.deepEqual(await getClient().sandboxes.kill([a.id]), [a.id]);
  });

  test("await using kills the sandbox at the end of the scope", async () => {
    // `await using` is TypeScript/ES2026 syntax; call the disposer as it would.
    const sb = await t.create(TAG);
    await sb[Symbol.asyncDispose]();
    assert.equal(await sb.isRunning(), false);
  });

  test("typed errors: 404 unknown tag/sandbox, 400 bad input, 409 no Python", async () => {
    await assert.rejects(Sandbox.create("no-such-tag-xyz"), (err) => {
      assert.ok(err instanceof NotFoundError, `${err.name}: ${err.message}`);
      assert.equal(err.status, 404);
      assert.match(err.message, /no-such-tag-xyz/);
      assert.ok(err.requestId);
      return true;
    });
    await assert.rejects(Sandbox.connect("sb-doesnotexist"), NotFoundError);
    await assert.rejects(getClient().sandboxes.get("sb-doesnotexist"), NotFoundError);
    await assert.rejects(getClient().sandboxes.kill(["sb-doesnotexist"]), NotFoundError);
    await assert.rejects(Sandbox.create("Bad Tag!"), (err) => {
      assert.ok(err instanceof InvalidArgumentError, `${err.name}: ${err.message}`);
      assert.equal(err.status, 400);
      assert.match(err.detail, /tag/i);
      return true;
    });
    await assert.rejects(Sandbox.fork(TAG, 0), InvalidArgumentError);
    const sb = await t.create(TAG);
    await assert.rejects(sb.runCode("1"), (err) => {
      assert.ok(err instanceof ConflictError, `${err.name}: ${err.message}`);
      assert.equal(err.status, 409);
      assert.equal(err.code, "failed_precondition");
      assert.match(err.message, /Python/);
      return true;
    });
    await sb.kill();
  });
});

describe("client", needsDaemon, () => {
  const t = new Tracker();
  after(() => t.cleanup());
  const c = () => getClient();

  test("health, version, doctor, images", async () => {
    assert.deepEqual(await c().health(), { status: "ok" });
    const v = await c().version();
    assert.equal(typeof v.version, "string");
    assert.equal(typeof v.goVersion, "string");
    assert.equal(v.vmm, "qemu");
    const checks = await c().doctor();
    assert.ok(Array.isArray(checks));
    for (const ch of checks) assert.equal(typeof ch.ok, "boolean");
    const images = await c().images.list();
    assert.ok(images.length >= 1);
    assert.ok(images[0].created instanceof Date);
  });

  test("snapshots list and get", async () => {
    const list = await c().snapshots.list();
    const mine = list.find((s) => s.tag === TAG);
    assert.ok(mine, `${TAG} is listed`);
    const s = await c().snapshots.get(TAG);
    assert.equal(s.tag, TAG);
    assert.equal(s.state, "ready");
    assert.equal(typeof s.depth, "number");
    assert.ok(s.sizeBytes > 0);
    assert.ok(s.created instanceof Date);
    assert.ok(Array.isArray(s.ancestors) && Array.isArray(s.dependents));
    await assert.rejects(c().snapshots.get("no-such-tag-xyz"), NotFoundError);
    await assert.rejects(c().snapshots.delete("no-such-tag-xyz"), NotFoundError);
  });

  test("snapshots create (recipe, progress), fork from it, delete", async () => {
    const tag = t.tag("ts-create");
    const progress = [];
    const snap = await c().snapshots.create({ tag, recipe: "minimal", onProgress: (m) => progress.push(m) });
    assert.equal(snap.tag, tag);
    assert.equal(snap.state, "ready");
    assert.ok(progress.length > 0, "no progress reported");
    const sb = await t.create(tag);
    assert.equal((await sb.commands.run("echo from new snapshot")).stdout, "from new snapshot\n");
    await sb.kill();
    await c().snapshots.delete(tag);
    await assert.rejects(c().snapshots.get(tag), NotFoundError);
  });

  test("snapshots create: a taken tag is a ConflictError, a bad recipe a 4xx", async () => {
    await assert.rejects(c().snapshots.create({ tag: TAG, recipe: "minimal" }), (err) => {
      assert.ok(err instanceof ConflictError, `${err.name}: ${err.message}`);
      assert.equal(err.code, "already_exists");
      return true;
    });
    await assert.rejects(c().snapshots.create({ tag: uniqueTag("x"), recipe: "no-such-recipe" }), (err) => {
      assert.ok(err instanceof ForkdError);
      assert.ok(err.status >= 400 && err.status < 500, `status ${err.status}`);
      return true;
    });
  });

  test("a second Client on the same daemon works (explicit socket option)", async () => {
    const other = new Client({ socket: c().where });
    assert.deepEqual(await other.health(), { status: "ok" });
    other.close();
  });
});
