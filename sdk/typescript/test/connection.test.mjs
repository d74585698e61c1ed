// Connection settings, error decoding and cut streams, against fake
// daemons (node:http on a temporary Unix socket or TCP port): these need no
// forkd daemon.
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { mkdtempSync, rmSync, existsSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  Client,
  Sandbox,
  ForkdError,
  UnavailableError,
  RateLimitedError,
  AuthenticationError,
  PermissionDeniedError,
  ConflictError,
  InvalidArgumentError,
  NotFoundError,
  TimeoutError,
  StreamCutError,
  VERSION,
} from "forkd";

const dir = mkdtempSync(join(tmpdir(), "forkd-ts-"));
after(() => rmSync(dir, { recursive: true, force: true }));

/** Runs fn with env vars set (undefined deletes), restoring them after. */
async function withEnv(vars, fn) {
  const saved = {};
  for (const [k, v] of Object.entries(vars)) {
    saved[k] = process.env[k];
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
  try {
    return await fn();
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

const CONN_VARS = { FORKD_HOST: undefined, FORKD_SOCKET: undefined, FORKD_RUN_DIR: undefined, FORKD_TOKEN: undefined, FORKD_CA_CERT: undefined };

/** A fake daemon on a Unix socket; handler(req, res) answers. */
async function fakeDaemon(handler, clientOptions = {}) {
  const socket = join(dir, `fake-${Math.random().toString(36).slice(2)}.sock`);
  const server = http.createServer(handler);
  await new Promise((r) => server.listen(socket, r));
  const sockets = new Set();
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  return {
    socket,
    client: new Client({ socket, ...clientOptions }),
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}

function problem(res, status, code, detail, headers = {}) {
  res.writeHead(status, { "content-type": "application/problem+json", "x-request-id": "req-123", ...headers });
  res.end(JSON.stringify({ type: `https://forkd.dev/problems/${code}`, title: http.STATUS_CODES[status], status, detail, code, request_id: "req-123" }));
}

describe("connection settings", () => {
  test("version constant matches package.json", () => {
    const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8"));
    assert.equal(VERSION, pkg.version);
  });

  test("default socket is $FORKD_RUN_DIR/forkd.sock, else /run/forkd/forkd.sock", async () => {
    await withEnv(CONN_VARS, () => {
      assert.equal(new Client().where, "/run/forkd/forkd.sock");
    });
    await withEnv({ ...CONN_VARS, FORKD_RUN_DIR: "/tmp/rd" }, () => {
      assert.equal(new Client().where, "/tmp/rd/forkd.sock");
    });
    await withEnv({ ...CONN_VARS, FORKD_RUN_DIR: "/tmp/rd", FORKD_SOCKET: "/tmp/s.sock" }, () => {
      assert.equal(new Client().where, "/tmp/s.sock");
    });
  });

  test("FORKD_HOST: https, http and unix:// URLs; options win over env", async () => {
    await withEnv({ ...CONN_VARS, FORKD_HOST: "https://forkd.example:7443/", FORKD_SOCKET: "/tmp/ignored.sock" }, () => {
      assert.equal(new Client().where, "https://forkd.example:7443");
      assert.equal(new Client({ socket: "/tmp/mine.sock" }).where, "/tmp/mine.sock");
      assert.equal(new Client({ host: "http://127.0.0.1:7000" }).where, "http://127.0.0.1:7000");
    });
    await withEnv({ ...CONN_VARS, FORKD_HOST: "unix:///tmp/u.sock" }, () => {
      assert.equal(new Client().where, "/tmp/u.sock");
    });
  });

  test("a malformed host is an InvalidArgumentError", () => {
    assert.throws(() => new Client({ host: "ftp://x" }), InvalidArgumentError);
    assert.throws(() => new Client({ host: "not a url" }), InvalidArgumentError);
    assert.throws(() => new Client({ host: "unix://relative.sock" }), InvalidArgumentError);
  });

  test("an unreadable CA certificate is an InvalidArgumentError", () => {
    assert.throws(() => new Client({ host: "https://h:1", caCert: join(dir, "missing.pem") }), (err) => {
      assert.ok(err instanceof InvalidArgumentError);
      assert.match(err.message, /missing\.pem/);
      return true;
    });
  });
});

describe("daemon not running", () => {
  test("a missing socket names the path and how to start the daemon", async () => {
    const socket = join(dir, "nothing-here", "forkd.sock");
    await withEnv({ ...CONN_VARS, FORKD_SOCKET: socket }, async () => {
      for (const call of [() => new Client().health(), () => Sandbox.create("anything"), () => Sandbox.connect("sb-x")]) {
        await assert.rejects(call, (err) => {
          assert.ok(err instanceof UnavailableError, `got ${err?.name}: ${err?.message}`);
          assert.ok(err instanceof ForkdError);
          assert.equal(err.code, "unavailable");
          assert.ok(err.message.includes(socket), err.message);
          assert.match(err.message, /forkd daemon start/);
          assert.doesNotMatch(err.message, /^connect ENOENT/);
          return true;
        });
      }
    });
  });

  test("a refused TCP port names the host", async () => {
    await assert.rejects(new Client({ host: "http://127.0.0.1:9" }).health(), (err) => {
      assert.ok(err instanceof UnavailableError, `got ${err?.name}: ${err?.message}`);
      assert.match(err.message, /127\.0\.0\.1:9/);
      assert.match(err.message, /ECONNREFUSED/);
      return true;
    });
  });
});

describe("problem+json errors", () => {
  let fake;
  let seen = [];
  before(async () => {
    fake = await fakeDaemon((req, res) => {
      seen.push(req);
      const url = new URL(req.url, "http://x");
      switch (url.pathname) {
        case "/v1/sandboxes/limit":
          return problem(res, 429, "resource_exhausted", "too many sandboxes (max 2)", { "retry-after": "2" });
        case "/v1/sandboxes/busy":
          return problem(res, 503, "unavailable", "daemon shutting down", { "retry-after": "5" });
        case "/v1/sandboxes/auth":
          return problem(res, 401, "unauthenticated", "missing bearer token");
        case "/v1/sandboxes/role":
          return problem(res, 403, "permission_denied", "token ro (read-only, tenant acme) may not call POST /v1/sandboxes");
        case "/v1/sandboxes/taken":
          return problem(res, 409, "already_exists", "tag taken");
        case "/v1/sandboxes/bad":
          return problem(res, 400, "invalid_argument", "count must be >= 1");
        case "/v1/sandboxes/late":
          return problem(res, 504, "deadline_exceeded", "took too long");
        case "/v1/sandboxes/plain":
          res.writeHead(502, { "content-type": "text/plain", "x-request-id": "req-502" });
          return res.end("bad gateway from a proxy");
        case "/v1/sandboxes/slow":
          return; // never answers
        default:
          return problem(res, 404, "not_found", `no route ${req.method} ${url.pathname}`);
      }
    }, { retries: 0 });
  });
  after(() => fake.close());

  const get = (id) => fake.client.sandboxes.get(id);

  test("429 is RateLimitedError with retryAfter and the request id", async () => {
    await assert.rejects(get("limit"), (err) => {
      assert.ok(err instanceof RateLimitedError);
      assert.equal(err.status, 429);
      assert.equal(err.code, "resource_exhausted");
      assert.equal(err.retryAfter, 2);
      assert.equal(err.requestId, "req-123");
      assert.equal(err.message, "too many sandboxes (max 2)");
      assert.equal(err.problem.title, "Too Many Requests");
      return true;
    });
  });

  test("503 is UnavailableError with retryAfter", async () => {
    await assert.rejects(get("busy"), (err) => err instanceof UnavailableError && err.retryAfter === 5 && err.status === 503);
  });

  test("401, 403, 409, 400, 404, 504 map to their classes", async () => {
    await assert.rejects(get("auth"), AuthenticationError);
    await assert.rejects(get("role"), (err) => err instanceof PermissionDeniedError && err.status === 403 && err.code === "permission_denied");
    await assert.rejects(get("taken"), ConflictError);
    await assert.rejects(get("bad"), (err) => err instanceof InvalidArgumentError && err.detail === "count must be >= 1");
    await assert.rejects(get("nope"), NotFoundError);
    await assert.rejects(get("late"), TimeoutError);
  });

  test("a non-problem error body still becomes a ForkdError with the text", async () => {
    await assert.rejects(get("plain"), (err) => {
      assert.ok(err instanceof ForkdError);
      assert.equal(err.status, 502);
      assert.equal(err.requestId, "req-502");
      assert.match(err.message, /bad gateway from a proxy/);
      return true;
    });
  });

  test("requestTimeoutMs bounds plain calls", async () => {
    const c = new Client({ socket: fake.socket, requestTimeoutMs: 200 });
    const t0 = Date.now();
    await assert.rejects(c.sandboxes.get("slow"), TimeoutError);
    assert.ok(Date.now() - t0 < 30_000); // it never answers
  });

  test("an AbortSignal aborts a call with an AbortError", async () => {
    const ac = new AbortController();
    const p = fake.client.sandboxes.get("slow", { signal: ac.signal });
    setTimeout(() => ac.abort(), 50);
    await assert.rejects(p, (err) => err.name === "AbortError");
  });

  test("sends a user agent; the token goes as a bearer header", async () => {
    seen = [];
    await assert.rejects(new Client({ socket: fake.socket, token: "forkd_secret" }).sandboxes.get("x"));
    assert.equal(seen.at(-1).headers.authorization, "Bearer forkd_secret");
    assert.match(seen.at(-1).headers["user-agent"], /^forkd-typescript\//);
  });
});

describe("TLS", () => {
  let server;
  let url;
  let ca;
  let seen;
  before(async () => {
    const { execFileSync } = await import("node:child_process");
    const https = await import("node:https");
    ca = join(dir, "ca.pem");
    const key = join(dir, "key.pem");
    try {
      execFileSync(
        "openssl",
        ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", ca, "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        { stdio: "ignore" },
      );
    } catch {
      return; // no openssl to make a certificate: the tests below skip
    }
    server = https.createServer({ key: readFileSync(key), cert: readFileSync(ca) }, (req, res) => {
      seen = req;
      if (req.url === "/v1/healthz") {
        res.writeHead(200, { "content-type": "application/json" });
        return res.end('{"status":"ok"}');
      }
      if (req.headers.authorization !== "Bearer forkd_tok") return problem(res, 401, "unauthenticated", "missing or unknown bearer token");
      res.writeHead(200, { "content-type": "application/json" });
      res.end('{"version":"v","go_version":"go","vmm":"qemu","vmm_version":"1","accel":"","data_dir":"/d"}');
    });
    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    url = `https://127.0.0.1:${server.address().port}`;
  });
  after(() => server?.close());

  test("https with FORKD_CA_CERT and FORKD_TOKEN from the environment", async (t) => {
    if (!server) return t.skip("openssl is not available to make a test certificate");
    await withEnv({ ...CONN_VARS, FORKD_HOST: url, FORKD_CA_CERT: ca, FORKD_TOKEN: "forkd_tok" }, async () => {
      const c = new Client();
      assert.equal(c.where, url);
      assert.equal((await c.version()).vmm, "qemu");
      assert.equal(seen.headers.authorization, "Bearer forkd_tok");
      c.close();
    });
  });

  test("a wrong token is an AuthenticationError; the CA can be given as PEM text", async (t) => {
    if (!server) return t.skip("openssl is not available to make a test certificate");
    const c = new Client({ host: url, caCert: readFileSync(ca, "utf8"), token: "wrong" });
    assert.deepEqual(await c.health(), { status: "ok" });
    await assert.rejects(c.version(), AuthenticationError);
    c.close();
  });

  test("an unknown CA is a clear UnavailableError naming FORKD_CA_CERT", async (t) => {
    if (!server) return t.skip("openssl is not available to make a test certificate");
    await withEnv(CONN_VARS, async () => {
      await assert.rejects(new Client({ host: url }).health(), (err) => {
        assert.ok(err instanceof UnavailableError, `${err.name}: ${err.message}`);
        assert.match(err.message, /TLS/);
        assert.match(err.message, /FORKD_CA_CERT/);
        return true;
      });
    });
  });
});

describe("request shapes (what the SDK sends, per openapi.yaml)", () => {
  let fake;
  const log = [];
  let snapState = "writing";
  before(async () => {
    fake = await fakeDaemon((req, res) => {
      const chunks = [];
      req.on("data", (c) => chunks.push(c));
      req.on("end", () => {
        const url = new URL(req.url, "http://x");
        const body = Buffer.concat(chunks).toString();
        log.push({ method: req.method, path: url.pathname, query: Object.fromEntries([...url.searchParams.keys()].map((k) => [k, url.searchParams.getAll(k).join(",")])), headers: req.headers, body });
        const json = (status, v) => {
          res.writeHead(status, { "content-type": "application/json" });
          res.end(JSON.stringify(v));
        };
        const p = url.pathname;
        if (p === "/v1/sandboxes/kill") return json(200, { killed: ["sb-1", "sb-2"] });
        if (p === "/v1/sandboxes" && req.method === "POST") return json(201, { sandboxes: [{ id: "sb-1", tag: "t", state: "running", created: new Date().toISOString(), ready_ms: 1, pooled: false, last_activity: new Date().toISOString() }], total_ms: 1 });
        if (p === "/v1/sandboxes") return json(200, { items: [] });
        if (p.endsWith("/exec")) {
          res.writeHead(200, { "content-type": "application/x-ndjson", "x-forkd-pid": "42" });
          return res.end('{"type":"start","pid":42}\n{"type":"exit","duration_us":5}\n');
        }
        if (p === "/v1/sandboxes/sb-1/processes") {
          return json(200, [{ pid: 42, argv: ["/bin/sh", "-c", "cat"], shell: "cat", cwd: "/root", started: "2026-01-02T03:04:05.5Z", stdin_open: true }]);
        }
        if (p === "/v1/sandboxes/sb-1/processes/42/stdin" || p === "/v1/sandboxes/sb-1/processes/42/signal") {
          res.writeHead(204);
          return res.end();
        }
        if (p === "/v1/sandboxes/sb-1/processes/7/signal") return problem(res, 404, "not_found", "agent: signal process 7: no running exec with pid 7: not found");
        if (p.endsWith("/files") && req.method === "PUT") return json(200, { name: "f", path: url.searchParams.get("path"), size: body.length, mode: 0o600, is_dir: false, mod_time: new Date().toISOString() });
        if (p.endsWith("/compact")) return json(201, { tag: "flat", depth: 0, state: "ready" });
        if (p === "/v1/snapshots/import") return json(201, { tag: url.searchParams.get("tag"), state: "ready" });
        if (p.endsWith("/archive")) {
          res.writeHead(200, { "content-type": "application/zstd" });
          return res.end("ARCHIVE");
        }
        if (p === "/v1/snapshots/failing") return json(200, { tag: "failing", state: "failed", error: "disk full" });
        if (p === "/v1/snapshots/slow") return json(200, { tag: "slow", state: snapState });
        if (p.startsWith("/v1/snapshots/") && req.method === "DELETE") {
          // As a daemon from before the list of removed tags: 204, no body.
          if (!url.searchParams.has("cascade")) {
            res.writeHead(204);
            return res.end();
          }
          return json(200, { removed: ["x-layer", "x"] });
        }
        if (p.endsWith("/branch")) return json(202, { snapshot: { tag: JSON.parse(body).tag, state: "writing", files: {} }, pause_ms: 0.5, bytes_written: 0, total_ms: 1 });
        return problem(res, 404, "not_found", "no route");
      });
    });
  });
  after(() => fake.close());
  const last = () => log.at(-1);

  test("fork: tag, count, timeouts, metadata", async () => {
    await Sandbox.fork("t", 2, { client: fake.client, timeoutS: 60, idleTimeoutS: 30, metadata: { a: "b" } });
    assert.deepEqual(JSON.parse(last().body), { tag: "t", count: 2, timeout_s: 60, idle_timeout_s: 30, metadata: { a: "b" } });
    assert.equal(last().headers["content-type"], "application/json");
  });

  test("list filters, kill, killAll", async () => {
    await fake.client.sandboxes.list({ tag: "t", state: "running", metadata: { a: "1", b: "2" } });
    assert.deepEqual(last().query, { tag: "t", state: "running", label: "a=1,b=2", limit: "1000" });
    assert.deepEqual(await fake.client.sandboxes.kill(["sb-1", "sb-2"]), ["sb-1", "sb-2"]);
    assert.deepEqual(JSON.parse(last().body), { ids: ["sb-1", "sb-2"] });
    await fake.client.sandboxes.killAll();
    assert.deepEqual(JSON.parse(last().body), { all: true });
  });

  test("exec: the request in X-Forkd-Exec, stdin as the body", async () => {
    const box = new Sandbox("sb-1", fake.client);
    await box.commands.run(["echo", "ü"], { envs: { K: "v" }, cwd: "/w", timeoutMs: 1500, stdin: "in" });
    assert.deepEqual(JSON.parse(last().headers["x-forkd-exec"]), { argv: ["echo", "ü"], env: { K: "v" }, cwd: "/w", timeout_ms: 1500, stdin: true });
    assert.equal(last().body, "in");
    await box.commands.run("true");
    assert.deepEqual(JSON.parse(last().headers["x-forkd-exec"]), { shell: "true", timeout_ms: 60000 });
    assert.equal(last().body, "");
    await box.commands.run("true", { background: true }).then((h) => h.wait());
    assert.deepEqual(JSON.parse(last().headers["x-forkd-exec"]), { shell: "true" });
  });

  test("process control: stdin_open, pid, list, stdin and signal routes", async () => {
    const box = new Sandbox("sb-1", fake.client);
    const h = await box.commands.run("cat", { background: true, stdin: true });
    assert.deepEqual(JSON.parse(last().headers["x-forkd-exec"]), { shell: "cat", stdin_open: true });
    assert.equal(last().body, "");
    assert.equal(h.pid, 42);
    assert.equal((await h.wait()).pid, 42);
    await h.sendStdin("héllo");
    assert.deepEqual([last().method, last().path, last().query, last().body], ["POST", "/v1/sandboxes/sb-1/processes/42/stdin", {}, "héllo"]);
    assert.equal(last().headers["content-type"], "application/octet-stream");
    await box.commands.closeStdin(42);
    assert.deepEqual([last().path, last().query, last().body], ["/v1/sandboxes/sb-1/processes/42/stdin", { close: "true" }, ""]);
    assert.equal(await box.commands.kill(42, "SIGTERM"), true);
    assert.deepEqual([last().path, JSON.parse(last().body)], ["/v1/sandboxes/sb-1/processes/42/signal", { signal: "SIGTERM" }]);
    assert.equal(await box.commands.kill(7), false);
    const [p] = await box.commands.list();
    assert.deepEqual({ ...p, started: p.started.toISOString() }, {
      pid: 42, argv: ["/bin/sh", "-c", "cat"], cmd: "cat", cwd: "/root", started: "2026-01-02T03:04:05.500Z", stdinOpen: true,
    });
  });

  test("files.write: raw body, ?path= and octal ?mode=", async () => {
    const box = new Sandbox("sb-1", fake.client);
    await box.files.write("/a b/ü.txt", "data", { mode: 0o600 });
    assert.deepEqual(last().query, { path: "/a b/ü.txt", mode: "0600" });
    assert.equal(last().body, "data");
    assert.equal(last().headers["content-type"], "application/octet-stream");
  });

  test("snapshots: delete flags, compact, pack, unpack query", async () => {
    assert.deepEqual(await fake.client.snapshots.delete("x", { cascade: true }), ["x-layer", "x"]);
    assert.deepEqual(last().query, { cascade: "true" });
    assert.deepEqual(await fake.client.snapshots.delete("x", { force: true }), ["x"]);
    assert.deepEqual(last().query, { force: "true" });
    await fake.client.snapshots.delete("x");
    assert.deepEqual(last().query, {});
    const flat = await fake.client.snapshots.compact("head", "flat");
    assert.deepEqual(JSON.parse(last().body), { to: "flat" });
    assert.equal(flat.depth, 0);
    const chunks = [];
    const { Writable } = await import("node:stream");
    const r = await fake.client.snapshots.pack("x", new Writable({ write: (c, _e, cb) => (chunks.push(c), cb()) }), { image: false });
    assert.deepEqual(last().query, { image: "0" });
    assert.equal(r.bytes, 7);
    assert.equal(Buffer.concat(chunks).toString(), "ARCHIVE");
    const key = new Uint8Array(32).fill(251);
    await fake.client.snapshots.unpack(Buffer.from("ARCHIVE"), { tag: "n", force: true, verifyKey: key });
    assert.deepEqual(last().query, { tag: "n", force: "1", verify_key: Buffer.from(key).toString("base64url") });
    assert.equal(last().headers["content-type"], "application/zstd");
    assert.equal(last().body, "ARCHIVE");
    await assert.rejects(fake.client.snapshots.unpack(Buffer.from("x"), { verifyKey: new Uint8Array(5) }), InvalidArgumentError);
  });

  test("branch without waiting (202), waitReady: ready, failed, timeout", async () => {
    const { SnapshotFailedError } = await import("forkd");
    const box = new Sandbox("sb-1", fake.client);
    const b = await box.branch({ tag: "slow", mode: "live", wait: false });
    assert.deepEqual(JSON.parse(last().body), { tag: "slow", mode: "live", no_wait: true });
    assert.equal(b.snapshot.state, "writing");
    setTimeout(() => (snapState = "ready"), 300);
    assert.equal((await b.waitReady({ intervalMs: 50 })).state, "ready");
    await assert.rejects(fake.client.snapshots.waitReady("failing"), (err) => err instanceof SnapshotFailedError && /disk full/.test(err.message));
    snapState = "writing";
    await assert.rejects(fake.client.snapshots.waitReady("slow", { timeoutMs: 200, intervalMs: 50 }), TimeoutError);
  });
});

describe("keep-alive", () => {
  test("a pooled connection the daemon closed is retried once on a fresh one", async () => {
    let conns = 0;
    const fake = await fakeDaemon((req, res) => {
      const s = req.socket;
      s.served = (s.served ?? 0) + 1;
      if (s.served === 1) s.id = ++conns;
      if (s.served === 2) {
        // As if the daemon had restarted while this connection sat idle.
        s.destroy();
        return;
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ status: "ok", conn: s.id }));
    });
    try {
      assert.equal((await fake.client.health()).conn, 1);
      const again = await fake.client.health();
      assert.equal(again.status, "ok");
      assert.equal(again.conn, 2, "answered on a new connection");
      // A streamed body cannot be sent twice: that one fails, clearly.
      const { Readable } = await import("node:stream");
      await assert.rejects(
        fake.client.snapshots.unpack(Readable.from([Buffer.from("x")])),
        (err) => err instanceof UnavailableError && /connection/.test(err.message),
      );
    } finally {
      await fake.close();
    }
  });
});

describe("cut streams", () => {
  let fake;
  before(async () => {
    fake = await fakeDaemon((req, res) => {
      const url = new URL(req.url, "http://x");
      const p = url.pathname;
      if (req.method === "GET" && p.startsWith("/v1/sandboxes/")) {
        if (p.endsWith("/files")) {
          // Promise 1000 bytes, send 10, then hang up.
          res.writeHead(200, { "content-type": "application/octet-stream", "content-length": "1000" });
          res.write("0123456789");
          setTimeout(() => res.socket.destroy(), 20);
          return;
        }
        return problem(res, 404, "not_found", "no sandbox");
      }
      if (p.endsWith("/archive")) {
        res.writeHead(200, { "content-type": "application/zstd" });
        res.write(Buffer.alloc(4096, 1));
        setTimeout(() => res.socket.destroy(), 20);
        return;
      }
      if (p.endsWith("/exec") || p.endsWith("/run_code/stream")) {
        req.resume();
        res.writeHead(200, { "content-type": "application/x-ndjson", "x-request-id": "req-cut" });
        const line = p.endsWith("/exec") ? { type: "stdout", data: Buffer.from("partial\n").toString("base64") } : { type: "stdout", data: "partial\n" };
        res.write(JSON.stringify(line) + "\n");
        if (p.includes("clean-end")) {
          res.end(); // a well-formed end, but no exit event
        } else {
          setTimeout(() => res.socket.destroy(), 20);
        }
        return;
      }
      return problem(res, 404, "not_found", "no route");
    });
  });
  after(() => fake.close());

  test("exec cut mid-way rejects with StreamCutError (run, stream, background wait)", async () => {
    // The fake knows no sandbox to connect() to: build the handle directly.
    const box = new Sandbox("sb-cut", fake.client);
    const isCut = (err) => {
      assert.ok(err instanceof StreamCutError, `got ${err?.name}: ${err?.message}`);
      assert.equal(err.code, "stream_cut");
      assert.equal(err.requestId, "req-cut");
      assert.match(err.message, /sb-cut/);
      assert.match(err.message, /gone|killed/); // the fake says 404 for the sandbox
      return true;
    };
    let got = "";
    await assert.rejects(box.commands.run("x", { onStdout: (s) => (got += s) }), isCut);
    assert.equal(got, "partial\n");
    await assert.rejects(async () => {
      for await (const ev of box.commands.stream("x")) void ev;
    }, isCut);
    const h = await box.commands.run("x", { background: true });
    await assert.rejects(h.wait(), isCut);
    const clean = new Sandbox("clean-end", fake.client);
    await assert.rejects(clean.commands.run("x"), StreamCutError);
  });

  test("run_code cut mid-way rejects with StreamCutError", async () => {
    const box = new Sandbox("sb-cut", fake.client);
    await assert.rejects(box.runCode("x"), (err) => err instanceof StreamCutError && /before its result/.test(err.message));
  });

  test("a file read cut short rejects (text, bytes, stream)", async () => {
    const box = new Sandbox("sb-cut", fake.client);
    await assert.rejects(box.files.read("/f"), StreamCutError);
    await assert.rejects(box.files.read("/f", { format: "bytes" }), StreamCutError);
    const stream = await box.files.read("/f", { format: "stream" });
    await assert.rejects(async () => {
      for await (const chunk of stream) void chunk;
    }, StreamCutError);
  });

  test("an archive cut short rejects and leaves no file", async () => {
    const dest = join(dir, "cut.forkd.tar.zst");
    await assert.rejects(fake.client.snapshots.pack("t", dest), StreamCutError);
    assert.equal(existsSync(dest), false);
  });
});

describe("retries of refusals with a Retry-After", () => {
  test("429 and 503 with Retry-After are sent again, up to `retries` times", async () => {
    let answers = [429, 503, 200];
    let calls = 0;
    const fake = await fakeDaemon((req, res) => {
      calls++;
      const status = answers.length ? answers.shift() : 429;
      if (status === 200) {
        res.writeHead(200, { "content-type": "application/json" });
        return res.end(JSON.stringify({ version: "test" }));
      }
      return problem(res, status, status === 429 ? "resource_exhausted" : "unavailable", "refused", { "retry-after": "0" });
    });
    try {
      assert.equal((await fake.client.version()).version, "test");
      assert.equal(calls, 3);
      answers = [429, 429, 429, 200];
      await assert.rejects(fake.client.version(), (err) => err instanceof RateLimitedError && err.retryAfter === 0);
      assert.equal(calls, 6);
    } finally {
      await fake.close();
    }
  });

  test("no Retry-After, a wait over 10 s, another status, or retries: 0 reject at once", async () => {
    const refusals = [
      [429, {}],
      [503, { "retry-after": "60" }],
      [500, { "retry-after": "0" }],
      [429, { "retry-after": "0" }], // for the client with retries: 0
    ];
    let calls = 0;
    const fake = await fakeDaemon((req, res) => {
      const [status, headers] = refusals[calls++];
      return problem(res, status, status === 429 ? "resource_exhausted" : "unavailable", "refused", headers);
    });
    const noRetry = new Client({ socket: fake.socket, retries: 0 });
    try {
      const start = Date.now();
      await assert.rejects(fake.client.version(), RateLimitedError);
      await assert.rejects(fake.client.version(), UnavailableError);
      await assert.rejects(fake.client.version(), ForkdError);
      await assert.rejects(noRetry.version(), (err) => err instanceof RateLimitedError && err.retryAfter === 0);
      assert.equal(calls, 4);
      assert.ok(Date.now() - start < 30_000); // not the 60 s Retry-After
      assert.throws(() => new Client({ socket: fake.socket, retries: -1 }), InvalidArgumentError);
    } finally {
      noRetry.close();
      await fake.close();
    }
  });
});

describe("long operations", () => {
  test("snapshots.create starts an operation (Prefer, Idempotency-Key) and follows its events through a cut", async () => {
    const op = { id: "op-1", kind: "snapshot.create", target: "t1", state: "running", progress: [] };
    const seen = [];
    let attaches = 0;
    const fake = await fakeDaemon((req, res) => {
      seen.push({ method: req.method, path: req.url, headers: req.headers });
      req.resume();
      req.on("end", () => {
        if (req.method === "POST" && req.url === "/v1/snapshots") {
          res.writeHead(202, { "content-type": "application/json", location: "/v1/operations/op-1" });
          return res.end(JSON.stringify(op) + "\n");
        }
        if (req.url === "/v1/operations/op-1/events") {
          attaches++;
          res.writeHead(200, { "content-type": "application/x-ndjson" });
          if (attaches === 1) {
            // Cut before the end: the SDK re-attaches.
            return res.end(JSON.stringify({ type: "state", operation: op }) + "\n" + JSON.stringify({ type: "progress", message: "booting template" }) + "\n");
          }
          const now = { ...op, progress: ["booting template"] };
          return res.end(
            JSON.stringify({ type: "state", operation: now }) + "\n" +
              JSON.stringify({ type: "state", operation: { ...now, state: "succeeded", result: { tag: "t1", id: "s-1", state: "ready", files: {} } } }) + "\n",
          );
        }
        problem(res, 404, "not_found", "no route");
      });
    });
    try {
      const msgs = [];
      const snap = await fake.client.snapshots.create({ tag: "t1", recipe: "minimal", idempotencyKey: "k-1", onProgress: (m) => msgs.push(m) });
      assert.equal(snap.tag, "t1");
      assert.deepEqual(msgs, ["booting template"]);
      assert.equal(attaches, 2);
      assert.equal(seen[0].headers.prefer, "respond-async");
      assert.equal(seen[0].headers["idempotency-key"], "k-1");
    } finally {
      await fake.close();
    }
  });

  test("operations.cancel, a cancelled wait, a bad idempotency key", async () => {
    const ended = { id: "op-2", kind: "snapshot.create", target: "t2", state: "cancelled", error: { title: "", status: 499, detail: "operation cancelled by request", code: "canceled" } };
    const fake = await fakeDaemon((req, res) => {
      req.resume();
      req.on("end", () => {
        if (req.url === "/v1/operations/op-2/cancel") {
          res.writeHead(202, { "content-type": "application/json" });
          return res.end(JSON.stringify({ ...ended, state: "running", cancel_requested: true }));
        }
        if (req.url === "/v1/operations/op-2/events") {
          res.writeHead(200, { "content-type": "application/x-ndjson" });
          return res.end(JSON.stringify({ type: "state", operation: ended }) + "\n");
        }
        problem(res, 404, "not_found", "no route");
      });
    });
    try {
      assert.equal((await fake.client.operations.cancel("op-2")).cancelRequested, true);
      const op = await fake.client.operations.wait("op-2");
      assert.equal(op.state, "cancelled");
      assert.equal(op.error.code, "canceled");
      await assert.rejects(fake.client.sandboxes.fork("x", 1, { idempotencyKey: "k".repeat(256) }), InvalidArgumentError);
    } finally {
      await fake.close();
    }
  });
});

describe("list paging", () => {
  test("list() follows next_cursor with the filters; a bare array is one page", async () => {
    const ids = ["sb-1", "sb-2", "sb-3", "sb-4", "sb-5"];
    const queries = [];
    const fake = await fakeDaemon((req, res) => {
      const url = new URL(req.url, "http://x");
      const json = (v) => {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify(v));
      };
      if (url.pathname === "/v1/operations") return json([{ id: "op-1" }, { id: "op-2" }]); // a daemon from before paging
      if (url.pathname === "/v1/images") return json({ items: [{ digest: "d1" }], next_cursor: "same" });
      queries.push(url.searchParams);
      const start = Number(url.searchParams.get("cursor") ?? "0");
      const end = Math.min(start + 2, ids.length); // pages of 2, whatever the limit
      const page = { items: ids.slice(start, end).map((id) => ({ id, tag: url.searchParams.get("tag") })) };
      if (end < ids.length) page.next_cursor = String(end);
      json(page);
    });
    try {
      const got = await fake.client.sandboxes.list({ tag: "py", metadata: { team: "a" } });
      assert.deepEqual(got.map((s) => s.id), ids);
      assert.ok(got.every((s) => s.tag === "py"));
      assert.deepEqual(queries.map((q) => q.get("cursor")), [null, "2", "4"]);
      assert.ok(queries.every((q) => q.get("label") === "team=a" && q.get("limit") === "1000"));
      assert.deepEqual((await fake.client.operations.list()).map((o) => o.id), ["op-1", "op-2"]);
      await assert.rejects(fake.client.images.list(), /same next_cursor/);
    } finally {
      await fake.close();
    }
  });
});
