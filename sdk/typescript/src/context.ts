// Build contexts: the files a snapshot create's Dockerfile COPY/ADD or
// recipe `files` name travel in the request (the daemon never reads the
// client's paths).
import { promises as fsp } from "node:fs";
import { posix, join } from "node:path";
import { InvalidArgumentError } from "./errors.js";

/** The daemon's bounds on a build context, checked here before sending. */
export const MAX_CONTEXT_BYTES = 64 << 20;
export const MAX_CONTEXT_FILES = 100_000;

/**
 * A build context: a local directory (read recursively: its regular files
 * with their permission bits; symlinks and special files are left out), or
 * a record of relative path ("/"-separated, no "..") to contents (a string
 * is sent as UTF-8; mode 0644).
 */
export type BuildContextInput = string | Readonly<Record<string, string | Uint8Array>>;

/** One file of a build context on the wire. @internal */
export interface ContextFileWire {
  path: string;
  mode: number;
  /** base64 */
  data: string;
}

function invalid(msg: string): InvalidArgumentError {
  return new InvalidArgumentError(`context: ${msg}`, { code: "invalid_argument" });
}

/**
 * A context file's path for the wire: relative, no ".." component; "./"
 * and doubled slashes dropped. @internal
 */
export function contextPath(p: unknown): string {
  if (typeof p !== "string" || p === "" || p.includes("\0")) {
    throw invalid(`a path must be a non-empty string, not ${JSON.stringify(p)}`);
  }
  if (p.startsWith("/") || p.split("/").includes("..")) {
    throw invalid(`path ${JSON.stringify(p)} must be relative to the context, without ..`);
  }
  const c = posix.normalize(p).replace(/\/+$/, "");
  if (c === "." || c === "") throw invalid(`path ${JSON.stringify(p)} names the context itself, not a file`);
  return c;
}

function checkBounds(files: number, bytes: number): void {
  if (files > MAX_CONTEXT_FILES || bytes > MAX_CONTEXT_BYTES) {
    throw invalid(`over the daemon's limit of ${MAX_CONTEXT_BYTES} bytes or ${MAX_CONTEXT_FILES} files (have ${files} files, ${bytes} bytes so far)`);
  }
}

const byPath = (a: ContextFileWire, b: ContextFileWire) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0);

/**
 * The request's `context` array ({path, mode, data}), sorted by path;
 * throws InvalidArgumentError for a bad path or value, a missing
 * directory, or a context over 64 MiB or 100000 files. @internal
 */
export async function contextToWire(context: BuildContextInput): Promise<ContextFileWire[]> {
  if (typeof context === "string") return readDir(context);
  if (context === null || typeof context !== "object" || Array.isArray(context)) {
    throw invalid(`want a directory path or a record of relative path to string or Uint8Array, not ${JSON.stringify(context)}`);
  }
  const out = new Map<string, ContextFileWire>();
  let total = 0;
  for (const [p, v] of Object.entries(context)) {
    const rel = contextPath(p);
    if (out.has(rel)) throw invalid(`path ${JSON.stringify(rel)} is given twice`);
    let data: Buffer;
    if (typeof v === "string") data = Buffer.from(v, "utf8");
    else if (v instanceof Uint8Array) data = Buffer.from(v.buffer, v.byteOffset, v.byteLength);
    else throw invalid(`${JSON.stringify(p)}: want a string or Uint8Array, not ${typeof v}`);
    total += data.length;
    checkBounds(out.size + 1, total);
    out.set(rel, { path: rel, mode: 0o644, data: data.toString("base64") });
  }
  return [...out.values()].sort(byPath);
}

async function readDir(root: string): Promise<ContextFileWire[]> {
  let st;
  try {
    st = await fsp.stat(root);
  } catch {
    st = undefined;
  }
  if (!st?.isDirectory()) throw invalid(`${root} is not a directory`);
  const found: { rel: string; host: string; mode: number }[] = [];
  let total = 0;
  const walk = async (dir: string, prefix: string): Promise<void> => {
    const entries = await fsp.readdir(dir, { withFileTypes: true });
    entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    for (const e of entries) {
      const host = join(dir, e.name);
      const rel = prefix + e.name;
      if (e.isDirectory()) {
        await walk(host, rel + "/");
      } else if (e.isFile()) {
        const s = await fsp.lstat(host);
        total += s.size;
        checkBounds(found.length + 1, total);
        found.push({ rel, host, mode: s.mode & 0o777 });
      }
    }
  };
  try {
    await walk(root, "");
  } catch (err) {
    if (err instanceof InvalidArgumentError) throw err;
    throw invalid(String(err instanceof Error ? err.message : err));
  }
  const out: ContextFileWire[] = [];
  total = 0;
  for (const f of found) {
    let data: Buffer;
    try {
      data = await fsp.readFile(f.host);
    } catch (err) {
      throw invalid(String(err instanceof Error ? err.message : err));
    }
    total += data.length;
    checkBounds(out.length + 1, total); // a file that grew since its stat
    out.push({ path: f.rel, mode: f.mode, data: data.toString("base64") });
  }
  return out.sort(byPath);
}
