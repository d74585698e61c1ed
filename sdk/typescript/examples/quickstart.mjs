import { Sandbox } from "forkd";

const sb = await Sandbox.create("sdk-py"); // fork a sandbox from a snapshot tag
// or from a registry reference that `forkd push` wrote, pulled on first use:
// await Sandbox.create("localhost:5000/team/py:3.12", { pullPolicy: "always" });
try {
  const r = await sb.commands.run("echo hello from $(hostname)");
  console.log(r.stdout.trim()); // hello from sb-...
  await sb.files.write("/tmp/data.txt", "1 2 3\n");
  const ex = await sb.runCode("nums = [int(x) for x in open('/tmp/data.txt').read().split()]\nsum(nums)");
  console.log(ex.text); // 6
  const b = await sb.branch(); // snapshot of the running sandbox, as of now
  const child = await Sandbox.create(b.tag); // starts where sb was: nums is there
  console.log((await child.runCode("nums")).text); // [1, 2, 3]
  await child.kill();
  await sb.client.snapshots.delete(b.tag);
} finally {
  await sb.kill();
}
