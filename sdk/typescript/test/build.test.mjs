// Snapshot create from a build source (an OCI image, a Dockerfile and its
// context): what the SDK sends and what it refuses before sending
// (offline, against a fake daemon on a temporary Unix socket). The build
// itself is tested in Go: internal/api and integration/.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client, InvalidArgumentError } from "forkd";

const dir = mkdtempSync(join(tmpdir(), "forkd-ts-build-"));
after(() => rmSync(dir, { recursive: true, force: true }));

const DOCKERFILE = "FROM python:3.12-slim\nARG V=1\nCOPY app /app\nRUN pip install -r /app/req.txt\n";
const b64 = (s) => Buffer.from(s).toString("base64");

/** A fake daemon: a create answers 202, its operation succeeds at once. */
async function fakeDaemon() {
  const bodies = [];
  const op = { id: "op-b", kind: "snapshot.create", target: "t", state: "running", progress: [] };
  const server = http.createServer((req, res) => {
    let data = "";
    req.on("data", (c) => (data += c));
    req.on("end", () => {
      if (req.method === "POST" && req.url === "/v1/snapshots") {
        bodies.push(JSON.parse(data));
        res.writeHead(202, { "content-type": "application/json", location: "/v1/operations/op-b" });
        return res.end(JSON.stringify(op));
      }
      if (req.url === "/v1/operations/op-b/events") {
        res.writeHead(200, { "content-type": "application/x-ndjson" });
        const done = { ...op, state: "succeeded", progress: ["building"], result: { tag: "t", id: "s-b", state: "ready", files: {} } };
        return res.end(JSON.stringify({ type: "progress", message: "building" }) + "\n" + JSON.stringify({ type: "state", operation: done }) + "\n");
      }
      res.writeHead(404, { "content-type": "application/problem+json" });
      res.end(JSON.stringify({ title: "Not Found", status: 404, detail: "no route", code: "not_found" }));
    });
  });
  const socket = join(dir, `fake-${bodies.length}-${Math.random().toString(16).slice(2)}.sock`);
  await new Promise((r) => server.listen(socket, r));
  const client = new Client({ socket, retries: 0 });
  return {
    client,
    bodies,
    close: async () => {
      client.close();
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    },
  };
}

/** A context directory: two files (modes 0640, 0755) and a symlink, left out. */
function contextDir() {
  const d = mkdtempSync(join(dir, "ctx-"));
  mkdirSync(join(d, "app", "sub"), { recursive: true });
  writeFileSync(join(d, "app", "req.txt"), "requests\n");
  writeFileSync(join(d, "app", "sub", "run.sh"), "#!/bin/sh\n");
  chmodSync(join(d, "app", "req.txt"), 0o640);
  chmodSync(join(d, "app", "sub", "run.sh"), 0o755);
  symlinkSync("/etc/passwd", join(d, "app", "link"));
  return d;
}

describe("snapshot create from a build source (offline)", () => {
  test("a Dockerfile, its context (a record, a directory), build args and the build network go in the body", async () => {
    const d = await fakeDaemon();
    try {
      const msgs = [];
      const snap = await d.client.snapshots.create({
        tag: "t",
        dockerfile: DOCKERFILE,
        name: "app",
        buildArgs: { V: "2" },
        context: { "app/req.txt": new TextEncoder().encode("requests\n"), "./app/main.py": "print('hi')\n" },
        buildNetwork: "public",
        network: "none",
        memoryMib: 512,
        onProgress: (m) => msgs.push(m),
      });
      assert.equal(snap.id, "s-b");
      assert.deepEqual(msgs, ["building"]);
      assert.deepEqual(d.bodies.at(-1), {
        tag: "t",
        dockerfile: DOCKERFILE,
        name: "app",
        build_args: { V: "2" },
        context: [
          { path: "app/main.py", mode: 0o644, data: b64("print('hi')\n") },
          { path: "app/req.txt", mode: 420, data: b64("requests\n") },
        ],
        build_network: { mode: "public" },
        network: { mode: "none" },
        memory_mib: 512,
      });

      const op = await d.client.snapshots.startCreate({ tag: "t", dockerfile: DOCKERFILE, context: contextDir(), buildNetwork: { mode: "allow", allow: ["pypi.org"] } });
      assert.equal(op.id, "op-b");
      assert.deepEqual(d.bodies.at(-1), {
        tag: "t",
        dockerfile: DOCKERFILE,
        context: [
          { path: "app/req.txt", mode: 0o640, data: b64("requests\n") },
          { path: "app/sub/run.sh", mode: 0o755, data: b64("#!/bin/sh\n") },
        ],
        build_network: { mode: "allow", allow: ["pypi.org"] },
      });

      await d.client.snapshots.startCreate({ tag: "t", from: "registry.example.com/python:3.12-slim", insecureRegistry: true });
      assert.deepEqual(d.bodies.at(-1), { tag: "t", from: "registry.example.com/python:3.12-slim", insecure_registry: true });
      await d.client.snapshots.startCreate({ tag: "t", recipeToml: "name = 'x'\n", context: { "f.txt": "" } });
      assert.deepEqual(d.bodies.at(-1), { tag: "t", recipe_toml: "name = 'x'\n", context: [{ path: "f.txt", mode: 420, data: "" }] });
    } finally {
      await d.close();
    }
  });

  test("not exactly one source, misplaced options, bad context paths are refused before any request", async () => {
    const d = await fakeDaemon();
    try {
      const four = /recipe, recipeToml, from and dockerfile/;
      const bad = [
        [{}, four],
        [{ recipe: "minimal", dockerfile: DOCKERFILE }, four],
        [{ from: "python:3.12", recipeToml: "x" }, four],
        [{ dockerfile: "" }, /dockerfile must be a non-empty string/],
        [{ recipe: "minimal", buildArgs: { V: "2" } }, /go with dockerfile/],
        [{ from: "python:3.12", name: "x" }, /go with dockerfile/],
        [{ dockerfile: DOCKERFILE, buildArgs: { V: 2 } }, /buildArgs/],
        [{ from: "python:3.12", context: { a: "" } }, /not with from/],
        [{ dockerfile: DOCKERFILE, context: { "/etc/passwd": "" } }, /relative/],
        [{ dockerfile: DOCKERFILE, context: { "../x": "" } }, /without \.\./],
        [{ dockerfile: DOCKERFILE, context: { "a/../../x": "" } }, /without \.\./],
        [{ dockerfile: DOCKERFILE, context: { "": "" } }, /non-empty/],
        [{ dockerfile: DOCKERFILE, context: { ".": "" } }, /the context itself/],
        [{ dockerfile: DOCKERFILE, context: { a: "", "./a": "" } }, /given twice/],
        [{ dockerfile: DOCKERFILE, context: { a: 1 } }, /string or Uint8Array/],
        [{ dockerfile: DOCKERFILE, context: 7 }, /directory path/],
        [{ dockerfile: DOCKERFILE, context: join(dir, "nonexistent") }, /not a directory/],
        [{ dockerfile: DOCKERFILE, context: { big: new Uint8Array((64 << 20) + 1) } }, /over the daemon's limit of 67108864 bytes/],
        [{ dockerfile: DOCKERFILE, buildNetwork: "internet" }, /network policy "internet"/],
      ];
      for (const [opts, msg] of bad) {
        for (const call of [d.client.snapshots.create, d.client.snapshots.startCreate]) {
          await assert.rejects(call.call(d.client.snapshots, { tag: "t", ...opts }), (err) => {
            assert.ok(err instanceof InvalidArgumentError, `${JSON.stringify(Object.keys(opts))}: ${err}`);
            assert.match(err.message, msg);
            return true;
          });
        }
      }
      assert.equal(d.bodies.length, 0);
    } finally {
      await d.close();
    }
  });
});
