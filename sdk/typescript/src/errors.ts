/**
 * Errors. Everything the SDK throws or rejects with is a {@link ForkdError}
 * (or an `AbortError` when you abort a call with your own `AbortSignal`).
 *
 * The daemon answers failures with RFC 9457 `application/problem+json`
 * documents; their `code` picks the subclass:
 *
 * | status | code                                  | class                  |
 * |--------|---------------------------------------|------------------------|
 * | 400    | invalid_argument                      | InvalidArgumentError   |
 * | 401    | unauthenticated                       | AuthenticationError    |
 * | 403    | permission_denied                     | PermissionDeniedError  |
 * | 404    | not_found                             | NotFoundError          |
 * | 409    | already_exists, failed_precondition   | ConflictError          |
 * | 429    | resource_exhausted                    | RateLimitedError       |
 * | 503    | unavailable                           | UnavailableError       |
 * | 504    | deadline_exceeded                     | TimeoutError           |
 * | other  | internal, not_implemented, canceled   | ForkdError             |
 */

/** An RFC 9457 problem document as the daemon sends it. */
export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  /** Stable error class: not_found, already_exists, invalid_argument, ... */
  code?: string;
  request_id?: string;
  [key: string]: unknown;
}

export interface ForkdErrorInit {
  status?: number;
  code?: string;
  title?: string;
  type?: string;
  requestId?: string;
  problem?: Problem;
  retryAfter?: number;
  cause?: unknown;
}

/** Base class of every error the SDK raises. */
export class ForkdError extends Error {
  /** HTTP status of the daemon's answer; undefined when there was none. */
  readonly status: number | undefined;
  /**
   * Stable error class: the problem's `code` (not_found, already_exists,
   * invalid_argument, failed_precondition, resource_exhausted, unavailable,
   * not_implemented, canceled, deadline_exceeded, internal, unauthenticated),
   * or one of the SDK's own: `stream_cut`, `command_exit`, `snapshot_failed`.
   */
  readonly code: string;
  /** The problem's title (e.g. "Not Found"). */
  readonly title: string | undefined;
  /** The problem's type URI. */
  readonly type: string | undefined;
  /** The problem's `detail`, the daemon's own explanation. */
  readonly detail: string;
  /** The request id (X-Request-Id) to find the request in the daemon's log. */
  readonly requestId: string | undefined;
  /** The whole problem document, when the daemon sent one. */
  readonly problem: Problem | undefined;

  constructor(message: string, init: ForkdErrorInit = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.status = init.status ?? init.problem?.status;
    this.code = init.code ?? init.problem?.code ?? "internal";
    this.title = init.title ?? init.problem?.title;
    this.type = init.type ?? init.problem?.type;
    this.detail = init.problem?.detail ?? message;
    this.requestId = init.requestId ?? init.problem?.request_id;
    this.problem = init.problem;
  }
}

/** 400 invalid_argument: the request was refused as malformed or invalid. */
export class InvalidArgumentError extends ForkdError {}

/** 401 unauthenticated: missing or unknown bearer token (TCP only). */
export class AuthenticationError extends ForkdError {}

/**
 * 403 permission_denied: the token's role may not do this (a read-only token
 * writing, a user token on an admin route, a tenant removing a snapshot only
 * shared with it, an archive the daemon's import policy refuses).
 */
export class PermissionDeniedError extends ForkdError {}

/** 404 not_found: no such sandbox, snapshot, recipe, file or executable. */
export class NotFoundError extends ForkdError {}

/**
 * 409: the target exists already (already_exists) or is in the wrong state
 * (failed_precondition: e.g. a snapshot with dependents, no Python session).
 */
export class ConflictError extends ForkdError {}

/**
 * A deadline passed: the daemon answered 504 deadline_exceeded, a command or
 * code ran past its `timeoutMs`, or the SDK's `requestTimeoutMs` elapsed.
 */
export class TimeoutError extends ForkdError {
  /** For a command that timed out: its output until it was killed. */
  result?: CommandOutcome;
  /** For code that timed out: what it printed and produced until interrupted (an Execution). */
  execution?: unknown;
}

/** 429 resource_exhausted: a limit was reached; retry after `retryAfter` seconds. */
export class RateLimitedError extends ForkdError {
  /** Seconds the daemon asks to wait before retrying (Retry-After). */
  readonly retryAfter: number | undefined;
  constructor(message: string, init: ForkdErrorInit = {}) {
    super(message, init);
    this.retryAfter = init.retryAfter;
  }
}

/**
 * 503 unavailable, or the daemon cannot be reached at all (not running,
 * wrong socket or host, permission denied): the message says where the SDK
 * looked and how to start the daemon.
 */
export class UnavailableError extends ForkdError {
  /** Seconds the daemon asks to wait before retrying (Retry-After), if it said. */
  readonly retryAfter: number | undefined;
  constructor(message: string, init: ForkdErrorInit = {}) {
    super(message, init);
    this.retryAfter = init.retryAfter;
  }
}

/**
 * A streamed answer (exec, run_code, file read, archive, progress) ended
 * before its final event: the sandbox was killed, the daemon stopped, or the
 * connection broke. Never mistaken for success.
 */
export class StreamCutError extends ForkdError {
  /** For commands: the output that arrived before the cut. */
  partial?: { stdout: string; stderr: string };
  constructor(message: string, init: ForkdErrorInit = {}) {
    super(message, { code: "stream_cut", ...init });
  }
}

/** The outcome of a command (see `CommandResult` in commands.ts). */
export interface CommandOutcome {
  stdout: string;
  stderr: string;
  exitCode: number;
  signal?: string;
}

/**
 * A command exited with a non-zero code. `commands.run()` and a background
 * handle's `wait()` reject with it; the output is on the error.
 */
export class CommandExitError extends ForkdError implements CommandOutcome {
  readonly stdout: string;
  readonly stderr: string;
  readonly exitCode: number;
  readonly signal: string | undefined;
  constructor(result: CommandOutcome, init: ForkdErrorInit = {}) {
    const how = result.signal ? `was killed by ${result.signal} (exit code ${result.exitCode})` : `exited with code ${result.exitCode}`;
    const tail = lastLine(result.stderr);
    super(`command ${how}${tail ? `: ${tail}` : ""}`, { code: "command_exit", ...init });
    this.stdout = result.stdout;
    this.stderr = result.stderr;
    this.exitCode = result.exitCode;
    this.signal = result.signal;
  }
  /** The whole result, as run() would have resolved it. */
  get result(): CommandOutcome {
    return { stdout: this.stdout, stderr: this.stderr, exitCode: this.exitCode, ...(this.signal ? { signal: this.signal } : {}) };
  }
}

/** A snapshot written in the background (branch with `wait: false`) failed. */
export class SnapshotFailedError extends ForkdError {
  readonly tag: string;
  constructor(tag: string, reason: string) {
    super(`snapshot ${JSON.stringify(tag)} failed: ${reason || "no reason given"}`, { code: "snapshot_failed" });
    this.tag = tag;
  }
}

function lastLine(s: string): string {
  const lines = s.trimEnd().split("\n");
  const last = lines[lines.length - 1] ?? "";
  return last.length > 200 ? last.slice(0, 200) + "…" : last;
}

/** The class for a problem code (and the HTTP status, when the code is unknown). */
export function errorClassFor(code: string | undefined, status?: number): typeof ForkdError {
  switch (code) {
    case "invalid_argument":
      return InvalidArgumentError;
    case "unauthenticated":
      return AuthenticationError;
    case "permission_denied":
      return PermissionDeniedError;
    case "not_found":
      return NotFoundError;
    case "already_exists":
    case "failed_precondition":
      return ConflictError;
    case "resource_exhausted":
      return RateLimitedError;
    case "unavailable":
      return UnavailableError;
    case "deadline_exceeded":
      return TimeoutError;
  }
  switch (status) {
    case 400:
      return InvalidArgumentError;
    case 401:
      return AuthenticationError;
    case 403:
      return PermissionDeniedError;
    case 404:
      return NotFoundError;
    case 409:
      return ConflictError;
    case 429:
      return RateLimitedError;
    case 503:
      return UnavailableError;
    case 504:
      return TimeoutError;
  }
  return ForkdError;
}

/** Builds the typed error for a problem document. */
export function errorFromProblem(problem: Problem, init: ForkdErrorInit = {}): ForkdError {
  const Cls = errorClassFor(problem.code, problem.status ?? init.status);
  const message = problem.detail || problem.title || `daemon answered ${problem.status ?? init.status ?? "an error"}`;
  return new Cls(message, { ...init, problem, status: problem.status ?? init.status, code: problem.code ?? init.code });
}

// The agent's errors end with the errdefs class's message (Go's errdefs):
// exec failures that arrive inside a 200 stream keep only that text.
const suffixCodes: Array<[string, string]> = [
  [": not found", "not_found"],
  [": already exists", "already_exists"],
  [": invalid argument", "invalid_argument"],
  [": failed precondition", "failed_precondition"],
  [": resource exhausted", "resource_exhausted"],
  [": unavailable", "unavailable"],
  [": not implemented", "not_implemented"],
  [": canceled", "canceled"],
  [": deadline exceeded", "deadline_exceeded"],
  [": internal error", "internal"],
  [": unauthenticated", "unauthenticated"],
  [": permission denied", "permission_denied"],
];

/** The errdefs code a Go error message ends with, if any. */
export function codeFromMessage(msg: string): string | undefined {
  for (const [suffix, code] of suffixCodes) {
    if (msg.endsWith(suffix)) return code;
  }
  return undefined;
}
