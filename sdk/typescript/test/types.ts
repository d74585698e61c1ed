// Compile-time checks of the published declarations (npm test runs
// `tsc -p test/tsconfig.json`); nothing here runs.
import { Readable } from "node:stream";
import {
  Client,
  Sandbox,
  CommandExitError,
  CommandHandle,
  ConflictError,
  Execution,
  ForkdError,
  NotFoundError,
  RateLimitedError,
  StreamCutError,
  TimeoutError,
  UnavailableError,
  type BranchResult,
  type BuildContextInput,
  type CommandEvent,
  type CommandResult,
  type EntryInfo,
  type ProcessInfo,
  type SandboxInfo,
  type SnapshotInfo,
} from "forkd";

export async function typesOfTheApi(): Promise<void> {
  const sb: Sandbox = await Sandbox.create("tag", { timeoutS: 60, metadata: { a: "b" }, socket: "/run/forkd/forkd.sock" });
  const many: Sandbox[] = await Sandbox.fork("tag", 3, { idleTimeoutS: 30 });
  const again: Sandbox = await Sandbox.connect(sb.id, { client: new Client({ host: "https://h:7443", token: "t", caCert: "/ca.pem" }) });
  const info: SandboxInfo = await sb.info();
  const term: CommandHandle = await sb.pty.create({ rows: 24, cols: 80, onData: (d: Uint8Array) => void d, timeoutMs: 0 });
  await sb.pty.sendInput(term.pid ?? 0, new Uint8Array([3]));
  await sb.pty.resize(term.pid ?? 0, { rows: 40, cols: 120 });
  const killedTerm: boolean = await sb.pty.kill(term.pid ?? 0);
  void killedTerm;
  const state: string = info.state;
  const expires: Date | undefined = info.expiresAt;

  const r: CommandResult = await sb.commands.run("echo hi", { envs: { A: "1" }, cwd: "/tmp", timeoutMs: 1000, onStdout: (s: string) => void s });
  const code: number = r.exitCode;
  const argv: CommandResult = await sb.commands.run(["ls", "-l"], { stdin: Readable.from(["x"]), check: false });
  const h: CommandHandle = await sb.commands.run("sleep 10", { background: true, stdin: true });
  await h.sendStdin("data");
  await h.closeStdin();
  const killed: boolean = await h.kill();
  const pid: number | undefined = h.pid;
  const procs: ProcessInfo[] = await sb.commands.list();
  const open: boolean = procs[0]!.stdinOpen;
  await sb.commands.sendStdin(procs[0]!.pid, new Uint8Array(1));
  await sb.commands.closeStdin(procs[0]!.pid);
  const signalled: boolean = await sb.commands.kill(procs[0]!.pid, "SIGTERM");
  void pid, open, signalled;
  const waited: CommandResult = await h.wait();
  for await (const ev of sb.commands.stream("ls")) {
    const e: CommandEvent = ev;
    if (e.type === "exit") {
      const t: boolean = e.timedOut;
      void t;
    } else {
      const d: Buffer = e.data;
      void d;
    }
  }

  const text: string = await sb.files.read("/f");
  const bytes: Uint8Array = await sb.files.read("/f", { format: "bytes" });
  const stream: Readable = await sb.files.read("/f", { format: "stream" });
  const written: EntryInfo = await sb.files.write("/f", new Uint8Array(3), { mode: 0o600 });
  const several: EntryInfo[] = await sb.files.write([{ path: "/a", data: "x" }]);
  const list: EntryInfo[] = await sb.files.list("/");
  const exists: boolean = await sb.files.exists("/f");
  const created: boolean = await sb.files.makeDir("/d");
  await sb.files.remove("/d", { recursive: true });

  const ex: Execution = await sb.runCode("1 + 1", { timeoutMs: 5000, onResult: (res) => void res.png });
  const main: string | undefined = ex.text;
  const formats: string[] = ex.results[0]!.formats();
  const err: string | undefined = ex.error?.traceback;

  const b: BranchResult = await sb.branch({ tag: "t2", mode: "diff", wait: false });
  const ready: SnapshotInfo = await b.waitReady({ timeoutMs: 1000 });
  const pause: number = b.pauseMs + b.bytesWritten;

  const c = new Client();
  const snaps: SnapshotInfo[] = await c.snapshots.list();
  const snap: SnapshotInfo = await c.snapshots.create({ tag: "x", recipe: "minimal", onProgress: (m: string) => void m });
  const ctx: BuildContextInput = { "app/req.txt": "requests\n", "app/bin": new Uint8Array([1]) };
  const built: SnapshotInfo = await c.snapshots.create({ tag: "y", dockerfile: "FROM x\n", name: "app", buildArgs: { V: "2" }, context: ctx, buildNetwork: "public" });
  await c.snapshots.startCreate({ tag: "z", from: "registry.example.com/python:3.12-slim", insecureRegistry: true, context: "./app" });
  await c.snapshots.startCreate({ tag: "z", from: "registry.example.com/team/py:3.12", registryUsername: "u", registryPassword: "p" });
  await Sandbox.create("registry.example.com/team/py:3.12", { pullPolicy: "always", registryUsername: "u", registryPassword: "p" });
  await c.sandboxes.fork("registry.example.com/team/py:3.12", 2, { registryUsername: "u", registryPassword: "p" });
  await c.snapshots.delete("x", { cascade: true });
  const packed: { bytes: number } = await c.snapshots.pack("x", "/tmp/x.tar.zst", { image: false });
  const unpacked: SnapshotInfo = await c.snapshots.unpack("/tmp/x.tar.zst", { tag: "y", force: true });
  const sbs: SandboxInfo[] = await c.sandboxes.list({ tag: "x", state: "running", metadata: { a: "b" } });
  const v: string = (await c.version()).version;
  const ok: string = (await c.health()).status;

  await using disposable = await Sandbox.create("tag");
  void disposable;

  try {
    await sb.kill();
  } catch (e) {
    if (e instanceof RateLimitedError) {
      const after: number | undefined = e.retryAfter;
      void after;
    } else if (e instanceof CommandExitError) {
      const out: string = e.stdout + e.stderr + e.exitCode;
      void out;
    } else if (e instanceof ForkdError) {
      const id: string | undefined = e.requestId;
      const st: number | undefined = e.status;
      void [id, st, e.code, e.detail, e.problem];
    }
    void [NotFoundError, ConflictError, TimeoutError, UnavailableError, StreamCutError];
  }

  void [many, again, state, expires, code, argv, killed, waited, text, bytes, stream, written, several, list, exists, created];
  void [main, formats, err, ready, pause, snaps, snap, built, packed, unpacked, sbs, v, ok];
}
