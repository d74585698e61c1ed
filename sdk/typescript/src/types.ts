/**
 * Public data types (camelCase) and their conversion from the daemon's wire
 * format (snake_case JSON, see internal/api/openapi.yaml).
 */
import { InvalidArgumentError } from "./errors.js";

/** What a sandbox may reach: nothing, the public internet, or only an allow-list. */
export type NetworkMode = "none" | "public" | "allow";

/**
 * A sandbox's egress policy. `mode` "none" reaches nothing; "public" the
 * internet, but never the daemon's host, other sandboxes, or private, CGNAT,
 * loopback, link-local and multicast ranges; "allow" only what `allow`
 * lists: networks ("198.51.100.0/24", "203.0.113.7:443/tcp", port ranges as
 * "203.0.113.7:8000-8099") and domain names ("example.com", "*.example.com"
 * for every name below it).
 */
export interface NetworkPolicy {
  mode: NetworkMode;
  /** With mode "allow": the networks and domain names the sandbox may reach. */
  allow?: string[];
  /** Caps the TCP connections open through the sandbox's uplink at once (0: none). */
  max_connections?: number;
  /** Caps its traffic each way, in Mbit/s (0: none). */
  rate_mbit?: number;
}

/**
 * What a `network` option takes: a {@link NetworkPolicy}, "none", "public",
 * the CLI's "allow:ENTRY,ENTRY", a list of allow entries (mode "allow"), or a
 * boolean (E2B's `allowInternetAccess`: true is "public", false "none").
 */
export type NetworkPolicyInput = NetworkPolicy | "none" | "public" | `allow:${string}` | readonly string[] | boolean;

/** What crossed a sandbox's network link since it was set up (zero until a policy other than none first linked it). */
export interface NetworkStats {
  txBytes: number;
  rxBytes: number;
  txPackets: number;
  rxPackets: number;
  /** Packets the policy refused. */
  deniedPackets: number;
  /** Packets dropped for a source address that was not the sandbox's. */
  spoofedPackets: number;
}

/** A sandbox's network: its policy and, when the daemon reports them, its traffic counters. */
export interface SandboxNetwork {
  policy: NetworkPolicy;
  stats?: NetworkStats;
}

/** Where the daemon serves a TCP port inside a sandbox. */
export interface PortInfo {
  port: number;
  /** The proxy path on the daemon's API: `/v1/sandboxes/ID/ports/PORT/`. */
  path: string;
  /** `PORT-ID.DOMAIN` when the daemon routes a domain to sandbox ports (`forkd serve --port-domain`). */
  host?: string;
}

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
  /** That VMM was restored ahead and rehearsed a first request, so the first runCode runs warm. */
  rehearsed: boolean;
  pid?: number;
  netns?: string;
  guestIp?: string;
  deadReason?: string;
  /** The labels given at fork. */
  metadata: Record<string, string>;
  /** When the absolute timeout ends the sandbox; undefined for none. */
  expiresAt?: Date;
  /** When a dead sandbox was found dead; it leaves the list the daemon's retention period later. */
  endedAt?: Date;
  /** Seconds without requests after which the sandbox is ended. */
  idleTimeoutS?: number;
  lastActivity: Date;
  /** The end of the guest console, for dead sandboxes. */
  consoleTail?: string;
  /** Its network policy (and traffic, for one sandbox), when the daemon reports it. */
  network?: SandboxNetwork;
  /** The CPU limit its fork asked for; undefined: the default. */
  cpus?: number;
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
    rehearsed: !!w.rehearsed,
    metadata: w.metadata ?? {},
    lastActivity: date(w.last_activity),
  };
  if (w.pid !== undefined) out.pid = w.pid;
  if (w.netns !== undefined) out.netns = w.netns;
  if (w.guest_ip !== undefined) out.guestIp = w.guest_ip;
  if (w.dead_reason !== undefined) out.deadReason = w.dead_reason;
  if (w.expires_at !== undefined && w.expires_at !== null) out.expiresAt = date(w.expires_at);
  if (w.ended_at !== undefined && w.ended_at !== null) out.endedAt = date(w.ended_at);
  if (w.idle_timeout_s !== undefined) out.idleTimeoutS = w.idle_timeout_s;
  if (w.console_tail !== undefined) out.consoleTail = w.console_tail;
  if (w.network) out.network = networkFromWire(w.network);
  if (w.cpus !== undefined) out.cpus = w.cpus;
  return out;
}

const MODES: readonly string[] = ["none", "public", "allow"];

function badPolicy(msg: string): Error {
  return new InvalidArgumentError(msg, { code: "invalid_argument" });
}

/**
 * The wire form of a network policy input (`{mode, allow?}`); throws
 * InvalidArgumentError for a malformed one (the daemon checks the entries).
 * @internal
 */
export function networkToWire(input: NetworkPolicyInput): { mode: string; allow?: string[]; max_connections?: number; rate_mbit?: number } {
  let mode: unknown;
  let allow: unknown[] = [];
  const caps: { max_connections?: number; rate_mbit?: number } = {};
  if (typeof input === "boolean") {
    mode = input ? "public" : "none";
  } else if (typeof input === "string") {
    const s = input.trim();
    if (s.startsWith("allow:")) {
      mode = "allow";
      allow = s.slice("allow:".length).split(",").map((e) => e.trim()).filter((e) => e !== "");
    } else if (MODES.includes(s)) {
      mode = s;
    } else {
      throw badPolicy(`network policy ${JSON.stringify(input)}: want "none", "public" or "allow:ENTRY,ENTRY" (a CIDR, ADDR[:PORT[-PORT]][/tcp|/udp], or a domain such as *.example.com)`);
    }
  } else if (Array.isArray(input)) {
    mode = "allow";
    allow = [...input];
  } else if (input !== null && typeof input === "object") {
    const o = input as unknown as Record<string, unknown>;
    const keys = ["mode", "allow", "max_connections", "rate_mbit"];
    const extra = Object.keys(o).filter((k) => !keys.includes(k));
    if (extra.length) throw badPolicy(`network policy: unknown keys ${extra.join(", ")} (want ${keys.join(", ")})`);
    for (const k of ["max_connections", "rate_mbit"] as const) {
      const n = o[k];
      if (n === undefined || n === 0) continue;
      if (typeof n !== "number" || !Number.isInteger(n) || n < 0) throw badPolicy(`network policy ${k} ${JSON.stringify(n)}: want a whole number >= 0 (0: no cap)`);
      caps[k] = n;
    }
    if (o.allow !== undefined && !Array.isArray(o.allow)) throw badPolicy(`network policy allow ${JSON.stringify(o.allow)}: want an array of entries`);
    allow = (o.allow as unknown[] | undefined) ?? [];
    mode = o.mode ?? (allow.length ? "allow" : undefined);
  } else {
    throw badPolicy(`network policy ${String(input)}: want a NetworkPolicy {mode, allow}, "none", "public", "allow:ENTRY,...", an array of allow entries or a boolean`);
  }
  if (typeof mode !== "string" || !MODES.includes(mode)) throw badPolicy(`network mode ${JSON.stringify(mode)}: want "none", "public" or "allow"`);
  if (allow.length && mode !== "allow") {
    throw badPolicy(`network mode "${mode}" takes no allow list (got ${JSON.stringify(allow)}): use mode "allow" to list what the sandbox may reach`);
  }
  if (allow.some((e) => typeof e !== "string" || e.trim() === "")) throw badPolicy(`network allow list ${JSON.stringify(allow)}: every entry must be a non-empty string`);
  return allow.length ? { mode, allow: allow as string[], ...caps } : { mode, ...caps };
}

/** @internal */
export function networkFromWire(w: Wire | null | undefined): SandboxNetwork {
  const p: Wire = w?.policy ?? {};
  const policy: NetworkPolicy = { mode: p.mode ?? "" };
  if (Array.isArray(p.allow) && p.allow.length) policy.allow = p.allow.map(String);
  if (p.max_connections) policy.max_connections = Number(p.max_connections);
  if (p.rate_mbit) policy.rate_mbit = Number(p.rate_mbit);
  const out: SandboxNetwork = { policy };
  const st: Wire | undefined = w?.stats;
  if (st) {
    out.stats = {
      txBytes: st.tx_bytes ?? 0,
      rxBytes: st.rx_bytes ?? 0,
      txPackets: st.tx_packets ?? 0,
      rxPackets: st.rx_packets ?? 0,
      deniedPackets: st.denied_packets ?? 0,
      spoofedPackets: st.spoofed_packets ?? 0,
    };
  }
  return out;
}

/** @internal */
export function portFromWire(w: Wire): PortInfo {
  const out: PortInfo = { port: Number(w.port ?? 0), path: w.path ?? "" };
  if (w.host) out.host = w.host;
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
