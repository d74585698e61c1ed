// sb.runCode against the real daemon (a snapshot with a warmed Python session).
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { Execution, Result, ExecutionError, TimeoutError, InvalidArgumentError } from "forkd";
import { PY_TAG, needsPython, Tracker, gate } from "./helpers/env.mjs";

// A 1x1 PNG, base64.
const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

describe("runCode", needsPython, () => {
  const t = new Tracker();
  let sb;
  before(async () => {
    sb = await t.create(PY_TAG);
  });
  after(() => t.cleanup());

  test("the last expression is the main result; variables persist", async () => {
    const ex = await sb.runCode("x = 20\nx + 22");
    assert.ok(ex instanceof Execution);
    assert.equal(ex.text, "42");
    assert.equal(ex.results.length, 1);
    const r = ex.results[0];
    assert.ok(r instanceof Result);
    assert.equal(r.isMainResult, true);
    assert.deepEqual(r.formats(), ["text"]);
    assert.equal(ex.error, undefined);
    assert.equal(typeof ex.durationMs, "number");
    assert.equal((await sb.runCode("x * 2")).text, "40");
  });

  test("no result for a statement or None", async () => {
    assert.deepEqual((await sb.runCode("y = 1")).results, []);
    assert.equal((await sb.runCode("None")).text, undefined);
  });

  test("stdout and stderr as logs, streamed to callbacks as printed", async () => {
    const seen = [];
    // The code goes on past "one" once "one" reached the callback, which
    // opens the gate with a command: streamed, however slow the host.
    const g = gate();
    const opened = [];
    const ex = await sb.runCode(
      "import os, sys, time\nprint('one')\nsys.stdout.flush()\nend = time.time() + 60\n" +
        `while not os.path.exists('${g.path}'):\n` +
        "    if time.time() > end: raise TimeoutError('one was not streamed while the code ran')\n" +
        "    time.sleep(0.02)\nprint('two', file=sys.stderr)\n'done'",
      {
        onStdout: (s) => {
          seen.push(["out", s]);
          opened.push(sb.commands.run(["touch", g.path]));
        },
        onStderr: (s) => seen.push(["err", s]),
      },
    );
    await Promise.all(opened);
    assert.equal(ex.error, undefined, ex.error?.value);
    assert.equal(ex.stdout, "one\n");
    assert.equal(ex.stderr, "two\n");
    // Chunks are as the guest wrote them, not lines: print() writes the
    // text and its newline separately, which a loaded host may send as
    // two events. What counts is the text per stream, and its order.
    assert.equal(ex.logs.stdout.join(""), "one\n");
    const text = (k) => seen.filter(([s]) => s === k).map(([, t]) => t).join("");
    assert.equal(text("out"), "one\n");
    assert.equal(text("err"), "two\n");
    assert.ok(seen.findIndex(([s]) => s === "err") > seen.findLastIndex(([s]) => s === "out"), JSON.stringify(seen));
    assert.equal(ex.text, "'done'");
  });

  test("an exception is execution.error, not a rejection", async () => {
    const ex = await sb.runCode("print('before')\n1/0");
    assert.ok(ex.error instanceof ExecutionError);
    assert.equal(ex.error.name, "ZeroDivisionError");
    assert.match(ex.error.value, /division by zero/);
    assert.match(ex.error.traceback, /ZeroDivisionError/);
    assert.equal(ex.stdout, "before\n");
    assert.deepEqual(ex.results, []);
  });

  test("rich results: text/html from _repr_html_ (as DataFrames have)", async () => {
    const ex = await sb.runCode(
      "class Table:\n  def _repr_html_(self): return '<table><tr><td>1</td></tr></table>'\n  def __repr__(self): return 'Table()'\nTable()",
    );
    const r = ex.results[0];
    assert.equal(r.isMainResult, true);
    assert.equal(r.html, "<table><tr><td>1</td></tr></table>");
    assert.equal(r.text, "Table()");
    assert.deepEqual(r.formats().sort(), ["html", "text"]);
    assert.deepEqual(r.toJSON(), { isMainResult: true, html: "<table><tr><td>1</td></tr></table>", text: "Table()" });
  });

  test("display() outputs come in order before the main result; image/png is base64", async () => {
    const onResult = [];
    const ex = await sb.runCode(
      [
        "import base64",
        `class Img:\n  def _repr_png_(self): return base64.b64decode('${PNG}')\n  def __repr__(self): return 'Img()'`,
        "display('first')",
        "display(Img())",
        "'main'",
      ].join("\n"),
      { onResult: (r) => onResult.push(r) },
    );
    assert.deepEqual(ex.results.map((r) => [r.isMainResult, r.text]), [[false, "'first'"], [false, "Img()"], [true, "'main'"]]);
    assert.equal(ex.results[1].png, PNG);
    assert.ok(ex.results[1].formats().includes("png"));
    assert.equal(onResult.length, 3);
    assert.equal(ex.text, "'main'");
  });

  test("timeoutMs interrupts the code with TimeoutError; the session survives", async () => {
    await sb.runCode("kept = 'yes'");
    const t0 = Date.now();
    // Seconds: "started" is out before the timeout on a loaded host too.
    await assert.rejects(sb.runCode("import time\nprint('started')\ntime.sleep(30)", { timeoutMs: 3000 }), (err) => {
      assert.ok(err instanceof TimeoutError, `${err.name}: ${err.message}`);
      assert.equal(err.code, "deadline_exceeded");
      assert.ok(err.execution instanceof Execution);
      assert.equal(err.execution.stdout, "started\n");
      return true;
    });
    assert.ok(Date.now() - t0 < 25_000, "as long as the sleep");
    assert.equal((await sb.runCode("kept")).text, "'yes'");
  });

  test("an AbortSignal interrupts the code; the session survives", async () => {
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 300);
    await assert.rejects(sb.runCode("import time\ntime.sleep(30)", { signal: ac.signal }), (err) => err.name === "AbortError");
    assert.equal((await sb.runCode("1 + 1")).text, "2");
  });

  test("only Python is supported", async () => {
    await assert.rejects(sb.runCode("1", { language: "javascript" }), InvalidArgumentError);
  });

  test("concurrent calls queue in the one session", async () => {
    const outs = await Promise.all([0, 1, 2, 3].map((i) => sb.runCode(`import time\ntime.sleep(0.05)\n${i} * 10`)));
    assert.deepEqual(outs.map((e) => e.text), ["0", "10", "20", "30"]);
  });
});
