import type { Transport } from "./connection.js";

/** What the parts of a sandbox (commands, files, code) share. @internal */
export interface SandboxContext {
  readonly id: string;
  readonly transport: Transport;
  /**
   * A few words on what became of the sandbox ("it was killed", "it is
   * dead: ..."), for errors of streams cut short; "" when it still runs or
   * nothing could be learnt.
   */
  describeFate(): Promise<string>;
}
