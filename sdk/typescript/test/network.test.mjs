// Sandbox networking and ports: network policies on fork, snapshot create
// and setNetwork(), getNetwork(), getPort() and getHost().
//
// The offline tests (fake daemons on a temporary Unix socket or TCP port)
// check what the SDK sends and how it reads the answers. The live ones need
// the test daemon, which gives sandboxes no network (FORKD_NETWORK=none):
// they round-trip policies and reach a server inside a sandbox through the
// daemon's port proxy; no sandbox sends traffic anywhere. Giving a live
// sandbox an allow-list links it to the daemon's host namespace (uplink,
// nftables rules, IPv4 forwarding), so that test runs only with
// FORKD_TEST_NETWORK_UPLINK=1, against a daemon whose --network-host-netns
// is a namespace made for it.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client, Sandbox, InvalidArgumentError, NotFoundError, UnavailableError } from "forkd";
import { TAG, PY_TAG, needsDaemon, needsPython, Tracker, getClient, until } from "./helpers/env.mjs";

const dir = mkdtempSync(join(tmpdir(), "forkd-ts-net-"));
after(() => rmSync(dir, { recursive: true, force: true }));

const SB = {
  id: "sb-net1",
  tag: "base",
  state: "running",
  created: "2026-01-02T03:04:05Z",
  ready_ms: 1.5,
  pooled: false,
  last_activity: "2026-01-02T03:04:05Z",
  network: { policy: { mode: "none" } },
};
const STATS = { tx_bytes: 10, rx_bytes: 20, tx_packets: 1, rx_packets: 2, denied_packets: 3, spoofed_packets: 4 };
const NET = { policy: { mode: "allow", allow: ["198.51.100.0/24", "*.example.com"] }, stats: STATS };

/**
 * A fake daemon (on a Unix socket, or TCP with tcp: true) that records
 * requests ({method, path, body, headers}) and answers the network and
 * port routes.
 */
async function fakeDaemon({ tcp = false, portHost = "" } = {}) {
  const requests = [];
  const server = http.createServer((req, res) => {
    let data = "";
    req.on("data", (c) => (data += c));
    req.on("end", () => {
      const body = data ? JSON.parse(data) : undefined;
      const path = req.url.split("?")[0];
      requests.push({ method: req.method, path, body, headers: req.headers });
      const send = (status, obj, type = "application/json") => {
        res.writeHead(status, { "content-type": type });
        res.end(JSON.stringify(obj));
      };
      const key = `${req.method} ${path}`;
      if (key === "POST /v1/sandboxes") {
        const sandboxes = [];
        for (let i = 0; i < (body.count ?? 1); i++) {
          sandboxes.push({ ...SB, id: `sb-net${i + 1}`, ...(body.network ? { network: { policy: body.network } } : {}) });
        }
        return send(200, { sandboxes, total_ms: 3 });
      }
      if (key === "POST /v1/snapshots") {
        res.writeHead(200, { "content-type": "application/x-ndjson" });
        res.end(JSON.stringify({ message: "booting" }) + "\n" + JSON.stringify({ snapshot: { tag: body.tag, id: "s1", state: "ready" } }) + "\n");
        return;
      }
      if (key === "GET /v1/sandboxes/sb-net1/network") return send(200, NET);
      if (key === "PUT /v1/sandboxes/sb-net1/network") return send(200, { policy: body, stats: STATS });
      if (key === "GET /v1/sandboxes/sb-net1/ports/8080") {
        return send(200, { port: 8080, path: "/v1/sandboxes/sb-net1/ports/8080/", ...(portHost ? { host: portHost } : {}) });
      }
      send(404, { title: "Not Found", status: 404, detail: `no route ${path}`, code: "not_found" }, "application/problem+json");
    });
  });
  let client;
  if (tcp) {
    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    client = new Client({ host: `http://127.0.0.1:${server.address().port}`, token: "tok", retries: 0 });
  } else {
    const socket = join(dir, `fake-${Math.random().toString(36).slice(2)}.sock`);
    await new Promise((r) => server.listen(socket, r));
    client = new Client({ socket, retries: 0 });
  }
  return {
    client,
    requests,
    port: tcp ? server.address().port : undefined,
    last: () => requests[requests.length - 1],
    async close() {
      client.close();
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    },
  };
}

const isInvalid = (err) => err instanceof InvalidArgumentError;

describe("network policies (offline)", () => {
  test("fork and create send the policy in every accepted form", async () => {
    const d = await fakeDaemon();
    try {
      const forms = [
        ["none", { mode: "none" }],
        ["public", { mode: "public" }],
        [" allow: 198.51.100.0/24 , *.example.com ,", { mode: "allow", allow: ["198.51.100.0/24", "*.example.com"] }],
        [true, { mode: "public" }],
        [false, { mode: "none" }],
        [{ mode: "none" }, { mode: "none" }],
        [{ mode: "allow", allow: ["203.0.113.7:443/tcp"] }, { mode: "allow", allow: ["203.0.113.7:443/tcp"] }],
        [["198.51.100.0/24"], { mode: "allow", allow: ["198.51.100.0/24"] }],
        [{ mode: "public", max_connections: 100, rate_mbit: 50 }, { mode: "public", max_connections: 100, rate_mbit: 50 }],
      ];
      for (const [input, want] of forms) {
        await Sandbox.create("base", { client: d.client, network: input });
        assert.deepEqual(d.last().body, { tag: "base", count: 1, timeout_s: 300, network: want }, `network ${JSON.stringify(input)}`);
      }
      const sbs = await Sandbox.fork("base", 2, { client: d.client, network: { mode: "allow", allow: ["198.51.100.0/24"] } });
      assert.equal(sbs.length, 2);
      assert.deepEqual(d.last().body.network, { mode: "allow", allow: ["198.51.100.0/24"] });
      assert.deepEqual(sbs[0].initialInfo.network, { policy: { mode: "allow", allow: ["198.51.100.0/24"] } });

      await d.client.sandboxes.fork("base", 1, { network: "none" });
      assert.deepEqual(d.last().body.network, { mode: "none" });
      await Sandbox.create("base", { client: d.client });
      assert.equal("network" in d.last().body, false, "no policy: inherit the snapshot's, else the daemon's");
    } finally {
      await d.close();
    }
  });

  test("a malformed policy is refused before any request", async () => {
    const d = await fakeDaemon();
    try {
      const bad = [
        "open",
        "",
        { mode: "internet" },
        { mode: "none", allow: ["198.51.100.0/24"] },
        { mode: "allow", allow: "198.51.100.0/24" },
        { mode: "allow", deny: ["x"] },
        {},
        ["ok.example", ""],
        42,
        null,
      ];
      for (const network of bad) {
        await assert.rejects(Sandbox.create("base", { client: d.client, network }), isInvalid, `network ${JSON.stringify(network)}`);
      }
      await assert.rejects(d.client.snapshots.create({ tag: "t1", recipe: "minimal", network: "nope" }), isInvalid);
      await assert.rejects(new Sandbox("sb-net1", d.client).setNetwork({ mode: "public", allow: ["x"] }), isInvalid);
      assert.equal(d.requests.length, 0);
    } finally {
      await d.close();
    }
  });

  test("snapshots.create sends the snapshot's policy", async () => {
    const d = await fakeDaemon();
    try {
      const progress = [];
      const snap = await d.client.snapshots.create({ tag: "t1", recipe: "minimal", network: "allow:203.0.113.0/24", onProgress: (m) => progress.push(m) });
      assert.equal(snap.tag, "t1");
      assert.deepEqual(progress, ["booting"]);
      assert.deepEqual(d.last().body, { tag: "t1", recipe: "minimal", network: { mode: "allow", allow: ["203.0.113.0/24"] } });
      await d.client.snapshots.create({ tag: "t2", recipe: "minimal" });
      assert.equal("network" in d.last().body, false);
    } finally {
      await d.close();
    }
  });

  test("getNetwork and setNetwork", async () => {
    const d = await fakeDaemon();
    try {
      const sb = new Sandbox("sb-net1", d.client);
      const n = await sb.getNetwork();
      assert.deepEqual(n, {
        policy: { mode: "allow", allow: ["198.51.100.0/24", "*.example.com"] },
        stats: { txBytes: 10, rxBytes: 20, txPackets: 1, rxPackets: 2, deniedPackets: 3, spoofedPackets: 4 },
      });
      assert.equal(d.last().method, "GET");
      assert.equal(d.last().path, "/v1/sandboxes/sb-net1/network");

      const got = await sb.setNetwork(["198.51.100.0/24"]);
      assert.equal(d.last().method, "PUT");
      assert.deepEqual(d.last().body, { mode: "allow", allow: ["198.51.100.0/24"] });
      assert.deepEqual(got.policy, { mode: "allow", allow: ["198.51.100.0/24"] });
      assert.deepEqual((await sb.setNetwork("none")).policy, { mode: "none" });
      assert.deepEqual(d.last().body, { mode: "none" });
    } finally {
      await d.close();
    }
  });

  test("getHost on a Unix-socket client: an http://forkd URL", async () => {
    const d = await fakeDaemon();
    try {
      const sb = new Sandbox("sb-net1", d.client);
      assert.deepEqual(await sb.getPort(8080), { port: 8080, path: "/v1/sandboxes/sb-net1/ports/8080/" });
      assert.equal(await sb.getHost(8080), "http://forkd/v1/sandboxes/sb-net1/ports/8080/");
      const n = d.requests.length;
      for (const bad of [0, 65536, -1, 80.5, "8080", NaN]) {
        await assert.rejects(sb.getHost(bad), isInvalid, `port ${bad}`);
      }
      assert.equal(d.requests.length, n);
      await assert.rejects(sb.getHost(9090), NotFoundError);
    } finally {
      await d.close();
    }
  });

  test("getHost on a TCP client: the URL on its base, with its token sent", async () => {
    const d = await fakeDaemon({ tcp: true });
    try {
      const sb = new Sandbox("sb-net1", d.client);
      assert.equal(await sb.getHost(8080), `http://127.0.0.1:${d.port}/v1/sandboxes/sb-net1/ports/8080/`);
      assert.equal(d.last().headers.authorization, "Bearer tok");
    } finally {
      await d.close();
    }
  });

  test("getHost with a port domain: the host alone, as E2B", async () => {
    const d = await fakeDaemon({ tcp: true, portHost: "8080-sb-net1.sandbox.example" });
    try {
      const sb = new Sandbox("sb-net1", d.client);
      assert.equal(await sb.getHost(8080), "8080-sb-net1.sandbox.example");
      assert.equal((await sb.getPort(8080)).host, "8080-sb-net1.sandbox.example");
    } finally {
      await d.close();
    }
  });
});

/** GET url (from getHost) through the client's daemon: {status, body}. */
function get(client, url) {
  const conn = client.transport.conn;
  const u = new URL(url);
  const opts = conn.socket !== undefined ? { socketPath: conn.socket, path: u.pathname } : { host: u.hostname, port: u.port, path: u.pathname };
  if (conn.token) opts.headers = { authorization: `Bearer ${conn.token}` };
  if (u.protocol !== "http:") throw new Error(`${url}: only http daemons are covered here`);
  return new Promise((resolve, reject) => {
    const req = http.get(opts, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode, body }));
    });
    req.on("error", reject);
  });
}

describe("network policies (live)", needsDaemon, () => {
  const t = new Tracker();
  after(() => t.cleanup());

  test("fork with network none: every child reports it", async () => {
    const sbs = await t.fork(TAG, 2, { network: { mode: "none" } });
    for (const sb of sbs) {
      const n = await sb.getNetwork();
      assert.deepEqual(n.policy, { mode: "none" });
      assert.equal(n.stats?.txPackets, 0);
      assert.equal((await sb.info()).network?.policy.mode, "none");
    }
    await Promise.all(sbs.map((sb) => sb.kill()));
  });

  test("setNetwork: none round-trips, the daemon checks allow-lists first", async () => {
    const sb = await t.create(TAG, { network: "none" });
    assert.deepEqual((await sb.setNetwork({ mode: "none" })).policy, { mode: "none" });
    await assert.rejects(sb.setNetwork("allow:10.0.0.0/8"), (err) => isInvalid(err) && /reserved/.test(err.message));
    await assert.rejects(sb.setNetwork({ mode: "allow", allow: ["not an address"] }), isInvalid);
    assert.deepEqual((await sb.getNetwork()).policy, { mode: "none" });
    await sb.kill();
    await assert.rejects(sb.getNetwork(), NotFoundError);
  });

  test(
    "setNetwork: an allow-list of documentation addresses, read back",
    process.env.FORKD_TEST_NETWORK_UPLINK === "1"
      ? needsDaemon
      : { skip: "FORKD_TEST_NETWORK_UPLINK=1 is unset: an allow-list links the sandbox to the daemon's host namespace" },
    async () => {
      const sb = await t.create(TAG, { network: "none" });
      const allow = ["198.51.100.0/24", "203.0.113.7:443/tcp"];
      assert.deepEqual((await sb.setNetwork({ mode: "allow", allow })).policy, { mode: "allow", allow });
      assert.deepEqual((await sb.getNetwork()).policy, { mode: "allow", allow });
      assert.deepEqual((await sb.info()).network?.policy, { mode: "allow", allow });
      assert.deepEqual((await sb.setNetwork("none")).policy, { mode: "none" });
      await sb.kill();
    },
  );

  test("getHost reaches a server in the sandbox through the proxy", needsPython, async () => {
    const sb = await t.create(PY_TAG, { network: "none" });
    await sb.files.makeDir("/tmp/www");
    await sb.files.write("/tmp/www/hello.txt", "hello through the proxy\n");
    const srv = await sb.commands.run(["python3", "-m", "http.server", "8766", "--bind", "0.0.0.0", "--directory", "/tmp/www"], { background: true });
    try {
      const info = await sb.getPort(8766);
      assert.equal(info.port, 8766);
      assert.equal(info.path, `/v1/sandboxes/${sb.id}/ports/8766/`);
      const url = await sb.getHost(8766);
      if (info.host) assert.equal(url, info.host);
      else assert.ok(url.endsWith(info.path), url);
      if (!info.host) {
        // The proxy answers 503 until the server listens.
        let res;
        await until(async () => {
          res = await get(getClient(), url + "hello.txt");
          return res.status !== 503;
        }, "the server in the sandbox to listen");
        assert.equal(res.status, 200, res.body);
        assert.equal(res.body, "hello through the proxy\n");
        await assert.rejects(getClient().transport.json({ method: "GET", path: `/v1/sandboxes/${sb.id}/ports/8767/` }), UnavailableError);
      }
    } finally {
      await srv.kill();
      await sb.kill();
    }
  });
});
