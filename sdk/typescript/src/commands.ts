import type { Readable } from "node:stream";
import { StringDecoder } from "node:string_decoder";
import { ndjson, type Answer, type BodySource } from "./connection.js";
import {
  CommandExitError,
  ConflictError,
  ForkdError,
  InvalidArgumentError,
  NotFoundError,
  StreamCutError,
  TimeoutError,
  codeFromMessage,
  errorClassFor,
} from "./errors.js";
import type { SandboxContext } from "./internal.js";
import type { CallOptions } from "./client.js";
import { processFromWire, type ProcessInfo } from "./types.js";

/** Input for a process's stdin: sent as it is read, then stdin is closed. */
export type StdinSource = string | Uint8Array | Readable | AsyncIterable<Uint8Array | string>;

export interface CommandOptions {
  /** Environment variables, added to the sandbox's. */
  envs?: Record<string, string>;
  /** Working directory (absolute path in the sandbox). */
  cwd?: string;
  /**
   * Kill the command's whole process group after this many ms; 0 means no
   * limit. Default 60000 for run() and stream(), no limit for background
   * commands. A command that times out rejects with {@link TimeoutError}.
   */
  timeoutMs?: number;
  /** Called with each piece of stdout as it arrives (UTF-8 text). */
  onStdout?: (data: string) => void;
  /** Called with each piece of stderr as it arrives (UTF-8 text). */
  onStderr?: (data: string) => void;
  /** Data for the process's stdin; without it stdin is /dev/null. */
  stdin?: StdinSource;
  /** Aborting disconnects, which kills the command's process group. */
  signal?: AbortSignal;
  /**
   * true (default): a non-zero exit rejects with CommandExitError and a
   * timeout with TimeoutError. false: both resolve with the result
   * (`exitCode`, `timedOut`) instead.
   */
  check?: boolean;
}

export interface RunOptions extends CommandOptions {
  background?: false;
}

export interface BackgroundOptions extends Omit<CommandOptions, "stdin"> {
  background: true;
  /**
   * As for run(), or `true` to keep stdin open: write to it with the
   * handle's sendStdin() (or commands.sendStdin(pid, ...)) and end it with
   * closeStdin(). It is closed when the command exits.
   */
  stdin?: StdinSource | true;
}

/** What a command did. */
export interface CommandResult {
  stdout: string;
  stderr: string;
  /** 0 on success; 128+N when killed by signal N (as shells report it). */
  exitCode: number;
  /** The signal that killed the process ("SIGKILL"), if one did. */
  signal?: string;
  /** How long the process ran, in ms. */
  durationMs?: number;
  /** The command ran past its timeoutMs and was killed (only seen with `check: false`). */
  timedOut: boolean;
  /** Its pid in the sandbox (undefined from an older daemon). */
  pid?: number;
}

/** One event of {@link Commands.stream}. */
export type CommandEvent =
  | { type: "stdout"; data: Buffer }
  | { type: "stderr"; data: Buffer }
  | { type: "exit"; exitCode: number; signal?: string; timedOut: boolean; durationMs?: number };

interface WireExecEvent {
  type: string;
  pid?: number;
  data?: string;
  exit_code?: number;
  signal?: string;
  timed_out?: boolean;
  error?: string;
  /** The class of error (a problem code); absent from daemons before it. */
  code?: string;
  duration_us?: number;
}

const DEFAULT_TIMEOUT_MS = 60_000;
/** How much longer than a command's own timeout the SDK waits for its exit event. */
const CLIENT_GRACE_MS = 10_000;

/** Marks a background command the caller killed. */
const KILLED = Symbol("killed");

/** Cut errors that already say what became of the sandbox. */
const described = new WeakSet<Error>();

/** Escapes non-ASCII characters so the JSON fits in an HTTP header. */
function headerJSON(v: unknown): string {
  return JSON.stringify(v).replace(/[\u007f-\uffff]/g, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
}

const isExit = (ev: WireExecEvent) => ev.type === "exit";

function exitEvent(ev: WireExecEvent): CommandEvent & { type: "exit" } {
  const out: CommandEvent & { type: "exit" } = { type: "exit", exitCode: ev.exit_code ?? 0, timedOut: !!ev.timed_out };
  if (ev.signal) out.signal = ev.signal;
  if (ev.duration_us !== undefined) out.durationMs = ev.duration_us / 1000;
  return out;
}

/**
 * Processes in a sandbox: `sb.commands`.
 *
 * `run()` resolves with the {@link CommandResult} when the command exits
 * with 0 and rejects with {@link CommandExitError} (which carries stdout,
 * stderr and exitCode) when it exits otherwise, as E2B's SDK does; a
 * command past its `timeoutMs` rejects with {@link TimeoutError}. `stream()`
 * instead yields every event, the exit event last, whatever the exit code.
 */
export class Commands {
  /** @internal */
  constructor(private readonly ctx: SandboxContext) {}

  /**
   * Runs a command and waits for it. `cmd` is a shell command line (run with
   * `/bin/sh -c`) or an argv array (executed directly, never through a shell).
   * With `background: true` it resolves as soon as the command started, with
   * a {@link CommandHandle}.
   */
  run(cmd: string | readonly string[], opts: BackgroundOptions): Promise<CommandHandle>;
  run(cmd: string | readonly string[], opts?: RunOptions): Promise<CommandResult>;
  async run(cmd: string | readonly string[], opts: RunOptions | BackgroundOptions = {}): Promise<CommandResult | CommandHandle> {
    if (opts.background) {
      return this.background(cmd, opts);
    }
    const timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const a = await this.start(cmd, { ...opts, timeoutMs });
    const out = new Output(opts.onStdout, opts.onStderr);
    const exit = await this.consume(a, out, timeoutMs);
    return finishResult(out, exit, timeoutMs, opts.check !== false, pidOf(a));
  }

  /**
   * Runs a command and yields its output as it happens, then its exit event
   * (whatever the exit code; `timedOut` tells a timeout). Breaking out of the
   * loop kills the command. A stream cut before the exit event (the sandbox
   * was killed, the daemon stopped) throws {@link StreamCutError}.
   */
  async *stream(cmd: string | readonly string[], opts: CommandOptions = {}): AsyncGenerator<CommandEvent, void, undefined> {
    const timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const a = await this.start(cmd, { ...opts, timeoutMs });
    const text = new Output(opts.onStdout, opts.onStderr);
    let sawExit = false;
    try {
      for await (const ev of ndjson<WireExecEvent>(a, isExit)) {
        if (ev.type === "stdout" || ev.type === "stderr") {
          const data = Buffer.from(ev.data ?? "", "base64");
          if (opts.onStdout || opts.onStderr) {
            if (ev.type === "stdout") text.stdout(data);
            else text.stderr(data);
            text.out = text.err = ""; // only the callbacks need the text here
          }
          yield { type: ev.type, data };
        } else if (ev.type === "exit") {
          if (ev.exit_code === -1 && ev.error) throw await this.execFailure(ev.error, a, ev.code);
          sawExit = true;
          text.end();
          yield exitEvent(ev);
        }
      }
      if (!sawExit) throw await this.cutError(a, undefined);
    } catch (err) {
      if (err instanceof StreamCutError && !sawExit) throw await this.cutError(a, err);
      throw err;
    } finally {
      if (!sawExit) a.abort(new ForkdError("stream closed by the caller", { code: "canceled" }));
      a.finish();
    }
  }

  /** @internal Starts a process; resolves when the daemon answered 200. */
  async start(
    cmd: string | readonly string[],
    opts: Omit<CommandOptions, "stdin"> & { stdin?: StdinSource | true; pty?: { rows: number; cols: number } },
  ): Promise<Answer> {
    const req: Record<string, unknown> = {};
    if (typeof cmd === "string") {
      req.shell = cmd;
    } else if (Array.isArray(cmd)) {
      req.argv = [...cmd];
    } else {
      throw new TypeError("cmd must be a shell command string or an argv array of strings");
    }
    if (opts.envs && Object.keys(opts.envs).length > 0) req.env = opts.envs;
    if (opts.cwd) req.cwd = opts.cwd;
    if (opts.timeoutMs && opts.timeoutMs > 0) req.timeout_ms = Math.ceil(opts.timeoutMs);
    if (opts.pty) req.pty = { rows: opts.pty.rows, cols: opts.pty.cols };
    let body: BodySource | undefined;
    if (opts.stdin === true) {
      req.stdin_open = true; // written later through .../processes/{pid}/stdin
    } else if (opts.stdin !== undefined) {
      req.stdin = true;
      body = opts.stdin as BodySource;
    }
    return this.ctx.transport.request({
      method: "POST",
      path: `/v1/sandboxes/${encodeURIComponent(this.ctx.id)}/exec`,
      headers: { "x-forkd-exec": headerJSON(req), accept: "application/x-ndjson" },
      body,
      signal: opts.signal,
      // The daemon enforces timeoutMs; this only guards against a daemon
      // that never answers.
      timeoutMs: opts.timeoutMs && opts.timeoutMs > 0 ? opts.timeoutMs + CLIENT_GRACE_MS : 0,
      what: `exec in sandbox ${this.ctx.id}`,
    });
  }

  /** @internal Reads an exec stream to its exit event. */
  async consume(a: Answer, out: Output, timeoutMs: number): Promise<CommandEvent & { type: "exit" }> {
    try {
      return await this.consumeEvents(a, out, timeoutMs);
    } catch (err) {
      // What arrived before the cut, for the caller to salvage.
      if (err instanceof StreamCutError && (err as { partial?: unknown }).partial === undefined) {
        out.end();
        Object.assign(err, { partial: { stdout: out.out, stderr: out.err } });
      }
      throw err;
    }
  }

  private async consumeEvents(a: Answer, out: Output, timeoutMs: number): Promise<CommandEvent & { type: "exit" }> {
    let exited = false;
    try {
      for await (const ev of ndjson<WireExecEvent>(a, isExit)) {
        switch (ev.type) {
          case "stdout":
            out.stdout(Buffer.from(ev.data ?? "", "base64"));
            break;
          case "stderr":
            out.stderr(Buffer.from(ev.data ?? "", "base64"));
            break;
          case "exit":
            if (ev.exit_code === -1 && ev.error) throw await this.execFailure(ev.error, a, ev.code);
            exited = true;
            out.end();
            return exitEvent(ev);
        }
      }
    } catch (err) {
      // A callback threw, or the stream failed: nobody reads on, stop the process.
      if (!exited) a.abort(err instanceof Error ? err : new Error(String(err)));
      if (err instanceof TimeoutError && timeoutMs > 0) {
        throw new TimeoutError(`command in sandbox ${this.ctx.id} gave no exit within ${timeoutMs} ms plus ${CLIENT_GRACE_MS} ms of grace; it was abandoned`, { code: "deadline_exceeded", cause: err });
      }
      if (err instanceof StreamCutError) throw await this.cutError(a, err);
      throw err;
    } finally {
      a.finish();
    }
    throw await this.cutError(a, undefined);
  }

  private async background(cmd: string | readonly string[], opts: BackgroundOptions): Promise<CommandHandle> {
    const timeoutMs = opts.timeoutMs ?? 0;
    const a = await this.start(cmd, { ...opts, timeoutMs });
    return new CommandHandle(this, a, new Output(opts.onStdout, opts.onStderr), timeoutMs, opts.check !== false);
  }

  /** The commands running in the sandbox, by pid (each from its start until its process exits). */
  async list(opts: CallOptions = {}): Promise<ProcessInfo[]> {
    const data = await this.ctx.transport.json<Record<string, unknown>[]>({
      method: "GET",
      path: `/v1/sandboxes/${encodeURIComponent(this.ctx.id)}/processes`,
      signal: opts.signal,
      what: `list processes in sandbox ${this.ctx.id}`,
    });
    return (data ?? []).map(processFromWire);
  }

  /**
   * Writes to the stdin of the running command `pid`, started with
   * `stdin: true`. Resolves once the process's stdin pipe took all of it
   * (a process that does not read holds the call). Concurrent calls are
   * written one after the other, never interleaved. Rejects with
   * NotFoundError when no such command runs, ConflictError when it was not
   * started with `stdin: true` or its stdin is closed.
   */
  async sendStdin(pid: number, data: StdinSource, opts: CallOptions = {}): Promise<void> {
    await this.writeStdin(pid, data, false, opts);
  }

  /** Closes the stdin (EOF) of the running command `pid`, started with `stdin: true`. Closing twice is fine. */
  async closeStdin(pid: number, opts: CallOptions = {}): Promise<void> {
    await this.writeStdin(pid, undefined, true, opts);
  }

  private async writeStdin(pid: number, data: StdinSource | undefined, close: boolean, opts: CallOptions): Promise<void> {
    await this.ctx.transport.json({
      method: "POST",
      path: this.processPath(pid, "stdin"),
      query: close ? { close: "true" } : undefined,
      headers: { "content-type": "application/octet-stream" },
      body: data as BodySource | undefined,
      signal: opts.signal,
      what: `${close ? "close" : "write"} stdin of process ${pid} in sandbox ${this.ctx.id}`,
    });
  }

  /**
   * Sends `signal` (a name: "SIGTERM", "TERM"; default SIGKILL) to the
   * process group of the running command `pid`. Resolves false when no such
   * command runs (it exited), as E2B's kill does.
   */
  async kill(pid: number, signal = "SIGKILL", opts: CallOptions = {}): Promise<boolean> {
    try {
      await this.ctx.transport.json({
        method: "POST",
        path: this.processPath(pid, "signal"),
        json: { signal },
        signal: opts.signal,
        what: `signal ${signal} to process ${pid} in sandbox ${this.ctx.id}`,
      });
      return true;
    } catch (err) {
      if (processGone(err)) return false;
      throw err;
    }
  }

  /** @internal */
  processPath(pid: number, sub: string): string {
    if (!Number.isSafeInteger(pid) || pid <= 0) {
      throw new InvalidArgumentError(`pid ${String(pid)}: want the positive pid a command reported (handle.pid, commands.list())`, { code: "invalid_argument" });
    }
    return `/v1/sandboxes/${encodeURIComponent(this.ctx.id)}/processes/${pid}/${sub}`;
  }

  /** An exit event with exit_code -1: the process could not start, or its stream to the agent broke. */
  private async execFailure(error: string, a: Answer, given?: string): Promise<Error> {
    const code = given ?? codeFromMessage(error) ?? "internal";
    if (code === "unavailable") {
      return this.cutError(a, new StreamCutError(error, { requestId: a.requestId }));
    }
    const Cls = errorClassFor(code);
    return new Cls(`command in sandbox ${this.ctx.id} failed: ${error}`, { code, requestId: a.requestId });
  }

  /** The error for a stream cut before its exit event, saying what became of the sandbox. */
  private async cutError(a: Answer, cause: Error | undefined): Promise<Error> {
    if (cause && (!(cause instanceof StreamCutError) || described.has(cause))) return cause;
    const fate = await this.ctx.describeFate();
    const why = cause ? `: ${cause.message}` : "";
    const err = new StreamCutError(`command in sandbox ${this.ctx.id} was cut off before it exited${fate ? ` (${fate})` : ""}${why}`, {
      requestId: a.requestId,
      cause,
    });
    described.add(err);
    return err;
  }
}

/** @internal Accumulates a command's output, decoding UTF-8 across chunks. */
export class Output {
  out = "";
  err = "";
  private readonly outDec = new StringDecoder("utf8");
  private readonly errDec = new StringDecoder("utf8");
  constructor(
    private readonly onStdout?: (data: string) => void,
    private readonly onStderr?: (data: string) => void,
    private readonly onData?: (data: Uint8Array) => void,
  ) {}
  stdout(b: Buffer): void {
    this.onData?.(b);
    const s = this.outDec.write(b);
    if (s) {
      this.out += s;
      this.onStdout?.(s);
    }
  }
  stderr(b: Buffer): void {
    const s = this.errDec.write(b);
    if (s) {
      this.err += s;
      this.onStderr?.(s);
    }
  }
  end(): void {
    const o = this.outDec.end();
    if (o) {
      this.out += o;
      this.onStdout?.(o);
    }
    const e = this.errDec.end();
    if (e) {
      this.err += e;
      this.onStderr?.(e);
    }
  }
}

/** err says the command's process is gone (it exited), not its sandbox. */
function processGone(err: unknown): boolean {
  return err instanceof NotFoundError && !err.detail.includes("no sandbox");
}

/** The pid the daemon sent with the 200 of an exec. */
function pidOf(a: Answer): number | undefined {
  const v = a.res.headers["x-forkd-pid"];
  const n = Number(Array.isArray(v) ? v[0] : v);
  return Number.isSafeInteger(n) && n > 0 ? n : undefined;
}

function finishResult(out: Output, exit: CommandEvent & { type: "exit" }, timeoutMs: number, check: boolean, pid: number | undefined): CommandResult {
  const result: CommandResult = { stdout: out.out, stderr: out.err, exitCode: exit.exitCode, timedOut: exit.timedOut };
  if (pid !== undefined) result.pid = pid;
  if (exit.signal) result.signal = exit.signal;
  if (exit.durationMs !== undefined) result.durationMs = exit.durationMs;
  if (!check) return result;
  if (exit.timedOut) {
    const err = new TimeoutError(`command timed out after ${timeoutMs} ms; its process group was killed`, { code: "deadline_exceeded" });
    Object.assign(err, { result });
    throw err;
  }
  if (result.exitCode !== 0) throw new CommandExitError(result);
  return result;
}

/**
 * A command started with `background: true`. Its output accumulates in
 * `stdout` and `stderr` (and reaches onStdout/onStderr) while it runs.
 */
export class CommandHandle {
  private readonly done: Promise<CommandResult>;
  private killed = false;
  private exited = false;
  private _exitCode: number | undefined;
  /** The command's pid in the sandbox (undefined from an older daemon). */
  readonly pid: number | undefined;

  /** @internal */
  constructor(
    private readonly commands: Commands,
    private readonly answer: Answer,
    private readonly output: Output,
    timeoutMs: number,
    check: boolean,
  ) {
    this.pid = pidOf(answer);
    this.done = commands.consume(answer, output, timeoutMs).then(
      (exit) => {
        this.exited = true;
        this._exitCode = exit.exitCode;
        return finishResult(output, exit, timeoutMs, check, this.pid);
      },
      (err) => {
        this.exited = true;
        if (this.killed) {
          this._exitCode = 137;
          output.end();
          const killed: CommandResult = { stdout: output.out, stderr: output.err, exitCode: 137, signal: "SIGKILL", timedOut: false };
          if (this.pid !== undefined) killed.pid = this.pid;
          if (!check) return killed;
          throw new CommandExitError(killed);
        }
        throw err;
      },
    );
    // wait() is optional: a failure nobody waits for must not crash the process.
    this.done.catch(() => {});
  }

  /** The output so far. */
  get stdout(): string {
    return this.output.out;
  }
  get stderr(): string {
    return this.output.err;
  }
  /** Whether the command still runs (as far as this handle knows). */
  isRunning(): boolean {
    return !this.exited;
  }

  /** The exit code once the command exited; undefined while it runs. */
  get exitCode(): number | undefined {
    return this._exitCode;
  }

  /**
   * Waits for the command to exit: resolves with its result on exit code 0,
   * rejects with CommandExitError otherwise (exitCode 137, signal SIGKILL
   * after kill()), or TimeoutError past its timeoutMs.
   */
  wait(): Promise<CommandResult> {
    return this.done.then((r) => r);
  }

  /**
   * Kills the command: SIGKILL to its whole process group (the process and
   * what it started). Resolves true if it was still running.
   */
  async kill(): Promise<boolean> {
    if (this.exited || this.killed) return false;
    if (this.pid !== undefined) {
      let sent: boolean | undefined;
      try {
        sent = await this.commands.kill(this.pid);
      } catch {
        sent = undefined; // cut the connection instead (below)
      }
      if (sent === false) {
        // It had exited; its exit event is on the way.
        await this.done.catch(() => {});
        return false;
      }
      if (sent === true) {
        await this.done.catch(() => {});
        return true;
      }
    }
    // No pid (an older daemon), or the signal could not be sent: the SDK
    // disconnects and the sandbox's agent kills the process group.
    this.killed = true;
    this.answer.abort(Object.assign(new ForkdError("command killed", { code: "canceled" }), { [KILLED]: true }));
    await this.done.catch(() => {});
    return true;
  }

  /**
   * Writes to the command's stdin (started with `stdin: true`); resolves
   * once the process's stdin pipe took all of it. Rejects with
   * ConflictError when stdin was not kept open or is closed, NotFoundError
   * once the command exited.
   */
  async sendStdin(data: StdinSource, opts: CallOptions = {}): Promise<void> {
    await this.commands.sendStdin(this.needPid("sendStdin"), data, opts);
  }

  /**
   * Closes the command's stdin (EOF), for a command started with `stdin: true`.
   * Closing twice is fine, and so is closing after the command exited (a
   * command that read to EOF may exit before a second close arrives).
   */
  async closeStdin(opts: CallOptions = {}): Promise<void> {
    try {
      await this.commands.closeStdin(this.needPid("closeStdin"), opts);
    } catch (err) {
      if (!processGone(err)) throw err;
    }
  }

  private needPid(what: string): number {
    if (this.pid === undefined) {
      throw new ConflictError(`${what}: the daemon reported no pid for this command; its sandbox's agent predates process control`, { code: "failed_precondition" });
    }
    return this.pid;
  }
}
