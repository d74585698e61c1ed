#!/usr/bin/env python3
"""gVisor side of the forkd peer comparison (issue 20); run by run.sh.

run.sh installs runsc, mounts the root fs and cleans up; this file warms a
container, checkpoints it, restores it and measures. Python standard library
only.

Request channel: the container's stdin/stdout. The Python server in the
container (SERVER below) reads one JSON request per line on stdin and writes
one JSON answer per line on stdout. It survives `runsc checkpoint/restore`
because gVisor saves the container's stdio as host-FD-backed files and, on
restore, re-attaches them to the stdio that `runsc restore` is given: each
restored copy talks over the fresh pipes this script hands it. A TCP server
on the sandbox's netstack was not tried: each restored copy would need its
own network namespace and veth to be reached, set-up outside what is
measured, and forkd's own bench runs its children without a network. A Unix socket on a host bind
mount (--host-uds) was not tried: a connected host socket is a host FD that
restore has no way to re-attach.

CPU per child: each container's runsc command (run/restore) is started in a
fresh cgroup v2 (the unified hierarchy; cgroup v1's cpuacct when there is
none) and everything it forks, gofer, sandbox (Sentry) and, with ptrace, the
stub processes that run the application's code, stays in it. The cgroup's
cpu.stat usage_usec when the first answer arrives is the CPU spent on that
child so far, runsc's own CLI included.

PSS per child: the sum of smaps_rollup Pss over every process in the child's
cgroup (gofer, Sentry, stubs), with all N restored children running.
"""
import argparse
import json
import os
import platform as pyplatform
import selectors
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time

# forkd's py-pandas warm-up (recipes/py-pandas.toml), run before the
# checkpoint. run.sh passes the snapshot's manifest, whose python.warm is
# used instead when present, so the container runs exactly the snapshot's.
WARM = '''import pandas as pd
import numpy as np
import matplotlib.pyplot as plt
# Draw once, so fonts and the Agg renderer are loaded before the snapshot
# and a child's first chart does not pay for them.
import io as _io
plt.plot([0, 1]); plt.savefig(_io.BytesIO(), format="png"); plt.close("all")'''

# The in-container request server, started as `python3 -u -c SERVER % warm`.
# Like forkd's pyrunner: code runs in one persistent namespace (the warm-up's
# globals), the value of a last expression is returned as its repr.
SERVER = '''
import ast, json, sys
g = {"__name__": "__main__"}
exec(compile(%r, "<warm>", "exec"), g)
def run(src):
    tree = ast.parse(src)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<code>", "exec"), g)
    if last is not None:
        return repr(eval(compile(ast.Expression(last.value), "<code>", "eval"), g))
sys.stdout.write("READY\\n"); sys.stdout.flush()
for line in sys.stdin:
    try:
        out = {"ok": True, "value": run(json.loads(line)["code"])}
    except Exception as e:
        out = {"ok": False, "error": repr(e)}
    sys.stdout.write(json.dumps(out) + "\\n"); sys.stdout.flush()
'''

FIRST = 'pd.DataFrame({"a": [1, 2]}).sum()'
RNG = 'import random; random.random()'
TIMEOUT = 300  # seconds to wait for any one answer

# The environment forkd's agent gives the Python session (procenv.Default,
# PYTHONUNBUFFERED, and pyrunner's MPLBACKEND=Agg).
ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       "HOME=/root", "LANG=C.UTF-8", "PYTHONUNBUFFERED=1", "MPLBACKEND=Agg"]


def percentile(xs, p):
    """forkd bench's percentile (cmd/forkd/bench.go): nearest rank, rounded."""
    s = sorted(xs)
    return s[int(p * (len(s) - 1) + 0.5)] if s else 0.0


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Cgroups:
    """One parent cgroup for the run, one child cgroup per container."""

    def __init__(self, work):
        mounts = [l.split() for l in open("/proc/mounts")]
        v2 = [m[1] for m in mounts if m[2] == "cgroup2"]
        v1 = [m[1] for m in mounts if m[2] == "cgroup" and "cpuacct" in m[3].split(",")]
        if v2:
            self.v2, base = True, v2[0]
        elif v1:
            self.v2, base = False, v1[0]
        else:
            sys.exit("no cgroup2 or cpuacct hierarchy mounted: cannot count CPU per child")
        self.parent = os.path.join(base, f"gvisor-bench-{os.getpid()}")
        os.mkdir(self.parent)
        with open(os.path.join(work, "cgroup"), "w") as f:  # for run.sh's cleanup
            f.write(self.parent)

    def make(self, name):
        d = os.path.join(self.parent, name)
        os.mkdir(d)
        return d

    @staticmethod
    def pids(cg):
        with open(os.path.join(cg, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]

    def cpu_s(self, cg):
        if self.v2:
            for line in open(os.path.join(cg, "cpu.stat")):
                k, v = line.split()
                if k == "usage_usec":
                    return int(v) / 1e6
        return int(open(os.path.join(cg, "cpuacct.usage")).read()) / 1e9

    def remove(self, cg):
        """Kill whatever is left in cg, wait for it to empty, remove it."""
        deadline = time.time() + 10
        while self.pids(cg) and time.time() < deadline:
            if self.v2 and os.path.exists(os.path.join(cg, "cgroup.kill")):
                with open(os.path.join(cg, "cgroup.kill"), "w") as f:
                    f.write("1")
            else:
                for pid in self.pids(cg):
                    try:
                        os.kill(pid, 9)
                    except ProcessLookupError:
                        pass
            time.sleep(0.05)
        os.rmdir(cg)


def pss_kb(pid):
    """Pss and Private (kB) of one process from /proc/PID/smaps_rollup."""
    pss = priv = 0
    try:
        for line in open(f"/proc/{pid}/smaps_rollup"):
            k, *v = line.split()
            if k == "Pss:":
                pss = int(v[0])
            elif k in ("Private_Clean:", "Private_Dirty:"):
                priv += int(v[0])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return pss, priv


def role(pid):
    """What a process of a container is: runsc names its gofer and sandbox
    (Sentry) in argv[0]; the ptrace/systrap stubs that run the application's
    code have an empty command line; the runsc command itself is "runsc"."""
    try:
        argv0 = open(f"/proc/{pid}/cmdline").read().split("\0")[0]
    except OSError:
        return "gone"
    return os.path.basename(argv0) if argv0 else "stubs"


class Container:
    """One runsc container whose command runs in its own cgroup, with our
    pipes as its stdio."""

    def __init__(self, b, cid, subcmd):
        self.b, self.cid = b, cid
        self.cg = b.cgroups.make(cid)
        self.buf = b""
        self.cli_exit = None
        argv = b.runsc + subcmd + [cid]
        # The runsc command is made in two steps so that the measured time
        # holds runsc alone. Here (not timed): fork; the child joins its
        # cgroup, takes the pipes as stdio and waits on a "go" pipe. Moving
        # a process between cgroups waits for an RCU grace period and holds
        # up every fork and thread creation on the machine meanwhile, which
        # made starting N=10 restores take over a second when done inline.
        # go() (timed): one byte, and the child execs runsc. (Python makes
        # its own descriptors close-on-exec, so runsc gets only 0, 1, 2.)
        in_r, self.stdin = os.pipe()
        self.stdout, out_w = os.pipe()
        go_r, self.go_w = os.pipe()
        ready_r, ready_w = os.pipe()
        err = os.open(os.path.join(b.work, f"{cid}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        procs = os.open(os.path.join(self.cg, "cgroup.procs"), os.O_WRONLY)
        pid = os.fork()
        if pid == 0:
            try:
                os.write(procs, str(os.getpid()).encode())
                os.dup2(in_r, 0)
                os.dup2(out_w, 1)
                os.dup2(err, 2)
                os.close(ready_w)  # tells the parent: in the cgroup, waiting
                if os.read(go_r, 1) == b"g":
                    os.execv(argv[0], argv)
            finally:
                os._exit(127)
        self.pid = pid
        for fd in (in_r, out_w, err, procs, go_r, ready_w):
            os.close(fd)
        os.read(ready_r, 1)  # EOF once the child is ready (or gone)
        os.close(ready_r)
        os.set_blocking(self.stdout, False)
        self.t0 = None

    def go(self):
        """Exec runsc in the prepared child; the child's clock starts here."""
        self.t0 = time.perf_counter()
        os.write(self.go_w, b"g")
        os.close(self.go_w)
        # When the runsc command itself returns (restore --detach returns once
        # the sandbox runs), for the breakdown; this also reaps it.
        threading.Thread(target=self._wait_cli, daemon=True).start()

    def _wait_cli(self):
        os.waitpid(self.pid, 0)
        self.cli_exit = time.perf_counter()

    def send(self, code):
        data = (json.dumps({"code": code}) + "\n").encode()
        while data:  # a pipe takes 64 KiB before blocking; requests are small
            data = data[os.write(self.stdin, data):]

    def try_line(self):
        """A complete line if one has arrived (non-blocking read)."""
        try:
            chunk = os.read(self.stdout, 65536)
        except BlockingIOError:
            chunk = None
        if chunk == b"":
            raise RuntimeError(f"{self.cid}: stdout closed; see {self.b.work}/{self.cid}.log:\n" + self.errtail())
        if chunk:
            self.buf += chunk
        if b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            return line.decode()
        return None

    def errtail(self):
        try:
            return open(os.path.join(self.b.work, f"{self.cid}.log")).read()[-2000:]
        except OSError:
            return ""

    def destroy(self):
        if self.t0 is None:  # prepared, never let go: EOF makes it exit
            os.close(self.go_w)
            os.waitpid(self.pid, 0)
        subprocess.run(self.b.runsc + ["delete", "-force", self.cid],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in (self.stdin, self.stdout):
            try:
                os.close(fd)
            except OSError:
                pass
        self.b.cgroups.remove(self.cg)

    def usage_total(self):
        out = subprocess.run(self.b.runsc + ["usage", self.cid], capture_output=True, text=True)
        try:
            return json.loads(out.stdout)["Total"]
        except (ValueError, KeyError):
            return float("nan")

    def memory(self):
        """(PSS kB, private kB, {role: PSS kB}) over the child's processes."""
        tot = priv = 0
        by = {}
        for pid in Cgroups.pids(self.cg):
            p, v = pss_kb(pid)
            tot, priv = tot + p, priv + v
            by[role(pid)] = by.get(role(pid), 0) + p
        return tot, priv, by


def wait_lines(conts, on_line=None):
    """Wait for the next line from each container; {cid: (line, t)}."""
    sel = selectors.DefaultSelector()
    for c in conts:
        sel.register(c.stdout, selectors.EVENT_READ, c)
    got = {}
    deadline = time.time() + TIMEOUT
    # A line may already be buffered from an earlier read.
    for c in conts:
        if b"\n" in c.buf:
            line, c.buf = c.buf.split(b"\n", 1)
            got[c.cid] = (line.decode(), time.perf_counter())
            if on_line:
                on_line(c)
            sel.unregister(c.stdout)
    while len(got) < len(conts):
        if time.time() > deadline:
            missing = [c.cid for c in conts if c.cid not in got]
            raise RuntimeError(f"no answer within {TIMEOUT}s from {missing}; logs in {conts[0].b.work}")
        for key, _ in sel.select(timeout=1):
            c = key.data
            line = c.try_line()
            if line is not None:
                got[c.cid] = (line, time.perf_counter())
                if on_line:
                    on_line(c)
                sel.unregister(c.stdout)
    sel.close()
    return got


def answer(line, cid):
    a = json.loads(line)
    if not a.get("ok"):
        raise RuntimeError(f"{cid}: request failed: {a}")
    return a["value"]


class Bench:
    def __init__(self, o):
        self.o = o
        self.work = o.work
        self.runsc = [o.runsc] + shlex.split(o.runsc_flags)
        self.cgroups = Cgroups(o.work)
        self.bundle = os.path.join(o.work, "bundle")
        self.image = os.path.join(o.work, "checkpoint")
        self.live = []  # containers to destroy on the way out
        self.warm, self.warm_source = WARM, "built-in copy of recipes/py-pandas.toml"
        if o.manifest and os.path.exists(o.manifest):
            w = json.load(open(o.manifest)).get("python", {}).get("warm")
            if w:
                self.warm, self.warm_source = w, o.manifest
        self.r = {}

    def write_bundle(self):
        """config.json from `runsc spec`'s template, changed for the bench."""
        os.makedirs(self.bundle)
        subprocess.run([self.o.runsc, "spec", "--bundle", self.bundle], check=True)
        path = os.path.join(self.bundle, "config.json")
        spec = json.load(open(path))
        p = spec["process"]
        p["args"] = ["python3", "-u", "-c", SERVER % self.warm]
        p["env"], p["cwd"], p["terminal"] = ENV, "/root", False
        # The root fs is the read-only loop mount; runsc's overlay (run.sh's
        # --overlay2=root:memory) makes it writable in the sandbox's memory.
        spec["root"] = {"path": self.o.rootfs_dir, "readonly": False}
        spec["hostname"] = "gvisor-bench"
        spec["linux"].pop("cgroupsPath", None)
        spec["linux"].pop("resources", None)
        json.dump(spec, open(path, "w"), indent=1)

    def prepare(self, cid, subcmd):
        c = Container(self, cid, subcmd)
        self.live.append(c)
        return c

    def stop(self, c):
        self.live.remove(c)
        c.destroy()

    def warm_and_checkpoint(self):
        log("cold start: runsc run, python3 warm-up (pandas, numpy, matplotlib)")
        c = self.prepare("warm", ["run", "--detach", "--bundle", self.bundle])
        c.go()
        line, t = wait_lines([c])["warm"]
        if line != "READY":
            raise RuntimeError(f"warm container said {line!r}")
        self.r["cold_start_s"] = t - c.t0
        pss, priv, by = c.memory()
        self.r["warm_pss_mb"], self.r["warm_private_mb"] = pss / 1024, priv / 1024
        self.r["warm_pss_by_process_mb"] = {k: v / 1024 for k, v in by.items()}
        log(f"warm in {t - c.t0:.2f} s, PSS {pss / 1024:.1f} MB; checkpoint")
        os.makedirs(self.image)
        t0 = time.perf_counter()
        subprocess.run(self.runsc + ["checkpoint", "--image-path", self.image,
                                     "--compression", self.o.compression, "warm"], check=True)
        self.r["checkpoint_s"] = time.perf_counter() - t0
        self.r["checkpoint_mb"] = sum(os.path.getsize(os.path.join(self.image, f))
                                      for f in os.listdir(self.image)) / 1e6
        self.stop(c)

    def prepare_restore(self, cid):
        return self.prepare(cid, ["restore", "--detach", "--image-path", self.image,
                                  "--bundle", self.bundle])

    @staticmethod
    def go(c):
        c.go()
        # The request goes into the pipe at once: the answer comes when the
        # restored server reads it, i.e. the wall time covers the restore.
        c.send(FIRST)

    def sequential(self):
        walls, cpus, clis = [], [], []
        for i in range(self.o.k):
            c = self.prepare_restore(f"seq{i}")
            self.go(c)
            line, t = wait_lines([c])[c.cid]
            value = answer(line, c.cid)
            cpus.append(self.cgroups.cpu_s(c.cg))
            walls.append(t - c.t0)
            if c.cli_exit:
                clis.append(c.cli_exit - c.t0)
            log(f"restore {i + 1}/{self.o.k}: {1000 * walls[-1]:.0f} ms, {cpus[-1]:.2f} CPU-s")
            self.stop(c)
        self.r["first_answer"] = value
        self.r["seq_wall_ms"] = [1000 * w for w in walls]
        self.r["seq_cpu_s"] = cpus
        self.r["seq_restore_cli_ms"] = [1000 * w for w in clis]

    def concurrent(self):
        n = self.o.n
        log(f"{n} restores at once")
        cs = [self.prepare_restore(f"par{i}") for i in range(n)]
        t0 = time.perf_counter()
        for c in cs:
            self.go(c)
        self.r["conc_launch_s"] = time.perf_counter() - t0  # all N runsc commands let go
        cpu = {}
        got = wait_lines(cs, on_line=lambda c: cpu.__setitem__(c.cid, self.cgroups.cpu_s(c.cg)))
        for c in cs:
            answer(got[c.cid][0], c.cid)
        self.r["conc_all_s"] = max(t for _, t in got.values()) - t0
        self.r["conc_wall_ms"] = [1000 * (got[c.cid][1] - c.t0) for c in cs]
        self.r["conc_cpu_s"] = [cpu[c.cid] for c in cs]
        log(f"all {n} answered in {self.r['conc_all_s']:.2f} s")
        # Distinct random.random() across the N children: nothing reseeds a
        # restored copy, so each resumes the checkpoint's generator state.
        for c in cs:
            c.send(RNG)
        got = wait_lines(cs)
        vals = [answer(got[c.cid][0], c.cid) for c in cs]
        self.r["rng_values"] = vals
        self.r["rng_distinct"] = len(set(vals))
        # Memory with all N running (each has run both requests).
        mem = [c.memory() for c in cs]
        # gVisor's own count of the sandbox's memory file (application and
        # Sentry page cache), for a check of the PSS sum.
        self.r["conc_usage_total_mb"] = [c.usage_total() / 2**20 for c in cs]
        self.r["conc_pss_mb"] = [m[0] / 1024 for m in mem]
        self.r["conc_private_mb"] = [m[1] / 1024 for m in mem]
        by = {}
        for m in mem:
            for k, v in m[2].items():
                by.setdefault(k, []).append(v / 1024)
        self.r["conc_pss_by_process_mb"] = {k: statistics.median(v) for k, v in by.items()}
        for c in cs:
            self.stop(c)

    def close(self):
        for c in list(self.live):
            try:
                self.stop(c)
            except Exception as e:  # run.sh's trap retries what is left
                log(f"cleanup {c.cid}: {e}")
        try:
            os.rmdir(self.cgroups.parent)
        except OSError:
            pass


def machine():
    cpu = "?"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = int(open("/proc/meminfo").readline().split()[1]) // 1024
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": pyplatform.release(), "mem_mib": mem}


def report(o, r):
    kvm = os.path.exists("/dev/kvm")
    sw, sc, cw, cc = r["seq_wall_ms"], r["seq_cpu_s"], r["conc_wall_ms"], r["conc_cpu_s"]
    m = r["machine"]
    rows = [
        ("runsc", f"{r['runsc_version']}, platform {o.platform}, --network=none, --overlay2=root:memory"),
        ("cold start: `runsc run` → python3 warm-up done (pandas, numpy, matplotlib)", f"{r['cold_start_s']:.2f} s"),
        ("checkpoint (`runsc checkpoint`), image size", f"{r['checkpoint_s']:.2f} s, {r['checkpoint_mb']:.1f} MB (compression {o.compression})"),
        (f"restore → first answer of `{FIRST}`, {o.k} one at a time, p50 / p90",
         f"{percentile(sw, .5):.0f} ms / {percentile(sw, .9):.0f} ms (min {min(sw):.0f}, max {max(sw):.0f})"),
    ]
    if r["seq_restore_cli_ms"]:
        rc = r["seq_restore_cli_ms"]
        rows.append(("… of which `runsc restore --detach` returned, p50", f"{percentile(rc, .5):.0f} ms"))
    rows += [
        (f"N={o.n} restores at once, wall until all answered", f"{r['conc_all_s']:.2f} s (all {o.n} `runsc restore` started within {r['conc_launch_s']:.2f} s; per child from its own start p50 {percentile(cw, .5):.0f} ms, max {max(cw):.0f} ms)"),
        ("CPU per child to its first answer (cgroup usage: runsc CLI + gofer + Sentry + stubs), median",
         f"{statistics.median(sc):.2f} CPU-s one at a time; {statistics.median(cc):.2f} CPU-s with {o.n} at once"),
        ("warm container before checkpoint: PSS / private", f"{r['warm_pss_mb']:.1f} MB / {r['warm_private_mb']:.1f} MB"),
        (f"per child, median of {o.n} running: PSS / private",
         f"{statistics.median(r['conc_pss_mb']):.1f} MB / {statistics.median(r['conc_private_mb']):.1f} MB "
         f"({100 * statistics.median(r['conc_pss_mb']) / r['warm_pss_mb']:.0f} % of the warm container)"),
        ("… memory file of one sandbox (`runsc usage` Total), median", f"{statistics.median(r['conc_usage_total_mb']):.1f} MB"),
        ("… by process (median PSS)", ", ".join(f"{k} {v:.1f} MB" for k, v in sorted(r["conc_pss_by_process_mb"].items()))),
        (f"distinct `random.random()` across the {o.n} children", f"{r['rng_distinct']} of {o.n}"),
    ]
    out = [f"## gVisor (runsc) peer — {r['start_utc']}–{r['end_utc'][11:]} UTC",
           "",
           f"Machine: {m['cpu']}, {m['cores']} cores, {m['mem_mib']} MiB, kernel {m['kernel']}, "
           f"/dev/kvm {'present' if kvm else 'absent'}; load average {r['load_start']} at start, {r['load_end']} at end.",
           f"Root fs: {o.rootfs_image} (forkd's py-pandas image), read-only, gVisor overlay in memory. "
           f"Warm-up code from {r['warm_source']}.",
           "",
           "| measure | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in rows]
    out += ["",
            "Caveats:",
            f"- Platform {o.platform}: " + (
                "every system call and fault of the application is trapped with ptrace, gVisor's slowest "
                "platform (systrap is runsc's default since 2023; `--platform systrap` to compare)."
                if o.platform == "ptrace" else "runsc's default platform (seccomp traps), no KVM needed."),
            "- Isolation differs: gVisor runs the application on a user-space kernel (the Sentry) in "
            "seccomp-confined host processes sharing the host kernel; a forkd child is a whole VM with "
            "its own guest kernel (QEMU TCG here).",
            "- No sharing between siblings: each restored sandbox reads the whole checkpoint into its own "
            "memory file; forkd children map the template's memory copy-on-write.",
            "- Nothing reseeds a restored copy: every child resumes the checkpoint's random generator "
            "(forkd's agent reseeds each child after restore).",
            "- PSS is taken after each child answered two small requests; a child that touches more of its "
            "libraries grows (the warm container's figure is its state after the warm-up itself).",
            "- No resource limits on the containers (--ignore-cgroups; the forkd guest has 1 vCPU, 512 MiB); "
            "no network (--network=none); requests over the container's stdin/stdout; the checkpoint "
            "image is in the page cache after the first restore.",
            ]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runsc", required=True)
    ap.add_argument("--runsc-flags", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--rootfs-dir", required=True)
    ap.add_argument("--rootfs-image", required=True)
    ap.add_argument("--platform", required=True)
    ap.add_argument("--compression", default="none")
    ap.add_argument("-k", type=int, default=10)
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument("--json")
    ap.add_argument("--manifest", help="forkd snapshot manifest whose python.warm to run")
    o = ap.parse_args()

    r = {"start_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
         "machine": machine(), "load_start": open("/proc/loadavg").read().split()[0],
         "runsc_version": subprocess.run([o.runsc, "--version"], capture_output=True, text=True).stdout.split("\n")[0].replace("runsc version ", ""),
         "platform": o.platform, "compression": o.compression, "k": o.k, "n": o.n,
         "rootfs": o.rootfs_image}
    # SIGTERM (run.sh's trap) unwinds like an error, so close() runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    b = Bench(o)
    b.r = r
    r["warm_code"], r["warm_source"] = b.warm, b.warm_source
    try:
        b.write_bundle()
        b.warm_and_checkpoint()
        b.sequential()
        b.concurrent()
    finally:
        b.close()
    r["end_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    r["load_end"] = open("/proc/loadavg").read().split()[0]
    print(report(o, r))
    if o.json:
        with open(o.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
