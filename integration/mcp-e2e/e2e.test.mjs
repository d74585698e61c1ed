// End-to-end test of `forkd mcp` with an independent MCP client: the
// official TypeScript SDK spawns `$FORKD_BIN mcp` over stdio and drives the
// tools against a real daemon.
//
//   eval "$(scripts/sdk-test-env.sh start mcp)"
//   cd integration/mcp-e2e && npm ci && npm test
//
// Environment: FORKD_SOCKET (the daemon), FORKD_TEST_TAG (a snapshot for
// exec and files), FORKD_TEST_PY_TAG (a snapshot with Python, for
// run_code), FORKD_BIN (default ../../bin/forkd).
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { fileURLToPath } from "node:url";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const forkdBin = process.env.FORKD_BIN || path.resolve(here, "../../bin/forkd");
const tag = process.env.FORKD_TEST_TAG;
const pyTag = process.env.FORKD_TEST_PY_TAG;

const TOOLS = [
  "branch_sandbox", "create_sandbox", "expose_port", "fork_sandboxes", "kill_sandbox", "list_files", "list_sandboxes",
  "list_snapshots", "read_file", "run_code", "run_command", "write_file",
];

// A 2x2 PNG made in pure Python (the test snapshot has no matplotlib), shown
// as the cell's result through _repr_png_.
const PNG_CODE = `import struct, zlib
def _png(w=2, h=2):
    raw = b"".join(b"\\x00" + b"\\xff\\x00\\x00" * w for _ in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
class Img:
    def _repr_png_(self):
        return _png()
Img()
`;

function textOf(result) {
  return result.content.filter((c) => c.type === "text").map((c) => c.text).join("\n");
}

// call invokes a tool and fails on a protocol error; tool errors are
// returned (isError) for the test to check.
async function call(client, name, args) {
  return client.callTool({ name, arguments: args }, undefined, { timeout: 120_000 });
}

async function callOK(client, name, args) {
  const res = await call(client, name, args);
  assert.ok(!res.isError, `${name}: tool error: ${textOf(res)}`);
  return res;
}

test("forkd mcp over stdio with the TypeScript SDK", { timeout: 300_000 }, async (t) => {
  for (const [name, value] of Object.entries({ FORKD_SOCKET: process.env.FORKD_SOCKET, FORKD_TEST_TAG: tag, FORKD_TEST_PY_TAG: pyTag })) {
    assert.ok(value, `${name} is not set: start a daemon with eval "$(scripts/sdk-test-env.sh start mcp)"`);
  }

  // The child gets the FORKD_* settings (socket, run and data dirs) and
  // never starts a daemon of its own.
  const env = { FORKD_NO_AUTOSTART: "1" };
  for (const [k, v] of Object.entries(process.env)) {
    if (k.startsWith("FORKD_")) env[k] = v;
  }
  let stderr = "";
  const transport = new StdioClientTransport({ command: forkdBin, args: ["mcp"], env, stderr: "pipe" });
  transport.stderr?.on("data", (d) => { stderr += d; });
  const client = new Client({ name: "forkd-mcp-e2e", version: "0.0.0" });
  try {
    await client.connect(transport);
  } catch (err) {
    throw new Error(`connect to ${forkdBin} mcp: ${err.message}\nstderr: ${stderr}`);
  }
  const created = [];
  t.after(async () => {
    if (created.length > 0) {
      await call(client, "kill_sandbox", { sandbox_ids: created }).catch(() => {});
    }
    await client.close();
  });

  await t.test("initialize and list tools", async () => {
    assert.equal(client.getServerVersion()?.name, "forkd");
    const { tools } = await client.listTools();
    assert.deepEqual(tools.map((x) => x.name).sort(), TOOLS);
    const run = tools.find((x) => x.name === "run_command");
    assert.deepEqual(run.inputSchema.required, ["sandbox_id"]);
    assert.equal(run.inputSchema.properties.argv.type, "array");
    assert.equal(run.inputSchema.properties.shell.type, "string");
    assert.ok(run.outputSchema?.properties?.exit_code, "run_command has an output schema");
    for (const tool of tools) {
      assert.ok(tool.description.length > 40, `${tool.name} is described`);
    }
  });

  let id;
  await t.test("create_sandbox", async () => {
    const res = await callOK(client, "create_sandbox", { tag, timeout_seconds: 300, metadata: { suite: "mcp-e2e" } });
    id = res.structuredContent.id;
    assert.match(id, /^sb-/);
    created.push(id);
    assert.equal(res.structuredContent.tag, tag);
    assert.equal(res.structuredContent.state, "running");
    assert.ok(textOf(res).includes(id));
  });

  await t.test("run_command with argv and with a shell line", async () => {
    let res = await callOK(client, "run_command", { sandbox_id: id, argv: ["echo", "hello", "$HOME", "a b"] });
    assert.equal(res.structuredContent.exit_code, 0);
    assert.equal(res.structuredContent.stdout, "hello $HOME a b\n"); // argv is not given to a shell
    assert.match(textOf(res), /Exited with code 0/);

    res = await callOK(client, "run_command", { sandbox_id: id, shell: "echo $((20+22)); echo err >&2; exit 7" });
    assert.equal(res.structuredContent.exit_code, 7); // a failure of the command, not of the tool
    assert.equal(res.structuredContent.stdout, "42\n");
    assert.equal(res.structuredContent.stderr, "err\n");
    assert.match(textOf(res), /Exited with code 7/);
  });

  await t.test("write_file, read_file, list_files", async () => {
    const content = "written by the TypeScript SDK\n";
    let res = await callOK(client, "write_file", { sandbox_id: id, path: "/tmp/e2e/note.txt", content });
    assert.equal(res.structuredContent.size, content.length);
    res = await callOK(client, "read_file", { sandbox_id: id, path: "/tmp/e2e/note.txt" });
    assert.equal(textOf(res), content);
    assert.equal(res.structuredContent.encoding, "text");
    res = await callOK(client, "list_files", { sandbox_id: id, path: "/tmp/e2e" });
    assert.deepEqual(res.structuredContent.entries.map((e) => e.name), ["note.txt"]);
  });

  await t.test("paths with shell metacharacters are taken literally", async () => {
    const odd = "/tmp/e2e-odd/$(touch pwned); x `id` *.txt";
    await callOK(client, "write_file", { sandbox_id: id, path: odd, content: "odd\n" });
    let res = await callOK(client, "read_file", { sandbox_id: id, path: odd });
    assert.equal(textOf(res), "odd\n");
    res = await callOK(client, "list_files", { sandbox_id: id, path: "/tmp/e2e-odd" });
    assert.deepEqual(res.structuredContent.entries.map((e) => e.name), ["$(touch pwned); x `id` *.txt"]);
    // Nothing was run: no file named pwned appeared anywhere it could have.
    res = await callOK(client, "run_command", { sandbox_id: id, argv: ["ls", "-a", "/", "/tmp", "/root"] });
    assert.doesNotMatch(res.structuredContent.stdout, /pwned/);
  });

  await t.test("errors are tool results", async () => {
    let res = await call(client, "run_command", { sandbox_id: "sb-doesnotexist", argv: ["true"] });
    assert.equal(res.isError, true);
    assert.match(textOf(res), /not_found/);
    res = await call(client, "run_command", { sandbox_id: id, argv: ["ls"], shell: "ls" });
    assert.equal(res.isError, true);
    assert.match(textOf(res), /not both/);
  });

  let pyID;
  await t.test("run_code in a Python sandbox, with an image", async () => {
    let res = await callOK(client, "create_sandbox", { tag: pyTag, timeout_seconds: 300, metadata: { suite: "mcp-e2e" } });
    pyID = res.structuredContent.id;
    created.push(pyID);
    res = await callOK(client, "run_code", { sandbox_id: pyID, code: "import math\nprint('pi is')\nround(math.pi, 3)" });
    assert.equal(res.structuredContent.stdout, "pi is\n");
    assert.equal(res.structuredContent.result["text/plain"], "3.142");

    res = await callOK(client, "run_code", { sandbox_id: pyID, code: "1/0" });
    assert.equal(res.structuredContent.error.name, "ZeroDivisionError");
    assert.match(textOf(res), /ZeroDivisionError/);

    res = await callOK(client, "run_code", { sandbox_id: pyID, code: PNG_CODE });
    const images = res.content.filter((c) => c.type === "image");
    assert.equal(images.length, 1, `one image, got ${JSON.stringify(res.content).slice(0, 300)}`);
    assert.equal(images[0].mimeType, "image/png");
    const png = Buffer.from(images[0].data, "base64");
    assert.deepEqual([...png.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47]);
  });

  await t.test("kill_sandbox", async () => {
    const res = await callOK(client, "kill_sandbox", { sandbox_ids: [id, pyID] });
    assert.deepEqual([...res.structuredContent.killed].sort(), [id, pyID].sort());
    created.length = 0;
    const list = await callOK(client, "list_sandboxes", { metadata: { suite: "mcp-e2e" }, state: "running" });
    assert.deepEqual(list.structuredContent.sandboxes.filter((s) => s.id === id || s.id === pyID), []);
  });
});
