import { PassThrough, Readable } from "node:stream";
import { posix } from "node:path";
import { readAll, type BodySource } from "./connection.js";
import { ConflictError, NotFoundError, StreamCutError } from "./errors.js";
import type { CallOptions } from "./client.js";
import type { SandboxContext } from "./internal.js";
import { entryFromWire, type EntryInfo } from "./types.js";

/** What files.write() accepts: text (written as UTF-8), bytes, or a stream sent as it is read. */
export type WriteData = string | Uint8Array | ArrayBuffer | Readable | AsyncIterable<Uint8Array | string>;

export interface WriteOptions {
  /** Permission bits, e.g. 0o755. Default 0o644. */
  mode?: number;
  signal?: AbortSignal;
}

export interface WriteEntry {
  path: string;
  data: WriteData;
  mode?: number;
}

export interface ReadOptions {
  /** "text" (default, UTF-8), "bytes" (a Uint8Array) or "stream" (a Node Readable, not buffered). */
  format?: "text" | "bytes" | "stream";
  signal?: AbortSignal;
}

export interface RemoveOptions {
  /** Remove a directory with everything in it. Default true (as E2B's remove). */
  recursive?: boolean;
  signal?: AbortSignal;
}

export interface MakeDirOptions {
  /** Permission bits of new directories. Default 0o755. */
  mode?: number;
  signal?: AbortSignal;
}

/**
 * The sandbox's filesystem: `sb.files`. Paths are absolute paths inside the
 * sandbox. Writes are atomic (readers see the old file or the whole new one)
 * and create missing parent directories.
 */
export class Files {
  /** @internal */
  constructor(private readonly ctx: SandboxContext) {}

  private path(suffix = ""): string {
    return `/v1/sandboxes/${encodeURIComponent(this.ctx.id)}/files${suffix}`;
  }

  /** Reads a file as UTF-8 text (default), bytes, or a stream that is not buffered. */
  read(path: string, opts?: ReadOptions & { format?: "text" }): Promise<string>;
  read(path: string, opts: ReadOptions & { format: "bytes" }): Promise<Uint8Array>;
  read(path: string, opts: ReadOptions & { format: "stream" }): Promise<Readable>;
  async read(path: string, opts: ReadOptions = {}): Promise<string | Uint8Array | Readable> {
    const format = opts.format ?? "text";
    const a = await this.ctx.transport.request({
      method: "GET",
      path: this.path(),
      query: { path },
      signal: opts.signal,
      what: `read ${path} in sandbox ${this.ctx.id}`,
    });
    if (format === "stream") {
      const out = new PassThrough();
      const onError = (err: unknown) => {
        out.destroy(a.readError(err, `the file was cut short`));
      };
      a.res.on("error", onError);
      a.res.on("aborted", () => onError(new Error("aborted")));
      a.res.on("close", () => {
        // Closed without its end: cut (Content-Length or final chunk missing).
        if (!a.res.complete && !out.destroyed) onError(new Error("connection closed"));
      });
      a.res.pipe(out);
      out.on("close", () => {
        if (!a.res.complete) a.abort(new StreamCutError(`read ${path}: stream closed by the caller`));
        a.finish();
      });
      return out;
    }
    let data: Buffer;
    try {
      data = await readAll(a.res, Infinity);
      if (!a.res.complete) throw new Error("connection closed");
    } catch (err) {
      throw a.readError(err, "the file was cut short");
    } finally {
      a.finish();
    }
    return format === "bytes" ? data : data.toString("utf8");
  }

  /**
   * Creates or replaces a file (atomically) with text, bytes, or a stream;
   * missing parent directories are created. Resolves with the file's info.
   * Several files at once: `write([{ path, data }, ...])`.
   */
  write(path: string, data: WriteData, opts?: WriteOptions): Promise<EntryInfo>;
  write(files: readonly WriteEntry[], opts?: WriteOptions): Promise<EntryInfo[]>;
  async write(pathOrFiles: string | readonly WriteEntry[], dataOrOpts?: WriteData | WriteOptions, maybeOpts?: WriteOptions): Promise<EntryInfo | EntryInfo[]> {
    if (Array.isArray(pathOrFiles)) {
      const opts = (dataOrOpts ?? {}) as WriteOptions;
      const out: EntryInfo[] = [];
      for (const f of pathOrFiles as readonly WriteEntry[]) {
        out.push(await this.writeOne(f.path, f.data, { ...opts, ...(f.mode !== undefined ? { mode: f.mode } : {}) }));
      }
      return out;
    }
    return this.writeOne(pathOrFiles as string, dataOrOpts as WriteData, maybeOpts ?? {});
  }

  private async writeOne(path: string, data: WriteData, opts: WriteOptions): Promise<EntryInfo> {
    if (data === undefined || data === null) throw new TypeError("files.write: no data");
    let body: BodySource;
    if (data instanceof ArrayBuffer) body = new Uint8Array(data);
    else body = data as BodySource;
    const replayable = typeof body === "string" || body instanceof Uint8Array;
    const parent = posix.dirname(path);
    if (!replayable && parent !== "/" && parent !== ".") {
      // A stream cannot be sent twice: make the parent first.
      await this.mkdirs(parent, opts.signal);
    }
    const send = () =>
      this.ctx.transport.json<Record<string, unknown>>({
        method: "PUT",
        path: this.path(),
        query: { path, mode: "0" + (opts.mode ?? 0o644).toString(8) },
        headers: { "content-type": "application/octet-stream" },
        body,
        signal: opts.signal,
        timeoutMs: 0,
        what: `write ${path} in sandbox ${this.ctx.id}`,
      });
    try {
      return entryFromWire(await send());
    } catch (err) {
      if (replayable && err instanceof NotFoundError && /parent directory/.test(err.detail)) {
        await this.mkdirs(parent, opts.signal);
        return entryFromWire(await send());
      }
      throw err;
    }
  }

  /** Lists a directory's entries. */
  async list(path: string, opts: CallOptions = {}): Promise<EntryInfo[]> {
    const out = await this.ctx.transport.json<Record<string, unknown>[] | null>({
      method: "GET",
      path: this.path("/list"),
      query: { path },
      signal: opts.signal,
      what: `list ${path} in sandbox ${this.ctx.id}`,
    });
    return (out ?? []).map(entryFromWire);
  }

  /** Describes a file or directory (lstat: a link is described, not followed). */
  async getInfo(path: string, opts: CallOptions = {}): Promise<EntryInfo> {
    const out = await this.ctx.transport.json<Record<string, unknown>>({
      method: "GET",
      path: this.path("/stat"),
      query: { path },
      signal: opts.signal,
      what: `stat ${path} in sandbox ${this.ctx.id}`,
    });
    return entryFromWire(out);
  }

  /** Whether a file or directory exists. */
  async exists(path: string, opts: CallOptions = {}): Promise<boolean> {
    try {
      await this.getInfo(path, opts);
      return true;
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  /**
   * Removes a file, or a directory with its contents (`recursive: false`
   * refuses a non-empty directory with ConflictError). A missing path
   * rejects with NotFoundError.
   */
  async remove(path: string, opts: RemoveOptions = {}): Promise<void> {
    await this.ctx.transport.json({
      method: "DELETE",
      path: this.path(),
      query: { path, recursive: opts.recursive === false ? undefined : "1" },
      signal: opts.signal,
      what: `remove ${path} in sandbox ${this.ctx.id}`,
    });
  }

  /**
   * Creates a directory and any missing parents. Resolves true when it was
   * created, false when it existed already (a file there is a ConflictError).
   */
  async makeDir(path: string, opts: MakeDirOptions = {}): Promise<boolean> {
    try {
      await this.mkdir(path, false, opts);
      return true;
    } catch (err) {
      if (err instanceof ConflictError && err.code === "already_exists") {
        const info = await this.getInfo(path, opts);
        if (info.isDir) return false;
        throw new ConflictError(`${path} exists and is not a directory`, { status: 409, code: "already_exists", ...(err.requestId ? { requestId: err.requestId } : {}) });
      }
      if (err instanceof NotFoundError) {
        await this.mkdir(path, true, opts);
        return true;
      }
      throw err;
    }
  }

  private async mkdir(path: string, parents: boolean, opts: MakeDirOptions): Promise<EntryInfo> {
    const req: Record<string, unknown> = { path };
    if (parents) req.parents = true;
    if (opts.mode !== undefined) req.mode = opts.mode;
    const out = await this.ctx.transport.json<Record<string, unknown>>({
      method: "POST",
      path: this.path("/mkdir"),
      json: req,
      signal: opts.signal,
      what: `mkdir ${path} in sandbox ${this.ctx.id}`,
    });
    return entryFromWire(out);
  }

  private async mkdirs(dir: string, signal: AbortSignal | undefined): Promise<void> {
    await this.mkdir(dir, true, signal ? { signal } : {});
  }
}
