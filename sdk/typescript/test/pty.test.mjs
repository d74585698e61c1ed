// sb.pty request shapes against a fake daemon (no forkd needed), and a real
// terminal when the daemon offers the "pty" feature.
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client, Sandbox, CommandExitError, ConflictError, InvalidArgumentError } from "forkd";
import { TAG, Tracker, until } from "./helpers/env.mjs";

const dir = mkdtempSync(join(tmpdir(), "forkd-ts-pty-"));
after(() => rmSync(dir, { recursive: true, force: true }));

const ev = (o) => JSON.stringify(o) + "\n";

describe("pty wire shapes", () => {
  let server;
  let client;
  const requests = [];
  before(async () => {
    const socket = join(dir, "fake.sock");
    server = http.createServer((req, res) => {
      const chunks = [];
      req.on("data", (c) => chunks.push(c));
      req.on("end", () => {
        const body = Buffer.concat(chunks).toString();
        requests.push({ method: req.method, url: req.url, headers: req.headers, body });
        if (req.url === "/v1/sandboxes/sb-1/exec") {
          res.writeHead(200, { "content-type": "application/x-ndjson", "x-forkd-pid": "42" });
          res.write(ev({ type: "start", pid: 42 }));
          res.write(ev({ type: "stdout", data: Buffer.from("$ \u00e9").toString("base64") }));
          res.end(ev({ type: "exit", exit_code: 137, signal: "SIGKILL" }));
          return;
        }
        if (req.url.endsWith("/signal")) {
          res.writeHead(200, { "content-type": "application/json" });
          res.end("{}");
          return;
        }
        res.writeHead(204);
        res.end();
      });
    });
    await new Promise((r) => server.listen(socket, r));
    client = new Client({ socket });
  });
  after(() => new Promise((r) => server.close(r)));

  test("create, sendInput, resize, kill", async () => {
    const box = new Sandbox("sb-1", client);
    const data = [];
    const h = await box.pty.create({ rows: 30, cols: 100, cwd: "/tmp", envs: { A: "1" }, onData: (d) => data.push(Buffer.from(d)) });
    assert.equal(h.pid, 42);
    const req = JSON.parse(requests.find((r) => r.url.endsWith("/exec")).headers["x-forkd-exec"]);
    assert.deepEqual(req.pty, { rows: 30, cols: 100 });
    assert.equal(req.stdin_open, true);
    assert.equal(req.timeout_ms, 60000);
    assert.equal(req.cwd, "/tmp");
    assert.deepEqual(req.env, { A: "1" });
    assert.match(req.shell, /bash/);
    await box.pty.sendInput(42, new TextEncoder().encode("ls\n"));
    await box.pty.resize(42, { rows: 50, cols: 200 });
    assert.equal(await box.pty.kill(42), true);
    const tail = requests.slice(-3).map((r) => [r.url, r.body]);
    assert.deepEqual(tail, [
      ["/v1/sandboxes/sb-1/processes/42/stdin", "ls\n"],
      ["/v1/sandboxes/sb-1/processes/42/resize", '{"rows":50,"cols":200}'],
      ["/v1/sandboxes/sb-1/processes/42/signal", '{"signal":"SIGKILL"}'],
    ]);
    await assert.rejects(h.wait(), CommandExitError);
    assert.equal(Buffer.concat(data).toString(), "$ \u00e9");
  });

  test("sizes outside 1..1000 are refused before any request", async () => {
    const box = new Sandbox("sb-1", client);
    const n = requests.length;
    await assert.rejects(box.pty.create({ rows: 0, cols: 80 }), (err) => err instanceof InvalidArgumentError && /pty rows 0: want 1\.\.1000/.test(err.message));
    await assert.rejects(box.pty.resize(42, { rows: 24, cols: 1001 }), InvalidArgumentError);
    assert.equal(requests.length, n);
  });
});

// A real terminal: only against a daemon whose /v1/info lists "pty".
describe("pty on a daemon", { skip: !TAG && "FORKD_TEST_TAG is unset: needs a forkd daemon" }, () => {
  const t = new Tracker();
  let sb;
  let hasPty = false;
  before(async () => {
    const info = await new Client().transport.json({ method: "GET", path: "/v1/info", what: "daemon info" });
    hasPty = (info?.features ?? []).includes("pty");
    if (hasPty) sb = await t.create(TAG);
  });
  after(() => t.cleanup());

  test("a shell: size, resize, input, exit", async (ctx) => {
    if (!hasPty) return ctx.skip("the daemon does not offer the pty feature");
    let seen = "";
    const h = await sb.pty.create({ rows: 24, cols: 80, timeoutMs: 120_000, onData: (d) => (seen += Buffer.from(d).toString()) });
    await sb.pty.sendInput(h.pid, new TextEncoder().encode("stty size; echo $TERM\n"));
    await until(() => seen.includes("24 80") && seen.includes("xterm-256color"), "stty size");
    await sb.pty.resize(h.pid, { rows: 40, cols: 120 });
    await sb.pty.sendInput(h.pid, new TextEncoder().encode("stty size\n"));
    await until(() => seen.includes("40 120"), "the new size");
    await sb.pty.sendInput(h.pid, new TextEncoder().encode("exit 0\n"));
    assert.equal((await h.wait()).exitCode, 0);
  });

  test("resize of a process without a terminal is a ConflictError", async (ctx) => {
    if (!hasPty) return ctx.skip("the daemon does not offer the pty feature");
    const h = await sb.commands.run("sleep 600", { background: true });
    await assert.rejects(sb.pty.resize(h.pid, { rows: 5, cols: 5 }), ConflictError);
    await h.kill();
  });
});
