// The package as users get it: `npm pack` holds the built ESM and its
// declarations only, installs into an empty project without a registry,
// and the README's example is the one in examples/ and runs as written.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { needsDaemon, needsPython } from "./helpers/env.mjs";

const root = fileURLToPath(new URL("..", import.meta.url));
const work = mkdtempSync(join(tmpdir(), "forkd-ts-pkg-"));
after(() => rmSync(work, { recursive: true, force: true }));

const npm = (args, cwd) => execFileSync("npm", args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });

describe("package", () => {
  let tarball;

  test("npm pack: dist and README only", () => {
    // dist/ was built by `npm test`; --ignore-scripts skips prepack's rebuild.
    const out = JSON.parse(npm(["pack", "--json", "--ignore-scripts", "--pack-destination", work], root));
    tarball = join(work, out[0].filename);
    const files = out[0].files.map((f) => f.path).sort();
    for (const f of ["package.json", "README.md", "dist/index.js", "dist/index.d.ts", "dist/sandbox.js", "dist/errors.d.ts"]) {
      assert.ok(files.includes(f), `${f} is missing from the tarball`);
    }
    for (const f of files) {
      assert.ok(/^(dist\/|package\.json$|README\.md$|LICENSE)/.test(f), `${f} should not be in the tarball`);
    }
  });

  test("installs into an empty project and imports", () => {
    const app = join(work, "app");
    execFileSync("mkdir", ["-p", app]);
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
    npm(["install", "--offline", "--no-audit", "--no-fund", tarball], app);
    writeFileSync(
      join(app, "check.mjs"),
      'import { Sandbox, Client, ForkdError, VERSION } from "forkd";\n' +
        'console.log(typeof Sandbox.create, typeof Client, new ForkdError("x").code, VERSION);\n',
    );
    const out = execFileSync("node", ["check.mjs"], { cwd: app, encoding: "utf8" });
    assert.match(out, /^function function internal \d+\.\d+\.\d+/);
    // Only Node is needed: no runtime dependencies came with it.
    const lock = JSON.parse(readFileSync(join(app, "package-lock.json"), "utf8"));
    assert.deepEqual(Object.keys(lock.packages).filter((p) => p.startsWith("node_modules/")), ["node_modules/forkd"]);
  });

  test("the installed package talks to the daemon", needsDaemon, () => {
    const app = join(work, "app");
    writeFileSync(
      join(app, "run.mjs"),
      'import { Sandbox } from "forkd";\n' +
        "const sb = await Sandbox.create(process.env.FORKD_TEST_TAG);\n" +
        'try { console.log((await sb.commands.run(["echo", "from the tarball"])).stdout.trim()); } finally { await sb.kill(); }\n',
    );
    assert.equal(execFileSync("node", ["run.mjs"], { cwd: app, encoding: "utf8" }).trim(), "from the tarball");
  });

  test("the README example is examples/quickstart.mjs", () => {
    const readme = readFileSync(join(root, "README.md"), "utf8");
    const block = readme.match(/```js\n([\s\S]*?)```/);
    assert.ok(block, "no ```js block in the README");
    assert.equal(block[1], readFileSync(join(root, "examples", "quickstart.mjs"), "utf8"));
  });

  test("the README example runs as written", needsPython, (t) => {
    if (process.env.FORKD_TEST_PY_TAG !== "sdk-py") {
      t.skip("the example forks the tag sdk-py of scripts/sdk-test-env.sh");
      return;
    }
    const out = execFileSync("node", [join(root, "examples", "quickstart.mjs")], { cwd: root, encoding: "utf8" });
    assert.match(out, /^hello from \S+\n6\n\[1, 2, 3\]\n$/);
  });
});
