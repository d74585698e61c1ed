// Shared test helpers. The suite runs against a real daemon: FORKD_SOCKET
// (or FORKD_HOST) and FORKD_TEST_TAG (a minimal snapshot: exec, files,
// branch), FORKD_TEST_PY_TAG (a snapshot with a warmed Python session), as
// exported by `eval "$(scripts/sdk-test-env.sh start ts)"`.
import { randomBytes } from "node:crypto";
import { Client, Sandbox } from "forkd";

export const TAG = process.env.FORKD_TEST_TAG;
export const PY_TAG = process.env.FORKD_TEST_PY_TAG;

/** Test options that skip (with the reason) when no test daemon is configured. */
export const needsDaemon = TAG
  ? {}
  : { skip: "FORKD_TEST_TAG is not set: start a test daemon with eval \"$(scripts/sdk-test-env.sh start ts)\"" };
export const needsPython = !TAG
  ? needsDaemon
  : PY_TAG
    ? {}
    : { skip: "FORKD_TEST_PY_TAG is not set (a snapshot with a Python session)" };

let client;
export function getClient() {
  client ??= new Client();
  return client;
}

/** A unique tag for snapshots a test creates. */
export function uniqueTag(prefix) {
  return `${prefix}-${process.pid}-${randomBytes(3).toString("hex")}`;
}

/**
 * Tracks what a test file creates so that after() removes it even when a
 * test fails: sandboxes are killed, snapshot tags deleted (cascade).
 */
export class Tracker {
  sandboxes = new Set();
  tags = new Set();

  async create(tag = TAG, opts = {}) {
    // An hour, not the default five minutes: a file shares some sandboxes
    // across its tests, which a loaded machine can stretch.
    const sb = await Sandbox.create(tag, { metadata: { "forkd-sdk-test": "ts" }, timeoutS: 3600, ...opts });
    this.sandboxes.add(sb);
    return sb;
  }

  async fork(tag, n, opts = {}) {
    const sbs = await Sandbox.fork(tag, n, { metadata: { "forkd-sdk-test": "ts" }, timeoutS: 3600, ...opts });
    for (const sb of sbs) this.sandboxes.add(sb);
    return sbs;
  }

  tag(prefix) {
    const t = uniqueTag(prefix);
    this.tags.add(t);
    return t;
  }

  async cleanup() {
    await Promise.allSettled([...this.sandboxes].map((sb) => sb.kill()));
    this.sandboxes.clear();
    // Newest first: branches before what they branched from.
    for (const t of [...this.tags].reverse()) {
      try {
        await getClient().snapshots.delete(t, { cascade: true });
      } catch (err) {
        if (err.name === "NotFoundError") continue;
        try {
          await getClient().snapshots.delete(t);
        } catch {
          /* gone or undeletable: nothing more to do */
        }
      }
    }
    this.tags.clear();
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Polls cond (sync or async) until it holds. The limit only bounds a hang:
 * a loaded host (TCG, busy CPUs) is slow, never wait for a fixed time.
 */
export async function until(cond, what, ms = 60_000) {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(50);
  }
}

/** promise, or a rejection naming what after ms (which only bounds a hang). */
export async function within(promise, what, ms = 60_000) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A gate in the guest: path (a fresh file name) and wait, shell that waits
 * until the test creates path (a minute at most, then it says so on
 * stderr). A command that waits at a gate the test opens only once it has
 * seen the output before it shows that output was streamed.
 */
export function gate() {
  const path = `/tmp/gate-${randomBytes(4).toString("hex")}`;
  const wait =
    `i=0; while [ ! -e ${path} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; ` +
    `[ -e ${path} ] || echo "gate ${path} not opened" >&2`;
  return { path, wait };
}
