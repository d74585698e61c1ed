import { createReadStream, createWriteStream, promises as fsp } from "node:fs";
import { randomBytes } from "node:crypto";
import { pipeline } from "node:stream/promises";
import { Readable, type Writable } from "node:stream";
import {
  Transport,
  ndjson,
  resolveConnection,
  type Answer,
  type BodySource,
  type ConnectionOptions,
} from "./connection.js";
import { contextToWire, type BuildContextInput } from "./context.js";
import { ForkdError, InvalidArgumentError, NotFoundError, SnapshotFailedError, StreamCutError, TimeoutError, errorFromProblem, type Problem } from "./errors.js";
import {
  imageFromWire,
  networkToWire,
  sandboxFromWire,
  snapshotFromWire,
  versionFromWire,
  type DoctorCheck,
  type HealthInfo,
  type ImageInfo,
  type NetworkPolicyInput,
  type SandboxInfo,
  type SandboxState,
  type SnapshotInfo,
  type VersionInfo,
} from "./types.js";

export interface CallOptions {
  signal?: AbortSignal;
}

export interface CreateSnapshotOptions extends CallOptions {
  /** The new tag: lowercase letters, digits, ".", "_", "-"; up to 64 characters. */
  tag: string;
  /**
   * A recipe the daemon knows (recipes/NAME.toml). Give exactly one of
   * recipe, recipeToml, from and dockerfile.
   */
  recipe?: string;
  /** A recipe file's contents. */
  recipeToml?: string;
  /**
   * An OCI image reference to build from with forkd's defaults
   * ("registry.example.com/python:3.12-slim").
   */
  from?: string;
  /** Allow a plain-HTTP registry or an untrusted TLS certificate for the image built from. */
  insecureRegistry?: boolean;
  /**
   * A Dockerfile's contents (a string, not a path): its FROM, RUN, COPY/ADD
   * of context files, ENV, WORKDIR, USER and ARG are built in microVMs.
   */
  dockerfile?: string;
  /** With dockerfile: the image's recipe name (default "dockerfile"). */
  name?: string;
  /** With dockerfile: values overriding its ARG defaults. */
  buildArgs?: Readonly<Record<string, string>>;
  /**
   * The build context: the files a Dockerfile's COPY/ADD or a recipe's
   * `files` name, since the daemon never reads the client's paths. A local
   * directory (read recursively: regular files with their permission bits)
   * or a record of relative path to contents (mode 0644). At most 64 MiB and
   * 100000 files, checked before sending.
   */
  context?: BuildContextInput;
  /**
   * The egress policy of the build VMs that run RUN steps (the forms of
   * {@link network}; default: the daemon's).
   */
  buildNetwork?: NetworkPolicyInput;
  /**
   * Credentials for the pull of the image built from (`from`, a
   * Dockerfile's or a recipe's FROM), sent only when set. A tenant's build
   * uses only these, never the daemon's logins; an admin's without them
   * uses the daemon's.
   */
  registryUsername?: string;
  /** See {@link registryUsername}. Never shown in an error message. */
  registryPassword?: string;
  /** Python warm-up code, replacing the recipe's. */
  warm?: string;
  /** Memory in MiB (default: the recipe's). */
  memoryMib?: number;
  /** vCPUs (default: the recipe's). */
  vcpus?: number;
  /**
   * The network policy the snapshot's sandboxes get unless their fork names
   * one (default: the daemon's). See {@link NetworkPolicyInput}.
   */
  network?: NetworkPolicyInput;
  /** Called with each progress line as the daemon builds and warms. */
  onProgress?: (message: string) => void;
  /**
   * A retry with the same key and options (within 24 hours) follows the
   * first create instead of starting another. 1 to 255 printable ASCII
   * characters (a UUID).
   */
  idempotencyKey?: string;
}

/** A long operation the daemon owns (`GET /v1/operations/{id}`). */
export interface OperationInfo {
  id: string;
  /** image.build, snapshot.create, snapshot.compact or sandbox.branch. */
  kind: string;
  /** The recipe, or the tag being written. */
  target: string;
  /** running, succeeded, failed or cancelled. */
  state: string;
  cancelRequested: boolean;
  progress: string[];
  /** The current step's byte progress, where known (0: unknown). */
  doneBytes: number;
  totalBytes: number;
  /** What it made, once succeeded (a snapshot, an image, a branch). */
  result?: Record<string, unknown>;
  /** Why it failed or was cancelled. */
  error?: Problem;
  raw: Record<string, unknown>;
}

export interface WaitOperationOptions extends CallOptions {
  /** Called with each progress line. */
  onProgress?: (message: string) => void;
}

export interface DeleteSnapshotOptions extends CallOptions {
  /** Also delete the snapshots whose chains need this one (its dependents). */
  cascade?: boolean;
  /** Delete it even though other snapshots depend on it. */
  force?: boolean;
}

export interface WaitReadyOptions extends CallOptions {
  /** Give up after this many ms with TimeoutError. Default 600000; 0: no limit. */
  timeoutMs?: number;
  /** Poll interval in ms. Default 200. */
  intervalMs?: number;
}

export interface PackOptions extends CallOptions {
  /** Include the image's bytes (default true); without, the receiving host needs the image. */
  image?: boolean;
}

export interface PackResult {
  tag: string;
  /** Size of the archive in bytes. */
  bytes: number;
}

/** An archive: a file path, bytes, or a stream. */
export type ArchiveSource = string | Uint8Array | Readable | AsyncIterable<Uint8Array>;

export interface UnpackOptions extends CallOptions {
  /** Tag to create instead of the archive's. */
  tag?: string;
  /** Replace an existing snapshot with the same tag, atomically. */
  force?: boolean;
  /** Refuse archives not signed by this ed25519 public key (32 bytes, or their base64url). */
  verifyKey?: Uint8Array | string;
}

export interface ListSandboxesOptions extends CallOptions {
  /** Only children of this snapshot tag. */
  tag?: string;
  /** Only sandboxes in this state. */
  state?: SandboxState;
  /** Only sandboxes whose metadata has all these key/value pairs. */
  metadata?: Record<string, string>;
}

/** A new sandbox's lifetime in seconds when its fork names none: five minutes, as E2B. */
export const DEFAULT_SANDBOX_TIMEOUT_S = 300;

/** A lifetime for the wire: whole seconds, a part of one counting as one (0.5 is not "never"). */
function wholeSeconds(v: number, what: string): number {
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0) {
    throw new InvalidArgumentError(`${what} ${v}: want a finite number of seconds >= 0 (0: no limit)`, { code: "invalid_argument" });
  }
  return Math.ceil(v);
}

export interface SetTimeoutOptions extends CallOptions {
  /** Also replace the idle timeout, in seconds (0: none). */
  idleTimeoutS?: number;
}

/** When a fork by registry reference pulls (ForkOptions.pullPolicy). */
export type PullPolicy = "if_not_present" | "always";

/** The pull policies, the daemon's default first. */
export const PULL_POLICIES: readonly PullPolicy[] = ["if_not_present", "always"];

/**
 * Whether a fork's tag is a registry reference (host[:port]/repository:tag
 * or @sha256:...) rather than a local tag: the daemon's rule, a "/".
 */
function isReference(tag: string): boolean {
  return tag.includes("/");
}

/**
 * The registry_username/registry_password of a request body, each only when
 * set (an empty string is not set). A message never shows the password.
 */
function registryCredentials(opts: { registryUsername?: string | undefined; registryPassword?: string | undefined }): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [key, wire, v] of [
    ["registryUsername", "registry_username", opts.registryUsername],
    ["registryPassword", "registry_password", opts.registryPassword],
  ] as const) {
    if (v === undefined || v === null) continue;
    if (typeof v !== "string") throw new InvalidArgumentError(`${key} must be a string, not ${typeof v}`, { code: "invalid_argument" });
    if (v !== "") out[wire] = v;
  }
  return out;
}

export interface ForkOptions extends CallOptions {
  /**
   * End each sandbox this many seconds after it was created. Default
   * {@link DEFAULT_SANDBOX_TIMEOUT_S} (five minutes, as E2B); 0: no limit;
   * null: the daemon's default (an hour unless configured). Extend a
   * running one with `sandbox.setTimeout()`.
   */
  timeoutS?: number | null;
  /** End a sandbox that received no request for this many seconds (0 or unset: no limit). */
  idleTimeoutS?: number;
  /** CPU limit of each sandbox (0.5: half a CPU), from 0.1 to the snapshot's vCPUs; unset: one CPU per vCPU plus half a CPU for its VMM. */
  cpus?: number;
  /**
   * Only when the tag is a registry reference: when the daemon pulls it.
   * "if_not_present" (the daemon's default) forks the copy an earlier fork
   * pulled; "always" pulls when the registry's digest for it moved.
   */
  pullPolicy?: PullPolicy;
  /**
   * Only when the tag is a registry reference: credentials for its pull,
   * sent only when set (without them it is anonymous; the daemon's own
   * logins are never used). Set with a local tag: InvalidArgumentError.
   */
  registryUsername?: string;
  /** See {@link registryUsername}. Never shown in an error message. */
  registryPassword?: string;
  /** Labels for the sandboxes; list() filters on them. */
  metadata?: Record<string, string>;
  /**
   * What the sandboxes may reach: "none", "public", "allow:ENTRY,ENTRY",
   * `{ mode: "allow", allow: ["198.51.100.0/24", "*.example.com"] }`, ...
   * (see {@link NetworkPolicyInput}). Default: the snapshot's policy, else
   * the daemon's. Change it later with `sandbox.setNetwork()`.
   */
  network?: NetworkPolicyInput;
  /**
   * A retry with the same key and options (within 24 hours) gets the first
   * fork's sandboxes, not new ones: set it when retrying a fork whose
   * answer was lost.
   */
  idempotencyKey?: string;
}

export interface ForkResult {
  sandboxes: SandboxInfo[];
  totalMs: number;
}

function tagPath(tag: string): string {
  return `/v1/snapshots/${encodeURIComponent(tag)}`;
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });

function invalidArgument(msg: string): InvalidArgumentError {
  return new InvalidArgumentError(msg, { code: "invalid_argument" });
}

/** The POST /v1/snapshots body; reads a context directory. */
async function createBody(opts: CreateSnapshotOptions): Promise<Record<string, unknown>> {
  const sources: [string, string | undefined][] = [
    ["recipe", opts.recipe],
    ["recipe_toml", opts.recipeToml],
    ["from", opts.from],
    ["dockerfile", opts.dockerfile],
  ];
  const given = sources.filter(([, v]) => v !== undefined);
  if (given.length !== 1) throw invalidArgument("give exactly one of recipe, recipeToml, from and dockerfile");
  const [key, src] = given[0]!;
  if (typeof src !== "string" || src === "") throw invalidArgument(`${key === "recipe_toml" ? "recipeToml" : key} must be a non-empty string`);
  if (opts.dockerfile === undefined && (opts.name !== undefined || opts.buildArgs !== undefined)) {
    throw invalidArgument("name and buildArgs go with dockerfile");
  }
  if (opts.from !== undefined && opts.context !== undefined) {
    throw invalidArgument("context goes with a recipe's files or a Dockerfile's COPY, not with from");
  }
  const args: Record<string, string> = {};
  for (const [k, v] of Object.entries(opts.buildArgs ?? {})) {
    if (k === "" || typeof v !== "string") throw invalidArgument(`buildArgs: want a record of name to string, not ${JSON.stringify(k)}: ${JSON.stringify(v)}`);
    args[k] = v;
  }
  const req: Record<string, unknown> = { tag: opts.tag, [key]: src };
  if (opts.insecureRegistry) req.insecure_registry = true;
  if (opts.name) req.name = opts.name;
  if (Object.keys(args).length > 0) req.build_args = args;
  if (opts.network !== undefined) req.network = networkToWire(opts.network);
  if (opts.buildNetwork !== undefined) req.build_network = networkToWire(opts.buildNetwork);
  Object.assign(req, registryCredentials(opts));
  if (opts.warm !== undefined) req.warm = opts.warm;
  if (opts.memoryMib !== undefined) req.memory_mib = opts.memoryMib;
  if (opts.vcpus !== undefined) req.vcpus = opts.vcpus;
  if (opts.context !== undefined) {
    const files = await contextToWire(opts.context);
    if (files.length > 0) req.context = files;
  }
  return req;
}

/** Snapshot tags: `client.snapshots`. */
export class Snapshots {
  /** @internal */
  constructor(private readonly t: Transport) {}

  /**
   * Builds an image (from a recipe, an OCI image or a Dockerfile and its
   * context), boots it, warms it and saves it as a snapshot to fork from,
   * reporting progress. Resolves with the ready snapshot. The daemon owns
   * the work (an operation, see {@link startCreate}): aborting this call
   * does not stop it; `client.operations.cancel(id)` does.
   */
  async create(opts: CreateSnapshotOptions): Promise<SnapshotInfo> {
    const a = await this.postCreate(opts);
    if (a.status === 202) {
      const op = await readOperation(a);
      const end = await new Operations(this.t).wait(op.id, { signal: opts.signal, onProgress: opts.onProgress });
      return snapshotFromWire(operationResult(end));
    }
    return this.legacyStream(a, opts);
  }

  /**
   * Starts a snapshot create and resolves with its operation at once;
   * `client.operations.wait(op.id)` follows it (its result is the snapshot).
   */
  async startCreate(opts: CreateSnapshotOptions): Promise<OperationInfo> {
    const a = await this.postCreate(opts);
    if (a.status !== 202) {
      a.abort();
      a.finish();
      throw new ForkdError(`create snapshot ${opts.tag}: the daemon at ${this.t.where} does not run creates as operations; upgrade it, or use create()`);
    }
    return readOperation(a);
  }

  private async postCreate(opts: CreateSnapshotOptions) {
    const req = await createBody(opts);
    const headers = { ...idempotencyHeaders(opts.idempotencyKey), prefer: "respond-async" };
    return this.t.request({ method: "POST", path: "/v1/snapshots", json: req, headers, signal: opts.signal, what: `create snapshot ${opts.tag}` });
  }

  /** The progress stream a daemon from before operations answers. */
  private async legacyStream(a: Answer, opts: CreateSnapshotOptions): Promise<SnapshotInfo> {
    let final = false;
    try {
      for await (const line of ndjson<{ message?: string; error?: Problem; snapshot?: Record<string, unknown> }>(a)) {
        if (line.error) {
          final = true;
          throw errorFromProblem(line.error, a.requestId ? { requestId: a.requestId } : {});
        }
        if (line.snapshot) {
          final = true;
          return snapshotFromWire(line.snapshot);
        }
        if (line.message !== undefined) opts.onProgress?.(line.message);
      }
    } catch (err) {
      if (!final) a.abort(err instanceof Error ? err : new Error(String(err)));
      throw err;
    } finally {
      a.finish();
    }
    throw new StreamCutError(`create snapshot ${opts.tag}: the progress stream ended without a result (did the daemon at ${this.t.where} stop?)`, a.requestId ? { requestId: a.requestId } : {});
  }

  /** All snapshot tags. */
  async list(opts: CallOptions = {}): Promise<SnapshotInfo[]> {
    const out = await this.t.list<Record<string, unknown>>({ method: "GET", path: "/v1/snapshots", signal: opts.signal, what: "list snapshots" });
    return out.map(snapshotFromWire);
  }

  /** One snapshot; NotFoundError when there is no such tag. */
  async get(tag: string, opts: CallOptions = {}): Promise<SnapshotInfo> {
    return snapshotFromWire(await this.t.json({ method: "GET", path: tagPath(tag), signal: opts.signal, what: `get snapshot ${tag}` }));
  }

  /** Whether a tag exists (in any state). */
  async exists(tag: string, opts: CallOptions = {}): Promise<boolean> {
    try {
      await this.get(tag, opts);
      return true;
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  /**
   * Writes a flat copy (depth 0, no parent) of a snapshot, typically the
   * head of a deep chain of branches, under a new tag.
   */
  async compact(tag: string, to: string, opts: CallOptions = {}): Promise<SnapshotInfo> {
    return snapshotFromWire(
      await this.t.json({ method: "POST", path: tagPath(tag) + "/compact", json: { to }, signal: opts.signal, timeoutMs: 0, what: `compact snapshot ${tag}` }),
    );
  }

  /**
   * Deletes a tag; running sandboxes forked from it keep working. A snapshot
   * other snapshots depend on (branches) is refused with ConflictError naming
   * them, unless `cascade` (delete them too) or `force`. Resolves with the
   * tags removed: with `cascade`, the layers first (deepest first), `tag` last.
   */
  async delete(tag: string, opts: DeleteSnapshotOptions = {}): Promise<string[]> {
    const out = await this.t.json<{ removed?: string[] } | undefined>({
      method: "DELETE",
      path: tagPath(tag),
      query: { cascade: opts.cascade ? "true" : undefined, force: opts.force ? "true" : undefined },
      signal: opts.signal,
      what: `delete snapshot ${tag}`,
    });
    // A daemon from before the list answers 204, with no body.
    return out?.removed?.length ? out.removed : [tag];
  }

  /**
   * Polls a snapshot until it is ready (resolves with it) or failed
   * (rejects with SnapshotFailedError): for branches made with `wait: false`.
   */
  async waitReady(tag: string, opts: WaitReadyOptions = {}): Promise<SnapshotInfo> {
    const timeoutMs = opts.timeoutMs ?? 600_000;
    const interval = opts.intervalMs ?? 200;
    const deadline = timeoutMs > 0 ? Date.now() + timeoutMs : Infinity;
    for (;;) {
      const snap = await this.get(tag, opts);
      if (snap.state === "ready") return snap;
      if (snap.state === "failed") throw new SnapshotFailedError(tag, snap.error ?? "");
      if (Date.now() + interval > deadline) {
        throw new TimeoutError(`snapshot ${JSON.stringify(tag)} is still ${snap.state} after ${timeoutMs} ms`, { code: "deadline_exceeded" });
      }
      await sleep(interval, opts.signal);
    }
  }

  /**
   * Exports a snapshot, with the image it boots, as a portable archive
   * (zstd-compressed tar): to a file path (written to a temporary name and
   * renamed when complete) or to a Writable (ended when complete, destroyed
   * on failure). A cut stream rejects; it never leaves a short archive at
   * the path.
   */
  async pack(tag: string, dest: string | Writable, opts: PackOptions = {}): Promise<PackResult> {
    const a = await this.t.request({
      method: "GET",
      path: tagPath(tag) + "/archive",
      query: { image: opts.image === false ? "0" : undefined },
      signal: opts.signal,
      what: `pack snapshot ${tag}`,
    });
    let bytes = 0;
    a.res.on("data", (c: Buffer) => {
      bytes += c.length;
    });
    const complete = () => {
      if (!a.res.complete) throw new Error("connection closed before the end of the archive");
    };
    try {
      if (typeof dest === "string") {
        const tmp = `${dest}.partial-${randomBytes(4).toString("hex")}`;
        try {
          await pipeline(a.res, createWriteStream(tmp));
          complete();
          await fsp.rename(tmp, dest);
        } catch (err) {
          await fsp.rm(tmp, { force: true });
          throw err;
        }
      } else {
        await pipeline(a.res, dest);
        complete();
      }
    } catch (err) {
      // A local write error (the destination) is the caller's: as it is.
      const sys = (err as NodeJS.ErrnoException).syscall;
      if (sys !== undefined && sys !== "read" && !(err instanceof ForkdError)) throw err;
      throw a.readError(err, `the archive of ${tag} was cut after ${bytes} bytes`);
    } finally {
      a.finish();
    }
    return { tag, bytes };
  }

  /**
   * Imports an archive made by pack() (or `forkd pack`): the daemon verifies
   * every byte before the tag appears. Resolves with the new snapshot.
   */
  async unpack(src: ArchiveSource, opts: UnpackOptions = {}): Promise<SnapshotInfo> {
    let body: BodySource;
    if (typeof src === "string") {
      try {
        await fsp.access(src);
      } catch (err) {
        throw new InvalidArgumentError(`archive ${src}: ${(err as Error).message}`, { code: "invalid_argument", cause: err });
      }
      body = createReadStream(src);
    } else {
      body = src as BodySource;
    }
    let verifyKey: string | undefined;
    if (opts.verifyKey !== undefined) {
      if (typeof opts.verifyKey === "string") verifyKey = opts.verifyKey;
      else if (opts.verifyKey.byteLength !== 32) {
        throw new InvalidArgumentError(`verify key has ${opts.verifyKey.byteLength} bytes, want 32 (an ed25519 public key)`, { code: "invalid_argument" });
      } else verifyKey = Buffer.from(opts.verifyKey).toString("base64url");
    }
    const out = await this.t.json<Record<string, unknown>>({
      method: "POST",
      path: "/v1/snapshots/import",
      query: { tag: opts.tag, force: opts.force ? "1" : undefined, verify_key: verifyKey },
      headers: { "content-type": "application/zstd" },
      body,
      signal: opts.signal,
      timeoutMs: 0,
      what: "unpack archive",
    });
    return snapshotFromWire(out);
  }
}

/** Sandboxes as data (`client.sandboxes`); see {@link Sandbox} to work inside one. */
export class Sandboxes {
  /** @internal */
  constructor(private readonly t: Transport) {}

  /** Sandboxes, optionally filtered by tag, state and metadata labels. */
  async list(opts: ListSandboxesOptions = {}): Promise<SandboxInfo[]> {
    const labels = Object.entries(opts.metadata ?? {}).map(([k, v]) => `${k}=${v}`);
    const out = await this.t.list<Record<string, unknown>>({
      method: "GET",
      path: "/v1/sandboxes",
      query: { tag: opts.tag, state: opts.state, label: labels.length ? labels : undefined },
      signal: opts.signal,
      what: "list sandboxes",
    });
    return out.map(sandboxFromWire);
  }

  /** One sandbox; NotFoundError when there is no such id. */
  async get(id: string, opts: CallOptions = {}): Promise<SandboxInfo> {
    return sandboxFromWire(await this.t.json({ method: "GET", path: `/v1/sandboxes/${encodeURIComponent(id)}`, signal: opts.signal, what: `get sandbox ${id}` }));
  }

  /**
   * Ends a running sandbox `timeoutS` seconds from now (0: never), whatever
   * its timeout was (E2B's setTimeout, in seconds). Resolves to the sandbox
   * as it now is. InvalidArgumentError: negative or over 7 days;
   * ConflictError: it is dead or already ending; NotFoundError: no such
   * sandbox (an expired one is forgotten).
   */
  async setTimeout(id: string, timeoutS: number, opts: SetTimeoutOptions = {}): Promise<SandboxInfo> {
    const req: Record<string, unknown> = { timeout_s: wholeSeconds(timeoutS, "timeoutS") };
    if (opts.idleTimeoutS !== undefined) req.idle_timeout_s = wholeSeconds(opts.idleTimeoutS, "idleTimeoutS");
    return sandboxFromWire(
      await this.t.json({ method: "PATCH", path: `/v1/sandboxes/${encodeURIComponent(id)}`, json: req, signal: opts.signal, what: `set timeout of sandbox ${id}` }),
    );
  }

  /**
   * Forks `count` sandboxes from a snapshot; resolves when every one
   * answers (all or nothing). `tag` is a local tag, or a registry reference
   * (`host[:port]/repository:tag` or `...@sha256:...`) that `forkd push`
   * wrote: the daemon pulls it for your tenant on first use (anonymously
   * unless `registryUsername` and `registryPassword` are set), and later
   * forks use its copy (see `pullPolicy`).
   */
  async fork(tag: string, count: number, opts: ForkOptions = {}): Promise<ForkResult> {
    if (!Number.isInteger(count) || count < 1) throw new InvalidArgumentError(`fork count ${count}: want an integer >= 1`, { code: "invalid_argument" });
    if (opts.pullPolicy !== undefined && !PULL_POLICIES.includes(opts.pullPolicy)) {
      throw new InvalidArgumentError(`pullPolicy ${JSON.stringify(opts.pullPolicy)}: want ${PULL_POLICIES.join(" or ")}`, { code: "invalid_argument" });
    }
    const creds = registryCredentials(opts);
    if (Object.keys(creds).length > 0 && !(typeof tag === "string" && isReference(tag))) {
      throw new InvalidArgumentError(
        `registryUsername and registryPassword authenticate a fork by registry reference (host[:port]/repository:tag), and ${JSON.stringify(tag)} is a local tag: drop them, or fork the reference`,
        { code: "invalid_argument" },
      );
    }
    const req: Record<string, unknown> = { tag, count };
    const timeoutS = opts.timeoutS === undefined ? DEFAULT_SANDBOX_TIMEOUT_S : opts.timeoutS;
    if (timeoutS !== null) req.timeout_s = wholeSeconds(timeoutS, "timeoutS");
    if (opts.idleTimeoutS) req.idle_timeout_s = Math.ceil(opts.idleTimeoutS);
    if (opts.metadata && Object.keys(opts.metadata).length) req.metadata = opts.metadata;
    if (opts.network !== undefined) req.network = networkToWire(opts.network);
    if (opts.cpus !== undefined) req.cpus = opts.cpus;
    if (opts.pullPolicy !== undefined) req.pull_policy = opts.pullPolicy;
    Object.assign(req, creds);
    const out = await this.t.json<{ sandboxes: Record<string, unknown>[]; total_ms: number }>({
      method: "POST",
      path: "/v1/sandboxes",
      json: req,
      headers: idempotencyHeaders(opts.idempotencyKey),
      signal: opts.signal,
      what: `fork ${count} from ${tag}`,
    });
    return { sandboxes: (out.sandboxes ?? []).map(sandboxFromWire), totalMs: out.total_ms };
  }

  /** Kills sandboxes by id; resolves with the ids killed. An unknown id rejects with NotFoundError. */
  async kill(ids: string | readonly string[], opts: CallOptions = {}): Promise<string[]> {
    const list = typeof ids === "string" ? [ids] : [...ids];
    if (list.length === 0) return [];
    const out = await this.t.json<{ killed: string[] }>({ method: "POST", path: "/v1/sandboxes/kill", json: { ids: list }, signal: opts.signal, what: "kill sandboxes" });
    return out.killed ?? [];
  }

  /** Kills every sandbox of the daemon; resolves with the ids killed. */
  async killAll(opts: CallOptions = {}): Promise<string[]> {
    const out = await this.t.json<{ killed: string[] }>({ method: "POST", path: "/v1/sandboxes/kill", json: { all: true }, signal: opts.signal, what: "kill all sandboxes" });
    return out.killed ?? [];
  }
}

/** Built guest images: `client.images`. */
export class Images {
  /** @internal */
  constructor(private readonly t: Transport) {}

  /** Built images, newest first. */
  async list(opts: CallOptions = {}): Promise<ImageInfo[]> {
    const out = await this.t.list<Record<string, unknown>>({ method: "GET", path: "/v1/images", signal: opts.signal, what: "list images" });
    return out.map(imageFromWire);
  }
}

/** The longest Idempotency-Key the daemon takes. */
const MAX_IDEMPOTENCY_KEY = 255;

function idempotencyHeaders(key: string | undefined): Record<string, string> {
  if (key === undefined) return {};
  if (key.length < 1 || key.length > MAX_IDEMPOTENCY_KEY || !/^[\x20-\x7e]+$/.test(key)) {
    throw new InvalidArgumentError(`idempotencyKey: want 1 to ${MAX_IDEMPOTENCY_KEY} printable ASCII characters (a UUID)`, { code: "invalid_argument" });
  }
  return { "idempotency-key": key };
}

function operationFromWire(w: Record<string, unknown>): OperationInfo {
  return {
    id: String(w.id ?? ""),
    kind: String(w.kind ?? ""),
    target: String(w.target ?? ""),
    state: String(w.state ?? ""),
    cancelRequested: Boolean(w.cancel_requested),
    progress: Array.isArray(w.progress) ? (w.progress as string[]) : [],
    doneBytes: Number(w.done_bytes ?? 0),
    totalBytes: Number(w.total_bytes ?? 0),
    result: (w.result as Record<string, unknown> | undefined) ?? undefined,
    error: (w.error as Problem | undefined) ?? undefined,
    raw: w,
  };
}

/** Reads a 202's operation. */
async function readOperation(a: Answer): Promise<OperationInfo> {
  let op: Record<string, unknown> | undefined;
  try {
    for await (const v of ndjson<Record<string, unknown>>(a)) op ??= v;
  } finally {
    a.finish();
  }
  if (!op) throw new StreamCutError("the daemon answered 202 without an operation", a.requestId ? { requestId: a.requestId } : {});
  return operationFromWire(op);
}

/** A finished operation's result, or its problem thrown. */
function operationResult(op: OperationInfo): Record<string, unknown> {
  if (op.state === "succeeded" && op.result) return op.result;
  if (op.error) throw errorFromProblem(op.error, {});
  throw new ForkdError(`operation ${op.id} ended ${op.state}`);
}

/**
 * Long operations the daemon owns (image builds, snapshot creates and
 * compacts, background branches): `client.operations`.
 */
export class Operations {
  /** @internal */
  constructor(private readonly t: Transport) {}

  /** Your tenant's operations (all for an admin), oldest first. */
  async list(opts: CallOptions = {}): Promise<OperationInfo[]> {
    const out = await this.t.list<Record<string, unknown>>({ method: "GET", path: "/v1/operations", signal: opts.signal, what: "list operations" });
    return out.map(operationFromWire);
  }

  /** One operation as it is now. */
  async get(id: string, opts: CallOptions = {}): Promise<OperationInfo> {
    return operationFromWire(await this.t.json({ method: "GET", path: `/v1/operations/${encodeURIComponent(id)}`, signal: opts.signal, what: `operation ${id}` }));
  }

  /**
   * Cancels a running operation (what it staged is removed: no tag is
   * left). Resolves at once with cancelRequested set; {@link wait} says
   * when it has ended. A finished one rejects with ConflictError.
   */
  async cancel(id: string, opts: CallOptions = {}): Promise<OperationInfo> {
    return operationFromWire(
      await this.t.json({ method: "POST", path: `/v1/operations/${encodeURIComponent(id)}/cancel`, signal: opts.signal, what: `cancel operation ${id}` }),
    );
  }

  /**
   * Follows an operation's events until it ends and resolves with it. A cut
   * stream re-attaches (the daemon sends the current state first), up to
   * three times in a row. Aborting the signal stops following, not the work.
   */
  async wait(id: string, opts: WaitOperationOptions = {}): Promise<OperationInfo> {
    let seen = 0;
    // Cuts count in a row: any event received resets them.
    for (let cuts = 0; cuts < 3; cuts++) {
      const a = await this.t.request({
        method: "GET",
        path: `/v1/operations/${encodeURIComponent(id)}/events`,
        headers: { accept: "application/x-ndjson" },
        signal: opts.signal,
        what: `operation ${id}`,
      });
      try {
        for await (const ev of ndjson<{ type: string; operation?: Record<string, unknown>; message?: string }>(a, (e) => e.operation?.state !== undefined && e.operation.state !== "running")) {
          cuts = -1; // this stream worked: after it, the count starts again at 0
          if (ev.operation) {
            const op = operationFromWire(ev.operation);
            if (op.state !== "running") return op;
            for (const m of op.progress.slice(seen)) opts.onProgress?.(m);
            seen = Math.max(seen, op.progress.length);
          } else if (ev.message) {
            seen++;
            opts.onProgress?.(ev.message);
          }
        }
      } catch (err) {
        if (opts.signal?.aborted || !(err instanceof StreamCutError || err instanceof ForkdError)) throw err;
      } finally {
        a.finish();
      }
    }
    throw new StreamCutError(`operation ${id}: its event stream ended before it did (did the daemon at ${this.t.where} restart?)`, {});
  }
}

export type ClientOptions = ConnectionOptions;

/**
 * A connection to one forkd daemon (keep-alive; safe to share). Settings
 * come from the options, then FORKD_HOST / FORKD_SOCKET / FORKD_RUN_DIR /
 * FORKD_TOKEN / FORKD_CA_CERT, then the local socket /run/forkd/forkd.sock.
 */
export class Client {
  readonly snapshots: Snapshots;
  readonly sandboxes: Sandboxes;
  readonly images: Images;
  readonly operations: Operations;
  /** @internal */
  readonly transport: Transport;

  constructor(opts: ClientOptions = {}) {
    this.transport = new Transport(resolveConnection(opts));
    this.snapshots = new Snapshots(this.transport);
    this.sandboxes = new Sandboxes(this.transport);
    this.images = new Images(this.transport);
    this.operations = new Operations(this.transport);
  }

  /** Where the daemon is: its socket path or URL. */
  get where(): string {
    return this.transport.where;
  }

  /** Liveness: resolves `{status: "ok"}` when the daemon serves. */
  async health(opts: CallOptions = {}): Promise<HealthInfo> {
    return this.transport.json<HealthInfo>({ method: "GET", path: "/v1/healthz", signal: opts.signal, what: "health check" });
  }

  /** The daemon's, Go's and the VMM's versions. */
  async version(opts: CallOptions = {}): Promise<VersionInfo> {
    return versionFromWire(await this.transport.json({ method: "GET", path: "/v1/version", signal: opts.signal, what: "version" }));
  }

  /** The daemon host's checks (`forkd doctor`). */
  async doctor(opts: CallOptions = {}): Promise<DoctorCheck[]> {
    const out = await this.transport.json<DoctorCheck[] | null>({ method: "GET", path: "/v1/doctor", signal: opts.signal, what: "doctor" });
    return out ?? [];
  }

  /** Closes idle connections (the process can exit without it: idle sockets do not hold it). */
  close(): void {
    this.transport.close();
  }
}
