/**
 * Public data types (camelCase) and their conversion from the daemon's wire
 * format (snake_case JSON, see internal/api/openapi.yaml).
 */

/** running: answering requests; dead: its VMM exited on its own (see deadReason); stopped: killed on request. */
export type SandboxState = "starting" | "running" | "dead" | "stopped" | (string & {});

/** A sandbox as the daemon describes it. */
export interface SandboxInfo {
  id: string;
  /** The snapshot tag it was forked from. */
  tag: string;
  state: SandboxState;
  created: Date;
  /** Fork-to-ready in ms: from taking a VMM to the agent answering. */
  readyMs: number;
  /** A pre-started VMM process was used. */
  pooled: boolean;
  pid?: number;
  netns?: string;
  guestIp?: string;
  deadReason?: string;
  /** The labels given at fork. */
  metadata: Record<string, string>;
  /** When the absolute timeout ends the sandbox; undefined for none. */
  expiresAt?: Date;
  /** Seconds without requests after which the sandbox is ended. */
  idleTimeoutS?: number;
  lastActivity: Date;
  /** The end of the guest console, for dead sandboxes. */
  consoleTail?: string;
}

/** ready: can be forked; writing: a branch with `wait: false` is still being saved; failed: see `error`. */
export type SnapshotState = "ready" | "writing" | "failed" | (string & {});

export interface SnapshotFile {
  size: number;
  sha256: string;
}

/** A snapshot tag. */
export interface SnapshotInfo {
  tag: string;
  id: string;
  created: Date;
  recipe: string;
  imageDigest: string;
  vmm: string;
  vmmVersion: string;
  accel: string;
  memoryMib: number;
  vcpus: number;
  /** The snapshot has a warmed Python session (runCode works in its sandboxes). */
  python: boolean;
  files: Record<string, SnapshotFile>;
  /** Logical size of the files. */
  sizeBytes: number;
  /** Allocated size (memory images are sparse). */
  diskBytes: number;
  createMs: number;
  /** Pre-started VMM processes waiting. */
  pooledVmms: number;
  state: SnapshotState;
  /** Why a failed snapshot failed. */
  error?: string;
  /** A diff layer's parent. */
  parent?: { tag: string; digest: string };
  /** Layers above a self-contained snapshot (0: flat). */
  depth: number;
  /** Parent first, then its parent, up to the root. */
  ancestors: string[];
  /** Tags whose chains need this snapshot. */
  dependents: string[];
}

/** A built guest image. */
export interface ImageInfo {
  digest: string;
  recipe: string;
  kernelVersion: string;
  memoryMib: number;
  vcpus: number;
  sizeBytes: number;
  created: Date;
  dir: string;
}

/** A file or directory inside a sandbox. */
export interface EntryInfo {
  name: string;
  path: string;
  size: number;
  /** Permission bits. */
  mode: number;
  isDir: boolean;
  isLink: boolean;
  /** "dir" or "file" (E2B's FileType). */
  type: "dir" | "file";
  modTime: Date;
}

/** A command running in a sandbox (`sb.commands.list()`), from its start until its process exits. */
export interface ProcessInfo {
  /** Its pid in the sandbox: what commands.kill(), sendStdin() and closeStdin() take. */
  pid: number;
  /** As run: ["/bin/sh", "-c", CMD] for a shell command. */
  argv: string[];
  /** The shell command line, or the argv joined with spaces. */
  cmd: string;
  cwd: string;
  /** When it started, by the sandbox's clock. */
  started: Date;
  /** sendStdin() accepts data: started with `stdin: true` and not closed yet. */
  stdinOpen: boolean;
}

export interface VersionInfo {
  version: string;
  goVersion: string;
  vmm: string;
  vmmVersion: string;
  accel: string;
  dataDir: string;
}

export interface HealthInfo {
  status: string;
}

export interface DoctorCheck {
  name: string;
  ok: boolean;
  detail: string;
  fix?: string;
}

// ---- wire conversion (internal) ----

type Wire = Record<string, any>;

function date(v: unknown): Date {
  return typeof v === "string" ? new Date(v) : new Date(NaN);
}

/** @internal */
export function sandboxFromWire(w: Wire): SandboxInfo {
  const out: SandboxInfo = {
    id: w.id,
    tag: w.tag,
    state: w.state,
    created: date(w.created),
    readyMs: w.ready_ms ?? 0,
    pooled: !!w.pooled,
    metadata: w.metadata ?? {},
    lastActivity: date(w.last_activity),
  };
  if (w.pid !== undefined) out.pid = w.pid;
  if (w.netns !== undefined) out.netns = w.netns;
  if (w.guest_ip !== undefined) out.guestIp = w.guest_ip;
  if (w.dead_reason !== undefined) out.deadReason = w.dead_reason;
  if (w.expires_at !== undefined && w.expires_at !== null) out.expiresAt = date(w.expires_at);
  if (w.idle_timeout_s !== undefined) out.idleTimeoutS = w.idle_timeout_s;
  if (w.console_tail !== undefined) out.consoleTail = w.console_tail;
  return out;
}

/** @internal */
export function snapshotFromWire(w: Wire): SnapshotInfo {
  const out: SnapshotInfo = {
    tag: w.tag,
    id: w.id,
    created: date(w.created),
    recipe: w.recipe,
    imageDigest: w.image_digest,
    vmm: w.vmm,
    vmmVersion: w.vmm_version,
    accel: w.accel,
    memoryMib: w.memory_mib,
    vcpus: w.vcpus,
    python: !!w.python,
    files: w.files ?? {},
    sizeBytes: w.size_bytes ?? 0,
    diskBytes: w.disk_bytes ?? 0,
    createMs: w.create_ms ?? 0,
    pooledVmms: w.pooled_vmms ?? 0,
    // Daemons from before snapshot states only had ready snapshots.
    state: w.state ?? "ready",
    depth: w.depth ?? 0,
    ancestors: w.ancestors ?? [],
    dependents: w.dependents ?? [],
  };
  if (w.error) out.error = w.error;
  if (w.parent) out.parent = { tag: w.parent.tag, digest: w.parent.digest };
  return out;
}

/** @internal */
export function imageFromWire(w: Wire): ImageInfo {
  return {
    digest: w.digest,
    recipe: w.recipe,
    kernelVersion: w.kernel_version,
    memoryMib: w.memory_mib,
    vcpus: w.vcpus,
    sizeBytes: w.size_bytes,
    created: date(w.created),
    dir: w.dir,
  };
}

/** @internal */
export function entryFromWire(w: Wire): EntryInfo {
  return {
    name: w.name,
    path: w.path,
    size: w.size,
    mode: w.mode,
    isDir: !!w.is_dir,
    isLink: !!w.is_link,
    type: w.is_dir ? "dir" : "file",
    modTime: date(w.mod_time),
  };
}

/** @internal */
export function versionFromWire(w: Wire): VersionInfo {
  return {
    version: w.version,
    goVersion: w.go_version,
    vmm: w.vmm,
    vmmVersion: w.vmm_version,
    accel: w.accel,
    dataDir: w.data_dir,
  };
}

/** @internal */
export function processFromWire(w: Wire): ProcessInfo {
  const argv: string[] = Array.isArray(w.argv) ? w.argv.map(String) : [];
  return {
    pid: Number(w.pid ?? 0),
    argv,
    cmd: typeof w.shell === "string" && w.shell !== "" ? w.shell : argv.join(" "),
    cwd: w.cwd ?? "",
    started: date(w.started),
    stdinOpen: !!w.stdin_open,
  };
}
