/**
 * Connection to a forkd daemon: resolution of the settings (options, then
 * environment, as the CLI does), keep-alive HTTP over a Unix socket or
 * TCP(+TLS), problem+json decoding and clear errors for unreachable daemons.
 * @internal
 */
import * as http from "node:http";
import * as https from "node:https";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Readable } from "node:stream";
import type { Socket } from "node:net";
import {
  ForkdError,
  InvalidArgumentError,
  RateLimitedError,
  StreamCutError,
  TimeoutError,
  UnavailableError,
  errorFromProblem,
  type Problem,
} from "./errors.js";
import { VERSION } from "./version.js";

/** How to reach the daemon. Every field falls back to the environment, as the CLI does. */
export interface ConnectionOptions {
  /**
   * The daemon's URL: `https://HOST:PORT`, `http://127.0.0.1:PORT` (a loopback
   * listener without TLS) or `unix:///path/to/forkd.sock`. Env `FORKD_HOST`;
   * when neither is set, the local Unix socket is used.
   */
  host?: string;
  /**
   * Unix socket of a local daemon. Env `FORKD_SOCKET`; default
   * `$FORKD_RUN_DIR/forkd.sock` (FORKD_RUN_DIR defaults to /run/forkd).
   */
  socket?: string;
  /** Bearer token (`forkd token create`): required over TCP; on the Unix socket it makes the client act as the token's tenant, under its quotas. Env `FORKD_TOKEN`. */
  token?: string;
  /**
   * CA certificate that signs an https daemon's certificate: a PEM file path
   * or the PEM text itself. Env `FORKD_CA_CERT`; default: the system roots.
   */
  caCert?: string | Uint8Array;
  /**
   * Limit for each plain (non-streamed) API call, in ms: forks, listings,
   * kills, branches, stats... Default 120000; 0 means no limit. Streamed
   * calls (commands, run_code, file and archive transfers, snapshot
   * creation) are bounded by their own `timeoutMs` or your `signal` instead.
   */
  requestTimeoutMs?: number;
  /**
   * Times a request the daemon refused with 429 or 503 and a Retry-After
   * (a limit such as `--max-sandboxes`, the cap on concurrent branches, a
   * restarting daemon: nothing was done) is sent again after waiting as
   * told. Default 2; 0 rejects at once. A wait over 10 s and a streamed
   * body are never retried; the error rejected with last has `retryAfter`.
   */
  retries?: number;
  /** Extra headers sent with every request. */
  headers?: Record<string, string>;
}

/** The settings a client ended up with. */
export interface ResolvedConnection {
  /** Unix socket path, when the daemon is local. */
  socket?: string;
  /** Base URL, when the daemon is reached over TCP. */
  url?: string;
  token?: string;
  ca?: Buffer;
  requestTimeoutMs: number;
  retries: number;
  headers: Record<string, string>;
}

const DEFAULT_REQUEST_TIMEOUT_MS = 120_000;
const DEFAULT_RETRIES = 2;
/** The longest Retry-After a client waits out, in seconds. */
const MAX_RETRY_WAIT_S = 10;

function env(name: string): string | undefined {
  const v = process.env[name];
  return v === undefined || v === "" ? undefined : v;
}

/** Resolves options and environment into connection settings. */
export function resolveConnection(opts: ConnectionOptions = {}): ResolvedConnection {
  const out: ResolvedConnection = {
    requestTimeoutMs: opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS,
    retries: opts.retries ?? DEFAULT_RETRIES,
    headers: { ...(opts.headers ?? {}) },
  };
  if (!Number.isInteger(out.retries) || out.retries < 0) {
    throw new InvalidArgumentError(`retries must be a whole number >= 0, not ${opts.retries}`, { code: "invalid_argument" });
  }
  // Options win over the environment: a socket given in code beats FORKD_HOST.
  let host = opts.host;
  let socket = opts.socket;
  if (host === undefined && socket === undefined) {
    host = env("FORKD_HOST");
    if (host === undefined) {
      socket = env("FORKD_SOCKET") ?? join(env("FORKD_RUN_DIR") ?? "/run/forkd", "forkd.sock");
    }
  }
  if (host !== undefined && host !== "") {
    if (host.startsWith("unix://")) {
      const path = host.slice("unix://".length);
      if (!path.startsWith("/")) {
        throw new InvalidArgumentError(`host ${JSON.stringify(host)}: want unix:///absolute/path/forkd.sock`, { code: "invalid_argument" });
      }
      out.socket = path;
    } else {
      let u: URL;
      try {
        u = new URL(host);
      } catch {
        throw new InvalidArgumentError(`host ${JSON.stringify(host)}: want https://HOST:PORT, http://127.0.0.1:PORT or unix:///path`, { code: "invalid_argument" });
      }
      if ((u.protocol !== "https:" && u.protocol !== "http:") || u.hostname === "") {
        throw new InvalidArgumentError(`host ${JSON.stringify(host)}: want https://HOST:PORT, http://127.0.0.1:PORT or unix:///path`, { code: "invalid_argument" });
      }
      out.url = `${u.protocol}//${u.host}`;
    }
  } else {
    out.socket = socket ?? join(env("FORKD_RUN_DIR") ?? "/run/forkd", "forkd.sock");
  }
  const token = opts.token ?? env("FORKD_TOKEN");
  if (token) out.token = token;
  const ca = opts.caCert ?? env("FORKD_CA_CERT");
  if (ca !== undefined && ca !== "" && out.url?.startsWith("https:")) {
    out.ca = loadCA(ca);
  }
  return out;
}

function loadCA(ca: string | Uint8Array): Buffer {
  if (typeof ca !== "string") return Buffer.from(ca);
  if (ca.includes("-----BEGIN")) return Buffer.from(ca);
  let pem: Buffer;
  try {
    pem = readFileSync(ca);
  } catch (err) {
    throw new InvalidArgumentError(`CA certificate ${ca}: ${(err as Error).message}`, { code: "invalid_argument", cause: err });
  }
  if (!pem.includes("-----BEGIN CERTIFICATE-----")) {
    throw new InvalidArgumentError(`CA certificate ${ca} has no PEM certificate`, { code: "invalid_argument" });
  }
  return pem;
}

/** A request body: bytes, text, or a stream that is sent as it is read. */
export type BodySource = string | Uint8Array | Readable | AsyncIterable<Uint8Array | string> | Iterable<Uint8Array>;

/** List endpoints answer a page at a time: the SDK asks for pages this big (the daemon's maximum) and follows at most LIST_MAX_PAGES. */
const LIST_PAGE = 1000;
const LIST_MAX_PAGES = 10000;

export type Query = Record<string, string | number | boolean | string[] | undefined>;

export interface RequestSpec {
  method: string;
  path: string;
  query?: Query;
  headers?: Record<string, string>;
  /** JSON body. */
  json?: unknown;
  body?: BodySource;
  signal?: AbortSignal | undefined;
  /** Limit for the whole call (until finish()); 0 or undefined: none. */
  timeoutMs?: number | undefined;
  /** What the call is, for messages ("exec in sb-123"). */
  what?: string;
}

/** An answered request whose status was < 400; read `res`, then call finish(). */
export interface Answer {
  res: http.IncomingMessage;
  status: number;
  requestId: string | undefined;
  /** Turns an error met while reading `res` into the error to raise. */
  readError(err: unknown, detail?: string): Error;
  /** Aborts the request (the daemon sees a disconnect). */
  abort(reason?: Error): void;
  /** Releases timers and listeners; call when the answer was read. */
  finish(): void;
}

/** Resolves after ms, or rejects with the signal's reason once it aborts. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

function isReplayable(body: BodySource | undefined): body is string | Uint8Array | undefined {
  return body === undefined || typeof body === "string" || body instanceof Uint8Array;
}

function isAbortError(err: unknown): boolean {
  return err instanceof Error && (err.name === "AbortError" || (err as NodeJS.ErrnoException).code === "ABORT_ERR");
}

/** Keep-alive HTTP to one daemon. */
export class Transport {
  readonly conn: ResolvedConnection;
  /** Where the daemon is, for messages: the socket path or the URL. */
  readonly where: string;
  private readonly agent: http.Agent;
  private readonly mod: typeof http | typeof https;
  private readonly base: http.RequestOptions;
  private readonly fixedHeaders: Record<string, string>;

  constructor(conn: ResolvedConnection) {
    this.conn = conn;
    if (conn.socket !== undefined) {
      this.where = conn.socket;
      this.mod = http;
      this.agent = new http.Agent({ keepAlive: true, maxSockets: 64, maxFreeSockets: 64 });
      this.base = { socketPath: conn.socket, host: "forkd" };
    } else {
      const u = new URL(conn.url!);
      this.where = conn.url!;
      if (u.protocol === "https:") {
        this.mod = https;
        this.agent = new https.Agent({ keepAlive: true, maxSockets: 64, maxFreeSockets: 64, ...(conn.ca ? { ca: conn.ca } : {}), minVersion: "TLSv1.2" });
      } else {
        this.mod = http;
        this.agent = new http.Agent({ keepAlive: true, maxSockets: 64, maxFreeSockets: 64 });
      }
      this.base = { protocol: u.protocol, hostname: u.hostname.replace(/^\[|\]$/g, ""), port: u.port || (u.protocol === "https:" ? 443 : 80) };
    }
    this.fixedHeaders = { "user-agent": `forkd-typescript/${VERSION} node/${process.version}`, ...conn.headers };
    if (conn.token) this.fixedHeaders["authorization"] = `Bearer ${conn.token}`;
  }

  /** Closes idle keep-alive connections. */
  close(): void {
    this.agent.destroy();
  }

  /**
   * Sends a request and resolves once the daemon answered with a status
   * below 400; a problem answer rejects with its typed error.
   */
  async request(spec: RequestSpec): Promise<Answer> {
    // A keep-alive connection the daemon closed while idle (a restart) fails
    // on first use: send once more on a fresh one when the body allows it.
    // A refusal with a Retry-After is sent again after the wait (retryWait).
    let retried = 0;
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.requestOnce(spec);
      } catch (err) {
        if (attempt === 0 && (err as { retryable?: boolean }).retryable && isReplayable(spec.body)) continue;
        const wait = this.retryWait(err, spec, retried);
        if (wait === undefined) throw err;
        retried++;
        attempt = -1; // a fresh try: a pooled connection may be stale again
        await sleep(wait * 1000, spec.signal);
      }
    }
  }

  /**
   * Seconds to wait before sending a refused request again, or undefined
   * to reject with err. Only 429 and 503 answers with a Retry-After are
   * retried: the daemon says it did nothing and when to come back.
   */
  private retryWait(err: unknown, spec: RequestSpec, retried: number): number | undefined {
    if (!(err instanceof RateLimitedError || err instanceof UnavailableError)) return undefined;
    const after = err.retryAfter;
    if (after === undefined || (err.status !== 429 && err.status !== 503)) return undefined;
    if (retried >= this.conn.retries || !isReplayable(spec.body) || after > MAX_RETRY_WAIT_S) return undefined;
    return Math.max(0, after);
  }

  private requestOnce(spec: RequestSpec): Promise<Answer> {
    const headers: Record<string, string> = { ...this.fixedHeaders, ...(spec.headers ?? {}) };
    let body: BodySource | undefined = spec.body;
    if (spec.json !== undefined) {
      body = JSON.stringify(spec.json);
      headers["content-type"] = "application/json";
    }
    if (typeof body === "string" || body instanceof Uint8Array) {
      headers["content-length"] = String(typeof body === "string" ? Buffer.byteLength(body) : body.byteLength);
    } else if (body === undefined && spec.method !== "GET" && spec.method !== "HEAD") {
      headers["content-length"] = "0";
    }
    let path = spec.path;
    if (spec.query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(spec.query)) {
        if (v === undefined) continue;
        if (Array.isArray(v)) for (const item of v) q.append(k, item);
        else q.append(k, String(v));
      }
      const qs = q.toString();
      if (qs) path += "?" + qs;
    }
    const what = spec.what ?? `${spec.method} ${spec.path}`;

    return new Promise<Answer>((resolve, reject) => {
      let settled = false; // resolve/reject called
      let finished = false;
      let abortReason: Error | undefined;
      let timer: NodeJS.Timeout | undefined;

      const req = this.mod.request({ ...this.base, method: spec.method, path, headers, agent: this.agent });
      const streamed = body !== undefined && !isReplayable(body);
      let pipeBroke = false;
      if (streamed) {
        // The daemon may answer and close before it read the whole body (a
        // process that exits without reading all of its stdin; a refused
        // upload). Node destroys a socket on its first failed write, which
        // loses an answer still unread in the socket: while this request
        // streams, a broken pipe only stops the upload, and the answer is
        // read to its end (or reported as cut).
        req.once("socket", (sock) => {
          tolerateBrokenPipe(sock, () => {
            pipeBroke = true;
          });
        });
      }

      const fail = (err: Error) => {
        if (!abortReason) abortReason = err;
        if (!settled) {
          settled = true;
          cleanup();
          reject(abortReason);
        }
        req.destroy(abortReason);
      };
      const onAbort = () => {
        const reason = spec.signal?.reason;
        fail(reason instanceof Error ? reason : Object.assign(new Error("the operation was aborted"), { name: "AbortError", code: "ABORT_ERR" }));
      };
      const cleanup = () => {
        if (finished) return;
        finished = true;
        if (timer) clearTimeout(timer);
        spec.signal?.removeEventListener("abort", onAbort);
      };

      if (spec.signal?.aborted) {
        onAbort();
        return;
      }
      spec.signal?.addEventListener("abort", onAbort, { once: true });
      if (spec.timeoutMs && spec.timeoutMs > 0) {
        timer = setTimeout(() => {
          fail(new TimeoutError(`${what}: no answer within ${spec.timeoutMs} ms (requestTimeoutMs); the daemon at ${this.where} may be overloaded`, { code: "deadline_exceeded" }));
        }, spec.timeoutMs);
      }

      req.on("error", (err: NodeJS.ErrnoException) => {
        if (settled) return; // after the answer: reading it reports the failure
        settled = true;
        cleanup();
        if (abortReason) {
          reject(abortReason);
          return;
        }
        const e = this.connectionError(err, what, false);
        // A reused keep-alive socket the daemon closed: safe to resend.
        if ((req as { reusedSocket?: boolean }).reusedSocket && (err.code === "ECONNRESET" || err.code === "EPIPE")) {
          (e as { retryable?: boolean }).retryable = true;
        }
        reject(e);
      });

      req.on("response", (res) => {
        const status = res.statusCode ?? 0;
        const requestId = headerValue(res.headers["x-request-id"]);
        if (status >= 400) {
          readAll(res, 1 << 20).then(
            (data) => {
              if (settled) return;
              settled = true;
              cleanup();
              reject(this.problemError(status, res.headers, data, requestId, what));
              // The request body may still be streaming: stop it.
              if (!req.writableFinished || pipeBroke) req.destroy();
            },
            (err) => {
              if (settled) return;
              settled = true;
              cleanup();
              reject(new UnavailableError(`${what}: daemon answered ${status} but the connection broke: ${(err as Error).message}`, { status, requestId, code: "unavailable", cause: err }));
            },
          );
          return;
        }
        if (settled) {
          res.resume();
          return;
        }
        settled = true;
        resolve({
          res,
          status,
          requestId,
          readError: (err: unknown, detail?: string) => {
            if (abortReason) return abortReason;
            if (err instanceof ForkdError) return err;
            const msg = err instanceof Error ? err.message : String(err);
            return new StreamCutError(`${what}: ${detail ?? "the answer was cut"} (${msg}); the daemon at ${this.where} closed the stream before it ended`, { requestId, cause: err });
          },
          abort: (reason?: Error) => {
            if (!abortReason) abortReason = reason ?? Object.assign(new Error("the operation was aborted"), { name: "AbortError", code: "ABORT_ERR" });
            cleanup();
            req.destroy(abortReason);
            res.destroy(abortReason);
          },
          finish: () => {
            cleanup();
            // Whatever is left of an answer read as far as needed (the end
            // of a stream after its last event) is drained, so that the
            // connection goes back to the pool.
            if (!res.complete && !res.destroyed) res.resume();
            if (req.socket) untolerate(req.socket);
            // A request body still streaming (stdin of a process that
            // exited) would keep the connection busy: drop it.
            if (!req.writableFinished || pipeBroke) req.destroy();
          },
        });
      });

      sendBody(req, body, (err) => {
        // The body source failed (the caller's stream): abort with its error.
        fail(err);
      });
    });
  }

  /**
   * Every item of a list endpoint (GET), in its order: asks for pages of
   * LIST_PAGE items and follows `next_cursor` to the last one. A daemon
   * from before paging answers one bare array.
   */
  async list<T>(spec: RequestSpec): Promise<T[]> {
    const out: T[] = [];
    let cursor = "";
    for (let page = 0; page < LIST_MAX_PAGES; page++) {
      const query: Query = { ...spec.query, limit: LIST_PAGE, cursor: cursor || undefined };
      const body = await this.json<{ items?: T[] | null; next_cursor?: string } | T[] | null>({ ...spec, query });
      if (body == null || Array.isArray(body)) return out.concat(body ?? []);
      out.push(...(body.items ?? []));
      const next = body.next_cursor ?? "";
      if (!next) return out;
      if (next === cursor) throw new ForkdError(`${spec.what ?? `GET ${spec.path}`}: the daemon answered the same next_cursor twice; its paging is broken`);
      cursor = next;
    }
    throw new ForkdError(`${spec.what ?? `GET ${spec.path}`}: more than ${LIST_MAX_PAGES} pages; list with filters`);
  }

  /** A call with a JSON (or empty) answer. */
  async json<T>(spec: RequestSpec): Promise<T> {
    const a = await this.request({ ...spec, timeoutMs: spec.timeoutMs ?? this.conn.requestTimeoutMs });
    try {
      const data = await readAll(a.res, Infinity);
      if (data.length === 0) return undefined as T;
      try {
        return JSON.parse(data.toString("utf8")) as T;
      } catch (err) {
        throw new ForkdError(`${spec.what ?? `${spec.method} ${spec.path}`}: the daemon's answer is not JSON: ${(err as Error).message}`, { status: a.status, requestId: a.requestId, cause: err });
      }
    } catch (err) {
      throw a.readError(err);
    } finally {
      a.finish();
    }
  }

  /** Turns a failed connection into a clear error naming where the SDK looked. */
  connectionError(err: NodeJS.ErrnoException, what: string, started: boolean): Error {
    if (err instanceof ForkdError || isAbortError(err)) return err;
    const code = err.code ?? "";
    const msg = err.message;
    if (this.conn.socket !== undefined) {
      if (!started && (code === "ENOENT" || code === "ECONNREFUSED")) {
        return new UnavailableError(
          `forkd daemon is not running at ${this.conn.socket} (${code}): start it with \`forkd daemon start\` (or \`forkd serve\`), ` +
            `or point FORKD_SOCKET or FORKD_HOST at a running daemon`,
          { code: "unavailable", cause: err },
        );
      }
      if (!started && (code === "EACCES" || code === "EPERM")) {
        return new UnavailableError(
          `permission denied on the forkd socket ${this.conn.socket} (${code}): it is root-only (mode 0600); ` +
            `run as root, or reach the daemon over TCP with FORKD_HOST and FORKD_TOKEN`,
          { code: "unavailable", cause: err },
        );
      }
    } else {
      if (!started && ["ECONNREFUSED", "ENOTFOUND", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN", "ETIMEDOUT"].includes(code)) {
        return new UnavailableError(
          `cannot reach the forkd daemon at ${this.where} (${code}): is \`forkd serve --listen\` running there? (FORKD_HOST)`,
          { code: "unavailable", cause: err },
        );
      }
      if (/CERT|TLS|SSL|SELF_SIGNED|UNABLE_TO_VERIFY/i.test(code) || /certificate|TLS|SSL/.test(msg)) {
        return new UnavailableError(
          `TLS with the forkd daemon at ${this.where} failed (${code || msg}): give its CA certificate with FORKD_CA_CERT or the caCert option`,
          { code: "unavailable", cause: err },
        );
      }
    }
    if (started) {
      return new StreamCutError(`${what}: the connection to the forkd daemon at ${this.where} broke (${code || msg})`, { cause: err });
    }
    return new UnavailableError(`${what}: the connection to the forkd daemon at ${this.where} failed (${code ? `${code}: ` : ""}${msg})`, { code: "unavailable", cause: err });
  }

  private problemError(status: number, headers: http.IncomingHttpHeaders, data: Buffer, requestId: string | undefined, what: string): ForkdError {
    const retryAfter = parseRetryAfter(headerValue(headers["retry-after"]));
    let problem: Problem | undefined;
    try {
      const parsed = JSON.parse(data.toString("utf8"));
      if (parsed && typeof parsed === "object" && (parsed.detail || parsed.code)) problem = parsed as Problem;
    } catch {
      // not a problem document
    }
    if (!problem) {
      const text = data.toString("utf8").trim().slice(0, 500);
      problem = { status, title: http.STATUS_CODES[status], detail: `${what}: daemon answered ${status} ${http.STATUS_CODES[status] ?? ""}${text ? `: ${text}` : ""}` };
    }
    return errorFromProblem(problem, { status, requestId: problem.request_id ?? requestId, ...(retryAfter !== undefined ? { retryAfter } : {}) });
  }
}

function headerValue(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

function parseRetryAfter(v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (Number.isFinite(n)) return n;
  const t = Date.parse(v);
  return Number.isNaN(t) ? undefined : Math.max(0, Math.ceil((t - Date.now()) / 1000));
}

/** Reads a whole body (up to max bytes). */
export function readAll(res: Readable, max: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let n = 0;
    res.on("data", (c: Buffer) => {
      if (n < max) {
        chunks.push(c);
        n += c.length;
      }
    });
    res.once("end", () => resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)));
    res.once("error", reject);
    res.once("aborted", () => reject(new Error("aborted")));
  });
}

const kTolerate = Symbol("forkd.tolerateBrokenPipe");
type Tolerant = Socket & {
  [kTolerate]?: (() => void) | undefined;
  _writeGeneric?: (writev: boolean, data: unknown, encoding: string, cb: (err?: Error | null) => void) => unknown;
};

/**
 * While armed, write errors of a broken pipe on this socket only call
 * onBreak instead of destroying the socket (so its unread answer can still
 * be read). Relies on net.Socket's _writeGeneric; without it, nothing
 * changes.
 */
function tolerateBrokenPipe(sock: Socket, onBreak: () => void): void {
  const s = sock as Tolerant;
  if (typeof s._writeGeneric !== "function") return;
  if (!Object.prototype.hasOwnProperty.call(s, "_writeGeneric")) {
    const orig = s._writeGeneric;
    s._writeGeneric = function (this: Tolerant, writev, data, encoding, cb) {
      return orig.call(this, writev, data, encoding, (err?: Error | null) => {
        const code = (err as NodeJS.ErrnoException | null | undefined)?.code;
        const handler = this[kTolerate];
        if (err && handler && (code === "EPIPE" || code === "ECONNRESET")) {
          handler();
          cb();
          return;
        }
        cb(err);
      });
    };
  }
  s[kTolerate] = onBreak;
}

function untolerate(sock: Socket): void {
  (sock as Tolerant)[kTolerate] = undefined;
}

function sendBody(req: http.ClientRequest, body: BodySource | undefined, onSourceError: (err: Error) => void): void {
  if (body === undefined) {
    req.end();
    return;
  }
  if (typeof body === "string" || body instanceof Uint8Array) {
    req.end(body);
    return;
  }
  // Send the headers now: the answer may have to come before the first
  // byte of the body (stdin written later, full duplex).
  req.flushHeaders();
  const src: Readable = body instanceof Readable ? body : Readable.from(body as AsyncIterable<Uint8Array>, { objectMode: false });
  // Manual pipe, so that an error of the request (the daemon answered and
  // closed) does not destroy the caller's stream, and an error of the
  // caller's stream aborts the request.
  let done = false;
  const onData = (chunk: Uint8Array | string) => {
    if (typeof chunk === "string") chunk = Buffer.from(chunk);
    if (!req.write(chunk)) src.pause();
  };
  const onDrain = () => src.resume();
  const stop = () => {
    done = true;
    src.off("data", onData);
    src.off("end", onEnd);
    src.off("error", onError);
    req.off("drain", onDrain);
    req.off("close", onClose);
  };
  const onEnd = () => {
    stop();
    req.end();
  };
  const onError = (err: Error) => {
    stop();
    onSourceError(err);
  };
  const onClose = () => {
    if (!done) {
      stop();
      // The request is over (answered early, aborted): stop reading the source.
      if (!src.destroyed && !(src as Readable).readableEnded) src.destroy();
    }
  };
  src.on("data", onData);
  src.once("end", onEnd);
  src.once("error", onError);
  req.on("drain", onDrain);
  req.once("close", onClose);
}

/** Reads what is left of an answer, resolving at its end (or after ms). */
function drainEnd(res: http.IncomingMessage, ms: number): Promise<void> {
  if (res.complete || res.destroyed || res.readableEnded) {
    res.resume();
    return Promise.resolve();
  }
  return new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(timer);
      res.off("end", done);
      res.off("close", done);
      res.off("error", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    res.on("end", done);
    res.on("close", done);
    res.on("error", done);
    res.resume();
  });
}

/**
 * Reads an NDJSON body line by line. Throws the answer's readError when the
 * connection breaks.
 */
export async function* ndjson<T = Record<string, unknown>>(a: Answer, isLast?: (ev: T) => boolean): AsyncGenerator<T> {
  let buf: Buffer | undefined;
  let sawLast = false;
  // Leaving the loop early (after the last event) must not destroy the
  // answer: finish() drains its end so that the connection is reused.
  // Callers abort() explicitly when they give up on a stream.
  const res = a.res as Readable & { iterator?: (o: { destroyOnReturn: boolean }) => AsyncIterable<Buffer> };
  const chunks: AsyncIterable<Buffer> = typeof res.iterator === "function" ? res.iterator({ destroyOnReturn: false }) : res;
  try {
    for await (const chunk of chunks) {
      buf = buf === undefined || buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
      let start = 0;
      let i: number;
      while ((i = buf.indexOf(10, start)) !== -1) {
        if (i > start) {
          const ev = JSON.parse(buf.toString("utf8", start, i)) as T;
          start = i + 1;
          if (isLast?.(ev)) sawLast = true;
          yield ev;
        } else {
          start = i + 1;
        }
      }
      buf = start === 0 ? buf : buf.subarray(start);
    }
  } catch (err) {
    if (err instanceof SyntaxError) throw new ForkdError(`malformed line in the daemon's stream: ${err.message}`, { requestId: a.requestId, cause: err });
    throw a.readError(err);
  } finally {
    // The caller stopped at the last event: wait (briefly) for the end of
    // the answer, which follows at once, so that the connection is free for
    // the next request instead of a new one being opened.
    if (sawLast) await drainEnd(a.res, 1000);
  }
  if (buf !== undefined && buf.length > 0) {
    const line = buf.toString("utf8").trim();
    if (line) {
      try {
        yield JSON.parse(line) as T;
      } catch (err) {
        throw a.readError(err, "the stream ended inside a line");
      }
    }
  }
}
