#!/usr/bin/env node
// SDK overhead: sb.commands.run("true") through the SDK against the same
// request sent with bare node:http over the same daemon connection
// settings, interleaved (alternating which goes first), after a warm-up.
//
//   node bench/overhead.mjs [--tag TAG] [-n 300] [--warmup 50] [--json]
//   node bench/overhead.mjs --fake [-n 3000]
//
// Needs a daemon (FORKD_SOCKET or FORKD_HOST, as the SDK) and a snapshot tag
// (--tag, default $FORKD_TEST_TAG). Run `npm run build` first. With --fake
// the daemon is an in-process stub answering the exit event at once: no VM,
// no daemon, so what remains is the client side alone (the SDK's own cost,
// without the guest's noise).
import http from "node:http";
import { parseArgs } from "node:util";
import { Sandbox, Client } from "../dist/index.js";

const { values: args } = parseArgs({
  options: {
    tag: { type: "string", default: process.env.FORKD_TEST_TAG },
    n: { type: "string", short: "n", default: "300" },
    warmup: { type: "string", default: "50" },
    json: { type: "boolean", default: false },
    fake: { type: "boolean", default: false },
  },
});
let fakeServer;
if (args.fake) {
  const { mkdtempSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
  const { join } = await import("node:path");
  const socket = join(mkdtempSync(join(tmpdir(), "forkd-bench-")), "fake.sock");
  fakeServer = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      if (req.url === "/v1/sandboxes" && req.method === "POST") {
        res.writeHead(201, { "content-type": "application/json" });
        return res.end(JSON.stringify({ sandboxes: [{ id: "sb-fake", tag: "fake", state: "running" }], total_ms: 0 }));
      }
      if (req.method === "DELETE") {
        res.writeHead(204);
        return res.end();
      }
      res.writeHead(200, { "content-type": "application/x-ndjson" });
      res.end('{"type":"exit","duration_us":5}\n');
    });
  });
  await new Promise((r) => fakeServer.listen(socket, r));
  process.env.FORKD_SOCKET = socket;
  delete process.env.FORKD_HOST;
  args.tag = "fake";
}
if (!args.tag) {
  console.error("give a snapshot tag with --tag or FORKD_TEST_TAG");
  process.exit(2);
}
const N = Number(args.n);
const WARMUP = Number(args.warmup);

const client = new Client();
const conn = client.transport.conn; // the same resolved settings as the SDK
if (!conn.socket && !conn.url?.startsWith("http:")) {
  console.error("the raw side of this bench speaks plain HTTP: use the Unix socket or an http:// host");
  process.exit(2);
}
const rawAgent = new http.Agent({ keepAlive: true, maxSockets: 1 });
const base = conn.socket ? { socketPath: conn.socket } : { hostname: new URL(conn.url).hostname, port: new URL(conn.url).port };
const auth = conn.token ? { authorization: `Bearer ${conn.token}` } : {};

/** The same exec request the SDK sends, with nothing but node:http. */
function rawRun(id) {
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        ...base,
        agent: rawAgent,
        method: "POST",
        path: `/v1/sandboxes/${id}/exec`,
        headers: { ...auth, "x-forkd-exec": '{"shell":"true","timeout_ms":60000}', accept: "application/x-ndjson", "content-length": "0" },
      },
      (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (d) => (body += d));
        res.on("end", () => {
          const lines = body.trim().split("\n");
          const exit = JSON.parse(lines[lines.length - 1]);
          if (res.statusCode !== 200 || exit.type !== "exit" || (exit.exit_code ?? 0) !== 0) reject(new Error(`raw exec: ${res.statusCode} ${body}`));
          else resolve(exit);
        });
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end();
  });
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;

const sb = await Sandbox.create(args.tag, { client });
try {
  const sdkRun = () => sb.commands.run("true");
  for (let i = 0; i < WARMUP; i++) {
    await sdkRun();
    await rawRun(sb.id);
  }
  const sdk = [];
  const raw = [];
  for (let i = 0; i < N; i++) {
    const order = i % 2 ? [["sdk", sdkRun], ["raw", () => rawRun(sb.id)]] : [["raw", () => rawRun(sb.id)], ["sdk", sdkRun]];
    for (const [name, fn] of order) {
      const t0 = process.hrtime.bigint();
      await fn();
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      (name === "sdk" ? sdk : raw).push(ms);
    }
  }
  const row = (xs) => ({ p50: pct(xs, 50), p90: pct(xs, 90), mean: mean(xs) });
  const diffs = sdk.map((v, i) => v - raw[i]);
  const result = {
    n: N,
    warmup: WARMUP,
    daemon: args.fake ? "fake" : client.where,
    sdk: row(sdk),
    raw: row(raw),
    overhead: { p50: pct(sdk, 50) - pct(raw, 50), p90: pct(sdk, 90) - pct(raw, 90), pairedMedian: pct(diffs, 50) },
  };
  if (args.json) {
    console.log(JSON.stringify(result, null, 2));
  } else {
    const f = (x) => x.toFixed(3).padStart(8);
    console.log(`commands.run("true"), n=${N} interleaved after ${WARMUP} warm-up runs each, ${args.fake ? "in-process fake daemon" : `daemon ${client.where}`}`);
    console.log(`            p50 ms   p90 ms  mean ms`);
    console.log(`  SDK     ${f(result.sdk.p50)} ${f(result.sdk.p90)} ${f(result.sdk.mean)}`);
    console.log(`  raw     ${f(result.raw.p50)} ${f(result.raw.p90)} ${f(result.raw.mean)}`);
    console.log(`  SDK-raw ${f(result.overhead.p50)} ${f(result.overhead.p90)}   (median of paired differences ${result.overhead.pairedMedian.toFixed(3)} ms)`);
  }
} finally {
  await sb.kill();
  rawAgent.destroy();
  client.close();
  fakeServer?.close();
}
