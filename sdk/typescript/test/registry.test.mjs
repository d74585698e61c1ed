// Registry credentials (a fork by reference's pull, a snapshot create's
// pull of the image built from): what the SDK sends and what it refuses
// before sending (offline, against a fake daemon on a temporary Unix
// socket). The pulls themselves are tested in Go: internal/api and
// integration/.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client, Sandbox, InvalidArgumentError } from "forkd";

const dir = mkdtempSync(join(tmpdir(), "forkd-ts-creds-"));
after(() => rmSync(dir, { recursive: true, force: true }));

const REF = "registry.example:5000/team/py:3.12";
const DOCKERFILE = "FROM registry.example:5000/team/py:3.12\nRUN true\n";
const CREDS = { registry_username: "bob", registry_password: "s3cret" };

/** A fake daemon: forks answer 201; a create answers 202, its operation succeeds at once. */
async function fakeDaemon() {
  const forks = [];
  const builds = [];
  const op = { id: "op-c", kind: "snapshot.create", target: "t", state: "running", progress: [] };
  const server = http.createServer((req, res) => {
    let data = "";
    req.on("data", (c) => (data += c));
    req.on("end", () => {
      if (req.method === "POST" && req.url === "/v1/sandboxes") {
        const body = JSON.parse(data);
        forks.push(body);
        const sandboxes = Array.from({ length: body.count }, (_, i) => ({
          id: `sb-c${i + 1}`, tag: "ref--py-3.12-0123456789abcdef01234567", state: "running",
          created: "2026-01-02T03:04:05Z", ready_ms: 1, pooled: false, last_activity: "2026-01-02T03:04:05Z",
        }));
        res.writeHead(201, { "content-type": "application/json" });
        return res.end(JSON.stringify({ sandboxes, total_ms: 2 }));
      }
      if (req.method === "POST" && req.url === "/v1/snapshots") {
        builds.push(JSON.parse(data));
        res.writeHead(202, { "content-type": "application/json", location: "/v1/operations/op-c" });
        return res.end(JSON.stringify(op));
      }
      if (req.url === "/v1/operations/op-c/events") {
        res.writeHead(200, { "content-type": "application/x-ndjson" });
        const done = { ...op, state: "succeeded", result: { tag: "t", id: "s-c", state: "ready", files: {} } };
        return res.end(JSON.stringify({ type: "state", operation: done }) + "\n");
      }
      res.writeHead(404, { "content-type": "application/problem+json" });
      res.end(JSON.stringify({ title: "Not Found", status: 404, detail: "no route", code: "not_found" }));
    });
  });
  const socket = join(dir, `fake-${Math.random().toString(16).slice(2)}.sock`);
  await new Promise((r) => server.listen(socket, r));
  const client = new Client({ socket, retries: 0 });
  return {
    client,
    forks,
    builds,
    close: async () => {
      client.close();
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    },
  };
}

/** Rejects with InvalidArgumentError naming the fix, the password nowhere in it. */
async function refused(p, re) {
  await assert.rejects(p, (err) => {
    assert.ok(err instanceof InvalidArgumentError, String(err));
    assert.match(err.message, re);
    assert.ok(!String(err).includes("s3cret") && !JSON.stringify(err).includes("s3cret") && !err.stack.includes("s3cret"));
    return true;
  });
}

describe("registry credentials (offline)", () => {
  test("a fork by reference sends them only when set; a local tag with them is refused before any request", async () => {
    const d = await fakeDaemon();
    try {
      const sb = await Sandbox.create(REF, { client: d.client, pullPolicy: "always", registryUsername: "bob", registryPassword: "s3cret" });
      assert.equal(sb.sandboxId, "sb-c1");
      assert.deepEqual(d.forks.at(-1), { tag: REF, count: 1, timeout_s: 300, pull_policy: "always", ...CREDS });
      await Sandbox.fork(REF, 2, { client: d.client, registryPassword: "tok" });
      assert.deepEqual(d.forks.at(-1), { tag: REF, count: 2, timeout_s: 300, registry_password: "tok" });
      const digest = `${REF}@sha256:${"0".repeat(64)}`;
      await d.client.sandboxes.fork(digest, 1, { timeoutS: null, registryUsername: "bob", registryPassword: "s3cret" });
      assert.deepEqual(d.forks.at(-1), { tag: digest, count: 1, ...CREDS });
      await d.client.sandboxes.fork(REF, 1, { registryUsername: undefined, registryPassword: "" });
      assert.deepEqual(d.forks.at(-1), { tag: REF, count: 1, timeout_s: 300 }, "unset or empty: not sent");
      const n = d.forks.length;

      const local = /registry reference.*"py" is a local tag: drop them/;
      for (const opts of [{ registryUsername: "bob", registryPassword: "s3cret" }, { registryPassword: "s3cret" }]) {
        await refused(Sandbox.create("py", { client: d.client, ...opts }), local);
        await refused(d.client.sandboxes.fork("py", 2, opts), local);
      }
      await refused(d.client.sandboxes.fork(REF, 1, { registryPassword: new TextEncoder().encode("s3cret") }), /registryPassword must be a string, not object/);
      assert.equal(d.forks.length, n);
    } finally {
      await d.close();
    }
  });

  test("a snapshot create sends them with any build source, only when set", async () => {
    const d = await fakeDaemon();
    try {
      const img = "registry.example.com/team/python:3.12-slim";
      const snap = await d.client.snapshots.create({ tag: "t", from: img, registryUsername: "bob", registryPassword: "s3cret" });
      assert.equal(snap.id, "s-c");
      assert.deepEqual(d.builds.at(-1), { tag: "t", from: img, ...CREDS });
      await d.client.snapshots.startCreate({ tag: "t", dockerfile: DOCKERFILE, registryUsername: "bob", registryPassword: "s3cret" });
      assert.deepEqual(d.builds.at(-1), { tag: "t", dockerfile: DOCKERFILE, ...CREDS });
      await d.client.snapshots.startCreate({ tag: "t", recipeToml: `from = "${img}"\n`, registryPassword: "tok" });
      assert.deepEqual(d.builds.at(-1), { tag: "t", recipe_toml: `from = "${img}"\n`, registry_password: "tok" });
      await d.client.snapshots.startCreate({ tag: "t", recipe: "minimal", registryUsername: "bob" });
      assert.deepEqual(d.builds.at(-1), { tag: "t", recipe: "minimal", registry_username: "bob" });
      await d.client.snapshots.startCreate({ tag: "t", from: img });
      assert.deepEqual(d.builds.at(-1), { tag: "t", from: img });
      const n = d.builds.length;
      await refused(d.client.snapshots.startCreate({ tag: "t", from: img, registryUsername: 7, registryPassword: "s3cret" }), /registryUsername must be a string, not number/);
      assert.equal(d.builds.length, n);
    } finally {
      await d.close();
    }
  });
});
