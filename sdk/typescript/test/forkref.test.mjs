// Forks by registry reference: what the SDK sends (offline, against a fake
// daemon on a temporary Unix socket). The daemon side (the pull on first
// use, per tenant) is tested in Go: internal/api and integration/.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client, Sandbox, InvalidArgumentError, PULL_POLICIES } from "forkd";

const dir = mkdtempSync(join(tmpdir(), "forkd-ts-ref-"));
after(() => rmSync(dir, { recursive: true, force: true }));

const REF = "registry.example:5000/team/py:3.12";

describe("fork by registry reference (offline)", () => {
  test("the reference and pull_policy go as they are; a bad policy is refused before any request", async () => {
    const bodies = [];
    const server = http.createServer((req, res) => {
      let data = "";
      req.on("data", (c) => (data += c));
      req.on("end", () => {
        const body = JSON.parse(data);
        bodies.push(body);
        const sandboxes = Array.from({ length: body.count }, (_, i) => ({
          id: `sb-ref${i + 1}`, tag: "ref--py-3.12-0123456789abcdef01234567", state: "running",
          created: "2026-01-02T03:04:05Z", ready_ms: 1, pooled: false, last_activity: "2026-01-02T03:04:05Z",
        }));
        res.writeHead(201, { "content-type": "application/json" });
        res.end(JSON.stringify({ sandboxes, total_ms: 2 }));
      });
    });
    const socket = join(dir, "fake.sock");
    await new Promise((r) => server.listen(socket, r));
    const client = new Client({ socket, retries: 0 });
    try {
      assert.deepEqual([...PULL_POLICIES], ["if_not_present", "always"]);
      const sb = await Sandbox.create(REF, { client, pullPolicy: "always" });
      assert.equal(sb.sandboxId, "sb-ref1");
      assert.deepEqual(bodies.at(-1), { tag: REF, count: 1, timeout_s: 300, pull_policy: "always" });
      await client.sandboxes.fork(REF, 2);
      assert.equal("pull_policy" in bodies.at(-1), false, "unset: the daemon's default, if_not_present");
      await assert.rejects(client.sandboxes.fork(REF, 1, { pullPolicy: "never" }), InvalidArgumentError);
      assert.equal(bodies.length, 2);
    } finally {
      client.close();
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    }
  });
});
