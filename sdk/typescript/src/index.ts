/**
 * forkd TypeScript SDK: fork microVM sandboxes from warmed snapshots, run
 * commands and Python in them, move files, branch them into new snapshots.
 *
 * @packageDocumentation
 */
export { Sandbox } from "./sandbox.js";
export type { SandboxOptions, ConnectOptions, BranchOptions, BranchResult, BranchMode } from "./sandbox.js";
export { Client, Snapshots, Sandboxes, Images, Operations, DEFAULT_SANDBOX_TIMEOUT_S, PULL_POLICIES } from "./client.js";
export type {
  ClientOptions,
  CallOptions,
  CreateSnapshotOptions,
  DeleteSnapshotOptions,
  WaitReadyOptions,
  PackOptions,
  PackResult,
  ArchiveSource,
  UnpackOptions,
  ListSandboxesOptions,
  ForkOptions,
  PullPolicy,
  ForkResult,
  SetTimeoutOptions,
  OperationInfo,
  WaitOperationOptions,
} from "./client.js";
export { Commands, CommandHandle } from "./commands.js";
export type { CommandOptions, RunOptions, BackgroundOptions, CommandResult, CommandEvent, StdinSource } from "./commands.js";
export { Pty } from "./pty.js";
export type { PtySize, PtyCreateOptions } from "./pty.js";
export { Files } from "./files.js";
export type { WriteData, WriteOptions, WriteEntry, ReadOptions, RemoveOptions, MakeDirOptions } from "./files.js";
export { Execution, Result, ExecutionError } from "./code.js";
export type { RunCodeOptions } from "./code.js";
export type { ConnectionOptions } from "./connection.js";
export type { BuildContextInput } from "./context.js";
export type {
  SandboxInfo,
  SandboxState,
  SandboxNetwork,
  NetworkMode,
  NetworkPolicy,
  NetworkPolicyInput,
  NetworkStats,
  PortInfo,
  SnapshotInfo,
  SnapshotState,
  SnapshotFile,
  ImageInfo,
  EntryInfo,
  ProcessInfo,
  VersionInfo,
  HealthInfo,
  DoctorCheck,
} from "./types.js";
export {
  ForkdError,
  InvalidArgumentError,
  AuthenticationError,
  PermissionDeniedError,
  NotFoundError,
  ConflictError,
  TimeoutError,
  RateLimitedError,
  UnavailableError,
  StreamCutError,
  CommandExitError,
  SnapshotFailedError,
} from "./errors.js";
export type { Problem } from "./errors.js";
export { VERSION } from "./version.js";
