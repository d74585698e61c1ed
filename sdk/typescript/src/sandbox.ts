import { randomBytes } from "node:crypto";
import { Client, type CallOptions, type ForkOptions, type ListSandboxesOptions, type SetTimeoutOptions, type WaitReadyOptions } from "./client.js";
import { runCode, type Execution, type RunCodeOptions } from "./code.js";
import { Commands } from "./commands.js";
import { resolveConnection, type ConnectionOptions } from "./connection.js";
import { Files } from "./files.js";
import { Pty } from "./pty.js";
import type { SandboxContext } from "./internal.js";
import { InvalidArgumentError, NotFoundError } from "./errors.js";
import {
  networkFromWire,
  networkToWire,
  portFromWire,
  sandboxFromWire,
  snapshotFromWire,
  type NetworkPolicyInput,
  type PortInfo,
  type SandboxInfo,
  type SandboxNetwork,
  type SnapshotInfo,
} from "./types.js";

export interface ConnectOptions extends ConnectionOptions {
  /** A client to use instead of one built from the connection options. */
  client?: Client;
}

export interface SandboxOptions extends ConnectOptions, ForkOptions {}

export type BranchMode = "diff" | "full" | "live";

export interface BranchOptions extends CallOptions {
  /** The new snapshot's tag. Default: `<source tag>-br-<random>`. */
  tag?: string;
  /**
   * diff (default): a layer over the sandbox's own snapshot; full: a
   * self-contained snapshot; live: copied while the sandbox keeps running.
   */
  mode?: BranchMode;
  /**
   * false: answer as soon as the sandbox runs again, with the snapshot still
   * being written (state "writing"); call waitReady() before forking from
   * it. Default true: resolve once the snapshot is ready.
   */
  wait?: boolean;
}

/** What branch() did. */
export interface BranchResult {
  /** The new snapshot ("writing" when made with `wait: false`). */
  snapshot: SnapshotInfo;
  /** Its tag, to fork from: `Sandbox.create(result.tag)`. */
  tag: string;
  /** How long the source sandbox was paused, in ms. */
  pauseMs: number;
  bytesWritten: number;
  totalMs: number;
  /** Polls the snapshot until it is ready (rejects with SnapshotFailedError if it failed). */
  waitReady(opts?: WaitReadyOptions): Promise<SnapshotInfo>;
}

const defaultClients = new Map<string, Client>();

/** The client for connection options: a shared one per daemon and settings. */
function clientFor(opts: ConnectOptions): Client {
  if (opts.client) return opts.client;
  const conn = resolveConnection(opts);
  const key = JSON.stringify([conn.socket, conn.url, conn.token, conn.ca?.toString("base64"), conn.requestTimeoutMs, conn.retries, conn.headers]);
  let c = defaultClients.get(key);
  if (!c) {
    c = new Client(opts);
    defaultClients.set(key, c);
  }
  return c;
}

function forkOptions(opts: SandboxOptions): ForkOptions {
  const out: ForkOptions = {};
  if (opts.timeoutS !== undefined) out.timeoutS = opts.timeoutS;
  if (opts.idleTimeoutS !== undefined) out.idleTimeoutS = opts.idleTimeoutS;
  if (opts.metadata !== undefined) out.metadata = opts.metadata;
  if (opts.network !== undefined) out.network = opts.network;
  if (opts.cpus !== undefined) out.cpus = opts.cpus;
  if (opts.pullPolicy !== undefined) out.pullPolicy = opts.pullPolicy;
  if (opts.registryUsername !== undefined) out.registryUsername = opts.registryUsername;
  if (opts.registryPassword !== undefined) out.registryPassword = opts.registryPassword;
  if (opts.signal !== undefined) out.signal = opts.signal;
  return out;
}

/**
 * A running microVM forked from a snapshot.
 *
 * ```ts
 * const sb = await Sandbox.create("python");
 * try {
 *   const r = await sb.commands.run("echo hi");
 * } finally {
 *   await sb.kill();
 * }
 * ```
 */
export class Sandbox {
  /** The sandbox's id. */
  readonly id: string;
  /** The client it talks through. */
  readonly client: Client;
  /** Processes: run(), stream(), background commands. */
  readonly commands: Commands;
  /** The filesystem: read(), write(), list(), ... */
  readonly files: Files;
  /** Interactive terminals: create(), sendInput(), resize(), kill(). */
  readonly pty: Pty;
  /** What the daemon said about it when it was created or connected to. */
  readonly initialInfo: SandboxInfo | undefined;

  /** @internal Use Sandbox.create(), fork() or connect(). */
  constructor(id: string, client: Client, info?: SandboxInfo) {
    this.id = id;
    this.client = client;
    this.initialInfo = info;
    const ctx: SandboxContext = {
      id,
      transport: client.transport,
      describeFate: () => this.describeFate(),
    };
    this.commands = new Commands(ctx);
    this.files = new Files(ctx);
    this.pty = new Pty(ctx, this.commands);
    this.ctx = ctx;
  }

  private readonly ctx: SandboxContext;

  /** E2B's name for {@link id}. */
  get sandboxId(): string {
    return this.id;
  }

  /** The snapshot tag it was forked from. */
  get tag(): string | undefined {
    return this.initialInfo?.tag;
  }

  /**
   * Forks one sandbox from a snapshot: a local tag, or a registry reference
   * (`host[:port]/repository:tag` or `...@sha256:...`) that `forkd push`
   * wrote, which the daemon pulls for your tenant on first use (see
   * `pullPolicy`, and `registryUsername`/`registryPassword` for a registry
   * that needs a login).
   */
  static async create(tag: string, opts: SandboxOptions = {}): Promise<Sandbox> {
    const [sb] = await Sandbox.fork(tag, 1, opts);
    return sb!;
  }

  /** Forks `n` sandboxes from a snapshot tag at once (all or nothing). */
  static async fork(tag: string, n: number, opts: SandboxOptions = {}): Promise<Sandbox[]> {
    const client = clientFor(opts);
    const res = await client.sandboxes.fork(tag, n, forkOptions(opts));
    return res.sandboxes.map((info) => new Sandbox(info.id, client, info));
  }

  /** Attaches to a running sandbox by id; NotFoundError when there is none. */
  static async connect(id: string, opts: ConnectOptions & CallOptions = {}): Promise<Sandbox> {
    const client = clientFor(opts);
    const info = await client.sandboxes.get(id, opts.signal ? { signal: opts.signal } : {});
    return new Sandbox(info.id, client, info);
  }

  /** Lists sandboxes (filters: tag, state, metadata). */
  static async list(opts: ConnectOptions & ListSandboxesOptions = {}): Promise<SandboxInfo[]> {
    return clientFor(opts).sandboxes.list(opts);
  }

  /** Kills a sandbox by id; resolves false when there was none. */
  static async kill(id: string, opts: ConnectOptions & CallOptions = {}): Promise<boolean> {
    return new Sandbox(id, clientFor(opts)).kill(opts);
  }

  /** What the daemon says about the sandbox now. */
  async info(opts: CallOptions = {}): Promise<SandboxInfo> {
    return this.client.sandboxes.get(this.id, opts);
  }

  /** E2B's name for {@link info}. */
  getInfo(opts: CallOptions = {}): Promise<SandboxInfo> {
    return this.info(opts);
  }

  /** Whether the sandbox is running (false when it is gone). */
  async isRunning(opts: CallOptions = {}): Promise<boolean> {
    try {
      return (await this.info(opts)).state === "running";
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  /** Kills the sandbox. Resolves true when it was killed, false when it was already gone. */
  async kill(opts: CallOptions = {}): Promise<boolean> {
    try {
      await this.client.transport.json({
        method: "DELETE",
        path: `/v1/sandboxes/${encodeURIComponent(this.id)}`,
        signal: opts.signal,
        what: `kill sandbox ${this.id}`,
      });
      return true;
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  /** The sandbox's network policy and traffic counters. */
  async getNetwork(opts: CallOptions = {}): Promise<SandboxNetwork> {
    const w = await this.client.transport.json<Record<string, unknown> | null>({
      method: "GET",
      path: `/v1/sandboxes/${encodeURIComponent(this.id)}/network`,
      signal: opts.signal,
      what: `get network of sandbox ${this.id}`,
    });
    return networkFromWire(w);
  }

  /**
   * Changes what the running sandbox may reach, at once (its rules change in
   * one step; addresses opened by earlier DNS answers close). Resolves with
   * the network as it now is. A malformed policy, or one the daemon refuses
   * (a reserved range it does not permit), rejects with InvalidArgumentError;
   * a sandbox that is not running with ConflictError.
   */
  /**
   * Ends the sandbox `timeoutS` seconds from now (0: never), whatever its
   * timeout was: call it again to keep a sandbox alive. `idleTimeoutS`
   * replaces its idle timeout. Resolves to the sandbox as it now is.
   */
  async setTimeout(timeoutS: number, opts: SetTimeoutOptions = {}): Promise<SandboxInfo> {
    return this.client.sandboxes.setTimeout(this.id, timeoutS, opts);
  }

  async setNetwork(policy: NetworkPolicyInput, opts: CallOptions = {}): Promise<SandboxNetwork> {
    const body = networkToWire(policy);
    const w = await this.client.transport.json<Record<string, unknown> | null>({
      method: "PUT",
      path: `/v1/sandboxes/${encodeURIComponent(this.id)}/network`,
      json: body,
      signal: opts.signal,
      what: `set network of sandbox ${this.id}`,
    });
    return networkFromWire(w);
  }

  /**
   * Where the daemon serves TCP `port` of this sandbox: the proxy `path` on
   * its API and, when it routes a domain to sandbox ports, the `host`.
   * Nothing checks that a server listens yet; it must listen on 0.0.0.0, not
   * 127.0.0.1.
   */
  async getPort(port: number, opts: CallOptions = {}): Promise<PortInfo> {
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new InvalidArgumentError(`port ${String(port)}: want an integer from 1 to 65535`, { code: "invalid_argument" });
    }
    const w = await this.client.transport.json<Record<string, unknown>>({
      method: "GET",
      path: `/v1/sandboxes/${encodeURIComponent(this.id)}/ports/${port}`,
      signal: opts.signal,
      what: `get port ${port} of sandbox ${this.id}`,
    });
    return portFromWire(w);
  }

  /**
   * Where to reach a server listening on `port` inside the sandbox (E2B's
   * getHost, but asynchronous: it asks the daemon); HTTP and WebSocket
   * requests there are proxied to it.
   *
   * Resolves with the host `PORT-ID.DOMAIN` (no scheme) when the daemon
   * routes a domain to sandbox ports (`forkd serve --port-domain`), like
   * E2B. Otherwise with the full URL of the port's proxy path on this
   * client's daemon, `BASE/v1/sandboxes/ID/ports/PORT/`, to which the app's
   * own path is appended.
   *
   * Requests to either go through the daemon's API: a TCP daemon wants this
   * client's token (`Authorization: Bearer TOKEN`; the daemon removes it
   * before the app sees the request). For a client on the daemon's Unix
   * socket the URL is `http://forkd/v1/...`, reachable only through that
   * socket (e.g. `curl --unix-socket /run/forkd/forkd.sock URL`, or node's
   * `http.request({ socketPath })`), not from a browser; `forkd port-forward`
   * gives a local TCP port instead.
   */
  async getHost(port: number, opts: CallOptions = {}): Promise<string> {
    const info = await this.getPort(port, opts);
    if (info.host) return info.host;
    const conn = this.client.transport.conn;
    const base = conn.socket !== undefined ? "http://forkd" : conn.url!;
    return base + info.path;
  }

  /**
   * Runs Python in the sandbox's warm session (variables persist across
   * calls). A Python exception is `execution.error`, not a rejection; a
   * timeout rejects with TimeoutError. Needs a snapshot with a Python
   * session (ConflictError otherwise).
   */
  runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    return runCode(this.ctx, code, opts);
  }

  /**
   * Snapshots the running sandbox into a new tag that forks like any other;
   * the sandbox keeps running. With `wait: false` it resolves as soon as the
   * sandbox runs again and the snapshot is still being written.
   */
  async branch(opts: BranchOptions = {}): Promise<BranchResult> {
    let newTag = opts.tag;
    if (newTag === undefined) {
      const base = (this.initialInfo?.tag ?? (await this.info(opts.signal ? { signal: opts.signal } : {})).tag ?? "sandbox").slice(0, 64 - 10);
      newTag = `${base}-br-${randomBytes(3).toString("hex")}`;
    }
    const req: Record<string, unknown> = { tag: newTag };
    if (opts.mode !== undefined) req.mode = opts.mode;
    if (opts.wait === false) req.no_wait = true;
    const out = await this.client.transport.json<{ snapshot: Record<string, unknown>; pause_ms: number; bytes_written: number; total_ms: number }>({
      method: "POST",
      path: `/v1/sandboxes/${encodeURIComponent(this.id)}/branch`,
      json: req,
      signal: opts.signal,
      what: `branch sandbox ${this.id}`,
    });
    const snapshots = this.client.snapshots;
    let snapshot = snapshotFromWire(out.snapshot);
    const tag = snapshot.tag || newTag;
    if (opts.wait !== false && snapshot.state === "writing") {
      snapshot = await snapshots.waitReady(tag, opts.signal ? { signal: opts.signal } : {});
    }
    return {
      snapshot,
      tag,
      pauseMs: out.pause_ms,
      bytesWritten: out.bytes_written,
      totalMs: out.total_ms,
      waitReady: (wopts: WaitReadyOptions = {}) => snapshots.waitReady(tag, wopts),
    };
  }

  /** `await using sb = await Sandbox.create(tag)` kills it at the end of the scope. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill();
  }

  /**
   * For cut streams: what became of this sandbox. A kill cuts the streams
   * a moment before the daemon marks the sandbox stopped, so a sandbox
   * still "running" is asked again for up to about 1.5 s.
   */
  private async describeFate(): Promise<string> {
    for (let attempt = 0; ; attempt++) {
      try {
        const w = await this.client.transport.json<Record<string, unknown>>({
          method: "GET",
          path: `/v1/sandboxes/${encodeURIComponent(this.id)}`,
          timeoutMs: 3000,
          what: `get sandbox ${this.id}`,
        });
        const info = sandboxFromWire(w);
        if (info.state === "running") {
          if (attempt < 6) {
            await new Promise((r) => setTimeout(r, 250));
            continue;
          }
          return "";
        }
        if (info.state === "stopped") return `sandbox ${this.id} was killed`;
        return `sandbox ${this.id} is ${info.state}${info.deadReason ? `: ${info.deadReason}` : ""}`;
      } catch (err) {
        if (err instanceof NotFoundError) return `sandbox ${this.id} is gone: it was killed or timed out`;
        return "";
      }
    }
  }
}
