import { ndjson } from "./connection.js";
import { ForkdError, InvalidArgumentError, StreamCutError, TimeoutError, errorFromProblem, type Problem } from "./errors.js";
import type { SandboxContext } from "./internal.js";

export interface RunCodeOptions {
  /** Only "python" is supported. */
  language?: "python";
  /**
   * Interrupt the code (KeyboardInterrupt) after this many ms; the session and
   * its variables are kept. Default 60000; 0 means no limit. A timeout
   * rejects with {@link TimeoutError} (its `execution` holds what ran).
   */
  timeoutMs?: number;
  /** Called with each piece of stdout as the code prints it. */
  onStdout?: (data: string) => void;
  /** Called with each piece of stderr as the code prints it. */
  onStderr?: (data: string) => void;
  /** Called with each result (display outputs, then the main result). */
  onResult?: (result: Result) => void;
  /** Aborting disconnects, which interrupts the code (the session is kept). */
  signal?: AbortSignal;
}

const MIME_FORMATS: Record<string, string> = {
  "text/plain": "text",
  "text/html": "html",
  "text/markdown": "markdown",
  "image/svg+xml": "svg",
  "image/png": "png",
  "image/jpeg": "jpeg",
  "application/pdf": "pdf",
  "text/latex": "latex",
  "application/json": "json",
  "application/javascript": "javascript",
};

/**
 * One rich output of the code: the value of its last expression
 * (`isMainResult`) or something it displayed (a matplotlib figure, a
 * display() call). Each representation is a string; images are base64.
 */
export class Result {
  /** text/plain: the repr. */
  readonly text?: string;
  /** text/html: DataFrames and objects with _repr_html_. */
  readonly html?: string;
  readonly markdown?: string;
  readonly svg?: string;
  /** image/png, base64. */
  readonly png?: string;
  /** image/jpeg, base64. */
  readonly jpeg?: string;
  readonly pdf?: string;
  readonly latex?: string;
  readonly json?: string;
  readonly javascript?: string;
  /** Every representation by MIME type, including ones without a field. */
  readonly raw: Readonly<Record<string, string>>;
  /** True for the value of the last expression, false for displayed outputs. */
  readonly isMainResult: boolean;

  constructor(raw: Record<string, string>, isMainResult: boolean) {
    this.raw = raw;
    this.isMainResult = isMainResult;
    for (const [mime, field] of Object.entries(MIME_FORMATS)) {
      if (raw[mime] !== undefined) (this as Record<string, unknown>)[field] = raw[mime];
    }
  }

  /** The formats present: "text", "html", "png", ... and any other MIME types as they are. */
  formats(): string[] {
    return Object.keys(this.raw).map((mime) => MIME_FORMATS[mime] ?? mime);
  }

  toJSON(): Record<string, unknown> {
    const out: Record<string, unknown> = { isMainResult: this.isMainResult };
    for (const [mime, value] of Object.entries(this.raw)) out[MIME_FORMATS[mime] ?? mime] = value;
    return out;
  }
}

/** A Python exception the code raised. */
export class ExecutionError {
  constructor(
    /** The exception's class, e.g. "ZeroDivisionError". */
    readonly name: string,
    /** Its message. */
    readonly value: string,
    /** The formatted traceback. */
    readonly traceback: string,
  ) {}
}

/** What a runCode() call did. An exception in the code is `error`, not a rejection. */
export class Execution {
  /** Displayed outputs in order, then the main result (the last expression's value), if any. */
  readonly results: Result[] = [];
  /** Output in the pieces it was printed in. */
  readonly logs: { stdout: string[]; stderr: string[] } = { stdout: [], stderr: [] };
  /** The exception the code raised, if it did. */
  error: ExecutionError | undefined;
  /** How long the code ran, in ms. */
  durationMs: number | undefined;

  /** The main result's text/plain, if there is one. */
  get text(): string | undefined {
    return this.results.find((r) => r.isMainResult)?.text;
  }

  /** All stdout as one string. */
  get stdout(): string {
    return this.logs.stdout.join("");
  }

  /** All stderr as one string. */
  get stderr(): string {
    return this.logs.stderr.join("");
  }

  toJSON(): Record<string, unknown> {
    return { results: this.results.map((r) => r.toJSON()), logs: this.logs, error: this.error, durationMs: this.durationMs };
  }
}

interface WireCodeResult {
  stdout?: string;
  stderr?: string;
  result?: Record<string, string> | null;
  display?: Record<string, string>[] | null;
  error?: { name: string; value: string; traceback: string } | null;
  timed_out?: boolean;
  duration_us?: number;
}

interface WireCodeEvent {
  type: string;
  data?: string;
  result?: WireCodeResult;
  error?: Problem;
}

const DEFAULT_TIMEOUT_MS = 60_000;
const CLIENT_GRACE_MS = 10_000;

/** @internal Runs code through POST /v1/sandboxes/{id}/run_code/stream. */
export async function runCode(ctx: SandboxContext, code: string, opts: RunCodeOptions = {}): Promise<Execution> {
  if (opts.language !== undefined && opts.language !== "python") {
    throw new InvalidArgumentError(`runCode: language ${JSON.stringify(opts.language)} is not supported; only "python" is`, { code: "invalid_argument" });
  }
  if (typeof code !== "string") throw new TypeError("runCode: code must be a string");
  const timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const req: Record<string, unknown> = { code };
  if (timeoutMs > 0) req.timeout_ms = Math.ceil(timeoutMs);
  const a = await ctx.transport.request({
    method: "POST",
    path: `/v1/sandboxes/${encodeURIComponent(ctx.id)}/run_code/stream`,
    json: req,
    headers: { accept: "application/x-ndjson" },
    signal: opts.signal,
    timeoutMs: timeoutMs > 0 ? timeoutMs + CLIENT_GRACE_MS : 0,
    what: `run_code in sandbox ${ctx.id}`,
  });
  const exe = new Execution();
  let finished = false;
  try {
    for await (const ev of ndjson<WireCodeEvent>(a, (ev) => ev.type === "result" || ev.type === "error")) {
      switch (ev.type) {
        case "stdout":
          exe.logs.stdout.push(ev.data ?? "");
          opts.onStdout?.(ev.data ?? "");
          break;
        case "stderr":
          exe.logs.stderr.push(ev.data ?? "");
          opts.onStderr?.(ev.data ?? "");
          break;
        case "error":
          finished = true;
          throw errorFromProblem(ev.error ?? { detail: "run_code failed", code: "internal" }, a.requestId ? { requestId: a.requestId } : {});
        case "result": {
          finished = true;
          const r = ev.result ?? {};
          // A daemon answering without streaming puts the output here.
          if (r.stdout) exe.logs.stdout.push(r.stdout);
          if (r.stderr) exe.logs.stderr.push(r.stderr);
          for (const d of r.display ?? []) exe.results.push(new Result(d, false));
          if (r.result && Object.keys(r.result).length > 0) exe.results.push(new Result(r.result, true));
          for (const res of exe.results) opts.onResult?.(res);
          if (r.error) exe.error = new ExecutionError(r.error.name, r.error.value, r.error.traceback);
          if (r.duration_us !== undefined) exe.durationMs = r.duration_us / 1000;
          if (r.timed_out) {
            const err = new TimeoutError(`code in sandbox ${ctx.id} ran past its timeout of ${timeoutMs} ms${r.error ? `: ${r.error.value}` : ""}`, {
              code: "deadline_exceeded",
              ...(a.requestId ? { requestId: a.requestId } : {}),
            });
            throw Object.assign(err, { execution: exe });
          }
          return exe;
        }
      }
    }
  } catch (err) {
    // A callback threw, or the stream failed: disconnecting interrupts the code.
    if (!finished) a.abort(err instanceof Error ? err : new Error(String(err)));
    if (err instanceof TimeoutError && !(err as { execution?: unknown }).execution) {
      throw new TimeoutError(`code in sandbox ${ctx.id} gave no result within ${timeoutMs} ms plus ${CLIENT_GRACE_MS} ms of grace; it was abandoned`, { code: "deadline_exceeded", cause: err });
    }
    if (err instanceof StreamCutError) throw await cut(ctx, a.requestId, err);
    throw err;
  } finally {
    a.finish();
  }
  throw await cut(ctx, a.requestId, undefined);
}

async function cut(ctx: SandboxContext, requestId: string | undefined, cause: Error | undefined): Promise<ForkdError> {
  const fate = await ctx.describeFate();
  return new StreamCutError(`code in sandbox ${ctx.id} was cut off before its result${fate ? ` (${fate})` : ""}${cause ? `: ${cause.message}` : ""}`, {
    ...(requestId ? { requestId } : {}),
    cause,
  });
}
