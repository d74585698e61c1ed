// sb.commands against the real daemon.
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { Readable } from "node:stream";
import {
  CommandExitError,
  CommandHandle,
  NotFoundError,
  StreamCutError,
  TimeoutError,
  ForkdError,
} from "forkd";
import { TAG, needsDaemon, Tracker, sleep, until, within, gate } from "./helpers/env.mjs";

describe("commands", needsDaemon, () => {
  const t = new Tracker();
  let sb;
  before(async () => {
    sb = await t.create(TAG);
  });
  after(() => t.cleanup());

  test("run a shell string: stdout, stderr, exitCode", async () => {
    const r = await sb.commands.run("echo hello; echo oops >&2");
    assert.equal(r.stdout, "hello\n");
    assert.equal(r.stderr, "oops\n");
    assert.equal(r.exitCode, 0);
    assert.equal(typeof r.durationMs, "number");
  });

  test("argv is never run through a shell", async () => {
    const r = await sb.commands.run(["echo", "$HOME", "a;b", "`id`", "it's"]);
    assert.equal(r.stdout, "$HOME a;b `id` it's\n");
  });

  test("envs and cwd", async () => {
    const r = await sb.commands.run("echo $GREETING; pwd", { envs: { GREETING: "hi there" }, cwd: "/tmp" });
    assert.equal(r.stdout, "hi there\n/tmp\n");
  });

  test("non-ASCII in the command survives the trip", async () => {
    const r = await sb.commands.run(["echo", "héllo wörld ✓ 🚀"]);
    assert.equal(r.stdout, "héllo wörld ✓ 🚀\n");
  });

  test("a non-zero exit rejects with CommandExitError carrying the output", async () => {
    await assert.rejects(sb.commands.run("echo out; echo bad >&2; exit 7"), (err) => {
      assert.ok(err instanceof CommandExitError);
      assert.ok(err instanceof ForkdError);
      assert.equal(err.exitCode, 7);
      assert.equal(err.stdout, "out\n");
      assert.equal(err.stderr, "bad\n");
      assert.match(err.message, /exited with code 7: bad/);
      assert.deepEqual(err.result, { stdout: "out\n", stderr: "bad\n", exitCode: 7 });
      return true;
    });
  });

  test("a missing executable or cwd is a NotFoundError with the agent's message", async () => {
    await assert.rejects(sb.commands.run(["no-such-binary"]), (err) => {
      assert.ok(err instanceof NotFoundError, `${err.name}: ${err.message}`);
      assert.match(err.message, /no-such-binary/);
      return true;
    });
    await assert.rejects(sb.commands.run("pwd", { cwd: "/no/such/dir" }), NotFoundError);
    // Through a shell it is the shell's exit code 127, as in a terminal.
    await assert.rejects(sb.commands.run("no-such-binary"), (err) => err instanceof CommandExitError && err.exitCode === 127);
  });

  test("timeoutMs kills the process group and rejects with TimeoutError", async () => {
    const t0 = Date.now();
    await assert.rejects(sb.commands.run("sleep 30", { timeoutMs: 300 }), (err) => {
      assert.ok(err instanceof TimeoutError, `${err.name}: ${err.message}`);
      assert.match(err.message, /timed out after 300 ms/);
      return true;
    });
    assert.ok(Date.now() - t0 < 25_000, "took too long: as long as the sleep");
    // The sandbox is still fine.
    assert.equal((await sb.commands.run("echo ok")).stdout, "ok\n");
  });

  test("onStdout and onStderr see output as it happens", async () => {
    const events = [];
    // Each line is printed once the one before it reached its callback,
    // which opens the gate: streamed, in order, however slow the host.
    const g1 = gate();
    const g2 = gate();
    const opened = [];
    const r = await sb.commands.run(`echo one; ${g1.wait}; echo two >&2; ${g2.wait}; echo three`, {
      onStdout: (s) => {
        events.push(["out", s]);
        if (s.includes("one")) opened.push(sb.commands.run(["touch", g1.path]));
      },
      onStderr: (s) => {
        events.push(["err", s]);
        opened.push(sb.commands.run(["touch", g2.path]));
      },
    });
    await Promise.all(opened);
    assert.deepEqual(events, [["out", "one\n"], ["err", "two\n"], ["out", "three\n"]]);
    assert.equal(r.stdout, "one\nthree\n");
  });

  test("stdin: string, bytes, Readable and async iterable", async () => {
    assert.equal((await sb.commands.run("cat", { stdin: "from a string\n" })).stdout, "from a string\n");
    assert.equal((await sb.commands.run("wc -c", { stdin: new Uint8Array(1000) })).stdout.trim(), "1000");
    assert.equal((await sb.commands.run(["tr", "a-z", "A-Z"], { stdin: Readable.from(["abc", "def\n"]) })).stdout, "ABCDEF\n");
    async function* gen() {
      for (let i = 0; i < 3; i++) {
        yield Buffer.from(`line ${i}\n`);
        await sleep(20);
      }
    }
    assert.equal((await sb.commands.run("cat -n", { stdin: gen() })).stdout.replace(/[ \t]+/g, " "), " 1 line 0\n 2 line 1\n 3 line 2\n");
  });

  test("a process that exits before reading its stdin does not hang", async () => {
    const big = Readable.from((function* () {
      for (let i = 0; i < 200; i++) yield Buffer.alloc(64 * 1024, 120);
    })());
    const r = await sb.commands.run("echo done", { stdin: big, timeoutMs: 20_000 });
    assert.equal(r.stdout, "done\n");
    // The connection pool is still healthy afterwards.
    assert.equal((await sb.commands.run("echo next")).stdout, "next\n");
  });

  test("stream() yields stdout/stderr then the exit event, whatever the code", async () => {
    const seen = [];
    // b is written once a arrived: the order holds however slow the host.
    const g = gate();
    for await (const ev of sb.commands.stream(`printf a; ${g.wait}; printf b >&2; exit 3`)) {
      seen.push(ev.type === "exit" ? ["exit", ev.exitCode, ev.timedOut] : [ev.type, ev.data.toString()]);
      if (ev.type === "stdout") await sb.commands.run(["touch", g.path]);
    }
    assert.deepEqual(seen, [["stdout", "a"], ["stderr", "b"], ["exit", 3, false]]);
  });

  test("stream() reports a timeout on the exit event", async () => {
    let last;
    for await (const ev of sb.commands.stream("sleep 30", { timeoutMs: 300 })) last = ev;
    assert.equal(last.type, "exit");
    assert.equal(last.timedOut, true);
    assert.equal(last.signal, "SIGKILL");
  });

  test("breaking out of stream() kills the command", async () => {
    await sb.files.remove("/tmp/stream-marker").catch(() => {});
    const cmd = "echo started; sleep 30; touch /tmp/stream-marker";
    for await (const ev of sb.commands.stream(cmd)) {
      assert.equal(ev.type, "stdout");
      break;
    }
    // Killed: it leaves the process table long before it would have
    // touched the marker (a command left running would touch it first).
    await until(async () => !(await sb.commands.list()).some((p) => p.cmd === cmd), "the command to end");
    assert.equal(await sb.files.exists("/tmp/stream-marker"), false);
  });

  test("background: handle with output so far, wait(), exit codes", async () => {
    // It runs on until the test opens the gate, however slow the host.
    const g = gate();
    const h = await sb.commands.run(`echo first; ${g.wait}; echo second`, { background: true });
    assert.ok(h instanceof CommandHandle);
    assert.equal(h.exitCode, undefined);
    await until(() => h.stdout.includes("first"), "first");
    assert.equal(h.stdout, "first\n");
    assert.equal(h.exitCode, undefined);
    await sb.commands.run(["touch", g.path]);
    const r = await h.wait();
    assert.equal(r.stdout, "first\nsecond\n");
    assert.equal(h.exitCode, 0);

    const bad = await sb.commands.run("exit 4", { background: true });
    await assert.rejects(bad.wait(), (err) => err instanceof CommandExitError && err.exitCode === 4);
  });

  test("background: kill() stops the process group", async () => {
    const h = await sb.commands.run("sh -c 'sleep 20; touch /tmp/bg-marker' & echo $!; sleep 30", { background: true });
    await until(() => /^\d+\n/.test(h.stdout), "the child's pid");
    const child = h.stdout.trim();
    assert.equal(await h.kill(), true);
    await assert.rejects(h.wait(), (err) => err instanceof CommandExitError && err.exitCode === 137 && err.signal === "SIGKILL");
    assert.equal(await h.kill(), false);
    // The child ends long before it would touch the marker: killed with
    // the group (a child left running would touch it first).
    const gone = async () => (await sb.commands.run(["sh", "-c", `[ -e /proc/${child} ] && echo alive || echo gone`])).stdout === "gone\n";
    await until(gone, "the child of the killed command to end");
    assert.equal(await sb.files.exists("/tmp/bg-marker"), false, "a child of the killed command survived");
  });

  test("background: interactive stdin with sendStdin/closeStdin", async () => {
    const lines = [];
    const h = await sb.commands.run("while read l; do echo got:$l; done; echo eof", {
      background: true,
      stdin: true,
      onStdout: (s) => lines.push(s),
    });
    await h.sendStdin("one\n");
    // The answer comes while stdin is still open: full duplex.
    await until(() => h.stdout.includes("got:one"), "got:one");
    assert.equal(h.stdout, "got:one\n");
    await h.sendStdin(new TextEncoder().encode("two\n"));
    await h.closeStdin();
    const r = await h.wait();
    assert.equal(r.stdout, "got:one\ngot:two\neof\n");
  });

  test("process control: pid, list(), sendStdin by pid, kill by pid", async () => {
    const cat = await sb.commands.run("cat", { background: true, stdin: true });
    const sleeper = await sb.commands.run(["sleep", "61"], { background: true });
    assert.ok(Number.isInteger(cat.pid) && cat.pid > 0);
    const procs = new Map((await sb.commands.list()).map((p) => [p.pid, p]));
    const p = procs.get(cat.pid);
    assert.ok(p, "the background command is listed");
    assert.equal(p.cmd, "cat");
    assert.deepEqual(p.argv, ["/bin/sh", "-c", "cat"]);
    assert.equal(p.stdinOpen, true);
    assert.ok(p.started instanceof Date && !Number.isNaN(p.started.getTime()));
    assert.deepEqual(procs.get(sleeper.pid)?.argv, ["sleep", "61"]);
    assert.equal(procs.get(sleeper.pid)?.stdinOpen, false);

    // The same stdin through the handle and through commands.
    await sb.commands.sendStdin(cat.pid, "a\n");
    await cat.sendStdin("b\n");
    await sb.commands.closeStdin(cat.pid);
    await cat.closeStdin(); // twice is fine
    const r = await cat.wait();
    assert.equal(r.stdout, "a\nb\n");
    assert.equal(r.pid, cat.pid);
    await assert.rejects(cat.sendStdin("late"), NotFoundError);

    // stdin was not kept open for the sleeper: a conflict.
    await assert.rejects(sb.commands.sendStdin(sleeper.pid, "x"), (err) => err instanceof ForkdError && err.status === 409);
    assert.equal(await sb.commands.kill(sleeper.pid, "SIGTERM"), true);
    await assert.rejects(sleeper.wait(), (err) => err instanceof CommandExitError && err.exitCode === 143 && err.signal === "SIGTERM");
    assert.equal(await sb.commands.kill(sleeper.pid), false, "an exited command is not found");
    const left = (await sb.commands.list()).map((q) => q.pid);
    assert.ok(!left.includes(cat.pid) && !left.includes(sleeper.pid));
    await assert.rejects(sb.commands.sendStdin(0, "x"), (err) => err instanceof ForkdError && err.code === "invalid_argument");
  });

  test("concurrency: many commands at once on two sandboxes", async () => {
    const other = await t.create(TAG);
    const jobs = [];
    for (let i = 0; i < 24; i++) {
      const box = i % 2 ? sb : other;
      jobs.push(box.commands.run(["sh", "-c", `echo ${i}; hostname`]).then((r) => [i, r.stdout]));
    }
    const results = await Promise.all(jobs);
    for (const [i, out] of results) {
      assert.equal(out.split("\n")[0], String(i));
    }
    const hosts = new Set(results.map(([, out]) => out.split("\n")[1]));
    assert.equal(hosts.size, 2, "both sandboxes answered, each with its own hostname");
    await other.kill();
  });

  test("large output is complete", async () => {
    const r = await sb.commands.run("head -c 3000000 /dev/zero | tr '\\0' x");
    assert.equal(r.stdout.length, 3_000_000);
  });

  test("an AbortSignal kills the command", async () => {
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 300);
    await assert.rejects(sb.commands.run("sleep 30", { signal: ac.signal }), (err) => err.name === "AbortError");
    assert.equal((await sb.commands.run("echo alive")).stdout, "alive\n");
  });

  test("sandbox killed during a streamed exec: StreamCutError, never success", async () => {
    const victim = await t.create(TAG);
    // Settle-catch at once: these reject while the test awaits the kill.
    let runOut, streamOut;
    const runStarted = new Promise((r) => (runOut = r));
    const streamStarted = new Promise((r) => (streamOut = r));
    const run = victim.commands.run("echo started; sleep 30; echo never", { timeoutMs: 60_000, onStdout: () => runOut() }).then(
      (r) => ({ ok: r }),
      (err) => ({ err }),
    );
    const streamed = (async () => {
      const seen = [];
      for await (const ev of victim.commands.stream("echo s; sleep 30")) {
        seen.push(ev.type);
        streamOut();
      }
      return seen;
    })().then(
      (r) => ({ ok: r }),
      (err) => ({ err }),
    );
    const bg = await victim.commands.run("sleep 30", { background: true });
    // Killed once each command runs (its output arrived; bg's start came
    // with its answer), however slow the host.
    await within(Promise.all([Promise.race([runStarted, run]), Promise.race([streamStarted, streamed])]), "the commands to start");
    await victim.kill();
    const t0 = Date.now();
    const check = ({ ok, err }) => {
      assert.equal(ok, undefined, "a cut command resolved");
      assert.ok(err instanceof StreamCutError, `${err?.name}: ${err?.message}`);
      assert.match(err.message, new RegExp(victim.id));
      assert.match(err.message, /killed|gone/);
    };
    check(await run);
    check(await streamed);
    check(await bg.wait().then((r) => ({ ok: r }), (err) => ({ err })));
    assert.ok(Date.now() - t0 < 25_000, "cut as late as the sleeps end");
  });
});
