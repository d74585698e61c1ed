package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tsScript is the TypeScript SDK's part of the gateway check, written as
// a user of one forkd host writes it: fork, run a command, branch
// mid-task, fork the branch (the child has the state), remove it.
const tsScript = `
import { Client, Sandbox } from "SDK";
const c = new Client(); // FORKD_HOST, FORKD_TOKEN
const fail = (msg) => { console.error(msg); process.exit(1); };
const sb = await Sandbox.create(process.env.TAG, { client: c, timeoutS: 600, metadata: { via: "gateway-ts" } });
try {
  const r = await sb.commands.run("echo ts-$((6*7)) > /tmp/state; cat /tmp/state");
  if (r.exitCode !== 0 || r.stdout.trim() !== "ts-42") fail("command: " + JSON.stringify(r));
  const br = await sb.branch();
  if ((await c.snapshots.get(br.tag)).state !== "ready") fail("branch " + br.tag + " not ready");
  const child = await Sandbox.create(br.tag, { client: c, timeoutS: 600 });
  try {
    const got = (await child.commands.run("cat /tmp/state")).stdout.trim();
    if (got !== "ts-42") fail("the branch's child read " + JSON.stringify(got));
  } finally {
    await child.kill();
  }
  const removed = await c.snapshots.delete(br.tag);
  if (removed.length !== 1 || removed[0] !== br.tag) fail("delete removed " + JSON.stringify(removed));
  console.log("sandbox", sb.id, "branch", br.tag);
} finally {
  await sb.kill();
}
`

// checkGatewayTS runs the TypeScript SDK, unchanged, against the gateway
// (built from sdk/typescript first: npm ci when it has no node_modules).
func checkGatewayTS(ctx context.Context, t *testing.T, gw *gatewayAccess, root string) {
	t.Helper()
	node, ok := optionalTool(t, "node", "the gateway check runs the TypeScript SDK")
	if !ok {
		return
	}
	sdk := filepath.Join(root, "sdk", "typescript")
	if _, err := os.Stat(filepath.Join(sdk, "node_modules")); err != nil {
		run(ctx, t, sdk, 5*time.Minute, "npm", "ci", "--no-audit", "--no-fund")
	}
	run(ctx, t, sdk, 5*time.Minute, "npm", "run", "build")
	script := filepath.Join(t.TempDir(), "gateway.mjs")
	src := strings.Replace(tsScript, `"SDK"`, `"file://`+filepath.Join(sdk, "dist", "index.js")+`"`, 1)
	if err := os.WriteFile(script, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Env = append(os.Environ(), "FORKD_HOST="+gw.url, "FORKD_TOKEN="+gw.token, "TAG="+snapshotTag)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the TypeScript SDK against the gateway: %v\n%s", err, out)
	}
	t.Logf("TypeScript SDK through the gateway: %s in %v", strings.TrimSpace(string(out)), time.Since(began).Round(time.Millisecond))
}

// run runs name args in dir within timeout, failing t with its output.
func run(ctx context.Context, t *testing.T, dir string, timeout time.Duration, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), dir, err, out)
	}
}
