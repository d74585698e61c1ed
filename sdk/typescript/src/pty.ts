import type { CallOptions } from "./client.js";
import { CommandHandle, Output, type Commands } from "./commands.js";
import { InvalidArgumentError } from "./errors.js";
import type { SandboxContext } from "./internal.js";

/** A terminal's size in character cells, each 1..1000. */
export interface PtySize {
  rows: number;
  cols: number;
}

export interface PtyCreateOptions extends PtySize {
  /** Called with each piece of terminal output, as bytes. */
  onData?: (data: Uint8Array) => void;
  /** Extra environment variables (TERM defaults to xterm-256color). */
  envs?: Record<string, string>;
  /** Working directory. */
  cwd?: string;
  /** Milliseconds after which the terminal is killed (default 60 000, as E2B; 0: no limit). */
  timeoutMs?: number;
  /** What to run instead of a login shell: a command line or an argv. */
  cmd?: string | readonly string[];
  /** Aborts the request that starts it. */
  signal?: AbortSignal;
}

/** What pty.create runs by default: a login shell, bash when the image has it. */
export const PTY_SHELL = "if command -v bash >/dev/null 2>&1; then exec bash -i -l; else exec sh -i -l; fi";

const DEFAULT_PTY_TIMEOUT_MS = 60_000;

function checkSize(size: PtySize): { rows: number; cols: number } {
  for (const name of ["rows", "cols"] as const) {
    const v = size[name];
    if (!Number.isInteger(v) || v < 1 || v > 1000) {
      throw new InvalidArgumentError(`pty ${name} ${String(v)}: want 1..1000`, { code: "invalid_argument" });
    }
  }
  return { rows: size.rows, cols: size.cols };
}

/**
 * Interactive terminals in a sandbox: `sb.pty` (E2B's shapes).
 *
 * A pty command runs in a new session with a pseudo-terminal as its stdin,
 * stdout and stderr: all output arrives through `onData` (and the handle's
 * stdout), and input is what a keyboard types (`\x03` is Ctrl-C).
 */
export class Pty {
  /** @internal */
  constructor(
    private readonly ctx: SandboxContext,
    private readonly commands: Commands,
  ) {}

  /** Starts a terminal and resolves with its handle (pid, wait(), kill()). */
  async create(opts: PtyCreateOptions): Promise<CommandHandle> {
    const pty = checkSize(opts);
    const timeoutMs = opts.timeoutMs ?? DEFAULT_PTY_TIMEOUT_MS;
    const start: Parameters<Commands["start"]>[1] = { stdin: true, pty, timeoutMs };
    if (opts.envs) start.envs = opts.envs;
    if (opts.cwd) start.cwd = opts.cwd;
    if (opts.signal) start.signal = opts.signal;
    const a = await this.commands.start(opts.cmd ?? PTY_SHELL, start);
    return new CommandHandle(this.commands, a, new Output(undefined, undefined, opts.onData), timeoutMs, true);
  }

  /** Types `data` into terminal `pid`. */
  async sendInput(pid: number, data: Uint8Array, opts: CallOptions = {}): Promise<void> {
    await this.commands.sendStdin(pid, data, opts);
  }

  /**
   * Changes terminal `pid`'s size (the program gets SIGWINCH). Rejects with
   * InvalidArgumentError for a size outside 1..1000, NotFoundError for no
   * such process, ConflictError when the process has no terminal.
   */
  async resize(pid: number, size: PtySize, opts: CallOptions = {}): Promise<void> {
    const body = checkSize(size);
    await this.ctx.transport.json({
      method: "POST",
      path: this.commands.processPath(pid, "resize"),
      json: body,
      signal: opts.signal,
      what: `resize terminal ${pid} in sandbox ${this.ctx.id}`,
    });
  }

  /** SIGKILLs terminal `pid`'s session; resolves false when it had exited. */
  async kill(pid: number, opts: CallOptions = {}): Promise<boolean> {
    return this.commands.kill(pid, "SIGKILL", opts);
  }
}
