"""forkd persistent Python session runner.

Started by forkd-agent as `python3 -u pyrunner.py TOKEN`. Requests arrive on
fd 3 and responses leave on fd 4, one JSON object per line, so nothing user
code prints can corrupt the protocol. User output is not captured here:
fd 1 and fd 2 are pipes the agent reads, so print() and the output of child
processes (os.system, subprocess) land in the same place, in order. After
each request the runner flushes sys.stdout/sys.stderr and writes a marker
("\\x1eFORKD:TOKEN:ID\\x1e") on both fds; the agent attributes everything
before the marker to that request.

Requests:
  {"id": N, "op": "run", "code": "..."}
      -> {"id": N, "result": {MIME: ...}, "display": [{MIME: ...}, ...]}
         or {"id": N, "error": {...}, "display": [...]}

Rich output. The last expression's value is returned by MIME type: always
"text/plain" (its repr), plus what its IPython-style _repr_*_ methods give
("text/html" for a pandas DataFrame, "image/png" base64, ...). "display"
lists, in order, what the code passed to display() and every matplotlib
figure still open when it finished (rendered to PNG, then closed), so
`plt.plot(...)` alone yields a picture as it does in a notebook.
matplotlib draws with its Agg backend: there is no screen.
  {"id": N, "op": "reseed", "seed": "<hex>"}
      -> {"id": N}
  {"id": N, "op": "rehearse", "code": "<source>"}
      -> {"id": N} or {"id": N, "error": {...}} (the copy's own failure)

Rehearsing. A pooled child is restored ahead of its fork, in a VMM whose
emulator has translated none of the guest's code yet: under TCG a child's
first request costs several times its second. "rehearse" runs code the
way "run" does (reseed, parse, exec, display bundle, figures, the answer's
JSON) in a throwaway copy of this process (os.fork), whose output goes to
/dev/null and which exits when done; this process waits for it. The code
pages both share are then translated, and nothing of the session changes:
its globals, cell count, history, generators and open figures are the
copy's to lose, and the copy collects no garbage (finalizers of objects
the session dropped do not run twice). The copy may not write to the file
system: Landlock refuses writing, creating, removing and renaming files
(a kernel without Landlock fails the rehearsal instead). Landlock does not
refuse metadata changes (chmod, utime, xattrs), truncation on kernels
before 6.2 (ABI 3; the guest's 6.1 has ABI 2), signals, network, child
processes or writes to descriptors the session holds open: none of that
is undone, so rehearsal code keeps to computation. It is the snapshot
author's code, in the author's own guest. The copy is killed (its pid
alone) past the request's timeout, and ends on its own after an alarm.

Reseeding. Every sandbox forked from a snapshot resumes this process with
the template's memory, so every generator state in it is the same in all
siblings. The agent sends a reseed (fresh host entropy) after each restore,
before any code runs, and it resets the process-wide generators: random's
global instance (random.random(), random.choice(), ...), numpy's global
RandomState (np.random.rand(), ...) when numpy is imported, and tempfile's
name sequence (tempfile.mkstemp() and friends would otherwise make the same
"random" names in every sibling). Not reseeded, on purpose:

- random.Random() instances and numpy Generator / RandomState objects that
  the warm-up code created and kept (np.random.default_rng()). The runner
  cannot tell a generator seeded for reproducibility (default_rng(42)),
  which must keep its sequence, from one meant to be random, and it does
  not walk user objects to find them. An unseeded one made during warm-up
  gives the same draws in every sibling: create such generators in run_code
  after the fork, or seed them from os.urandom() there.
- Python's str hash seed (PYTHONHASHSEED), fixed when the interpreter
  started: siblings order sets and dicts of strings alike.
os.urandom(), secrets, uuid.uuid4() and random.SystemRandom read the
kernel, whose RNG the agent reseeds on restore, so they differ per sibling.
On start the runner answers {"id": 0, "python": VERSION} without markers.

SIGINT (sent by the agent when a request times out) raises
KeyboardInterrupt only while user code runs; between requests it is ignored,
so a late interrupt never kills the session.
"""

import ast
import base64
import gc
import json
import linecache
import os
import random
import signal
import sys
import time
import traceback

REQ_FD = 3
RESP_FD = 4

_in_user_code = False

# Before any import of matplotlib (the warm-up may import it): no screen.
os.environ.setdefault("MPLBACKEND", "Agg")

# _repr_<name>_ methods and the MIME types they produce, as IPython has them.
_REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
)


def _figure_png(fig):
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _bundle(value):
    """The MIME bundle of value: text/plain and whatever rich forms it has.

    A rich form that fails to render is left out, never an error: the
    plain repr is what the call returns at least.
    """
    out = {"text/plain": repr(value)}
    for method, mime in _REPR_METHODS:
        fn = getattr(value, method, None)
        if fn is None or not callable(fn):
            continue
        try:
            data = fn()
        except Exception:
            continue
        if isinstance(data, tuple):  # (data, metadata)
            data = data[0] if data else None
        if data is None:
            continue
        if isinstance(data, (bytes, bytearray)):
            data = base64.b64encode(bytes(data)).decode("ascii")
        elif mime == "application/json" and not isinstance(data, str):
            data = json.dumps(data)
        elif not isinstance(data, str):
            continue
        out[mime] = data
    if "image/png" not in out and type(value).__name__ == "Figure" and hasattr(value, "savefig"):
        try:
            out["image/png"] = _figure_png(value)
        except Exception:
            pass
    return out


def _open_figures():
    """PNG bundles of the matplotlib figures left open, which are closed."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    out = []
    try:
        for num in plt.get_fignums():
            fig = plt.figure(num)
            out.append({"text/plain": repr(fig), "image/png": _figure_png(fig)})
        plt.close("all")
    except Exception as exc:  # a broken figure must not lose the cell's result
        out.append({"text/plain": "<figure not rendered: %s: %s>" % (type(exc).__name__, exc)})
    return out


def _on_sigint(signum, frame):
    if _in_user_code:
        raise KeyboardInterrupt
    # Between requests (or while answering one): a late interrupt, ignored.


def _marker(token, req_id):
    return ("\x1eFORKD:%s:%d\x1e" % (token, req_id)).encode()


def _user_traceback(exc, filename_prefix):
    """Format exc with the runner's own frames removed."""
    tb = exc.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith(filename_prefix):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _error(exc, filename_prefix):
    return {
        "name": type(exc).__name__,
        "value": str(exc),
        "traceback": _user_traceback(exc, filename_prefix),
    }


class Runner:
    def __init__(self, token):
        self.token = token
        self.globals = {"__name__": "__main__", "__builtins__": __builtins__, "display": self.display}
        self.cells = 0
        self.displayed = []

    def display(self, *values):
        """Show values as rich output of the running cell, as IPython's display()."""
        for v in values:
            self.displayed.append(_bundle(v))

    def run(self, code):
        self.displayed = []
        out = self._run(code)
        # Also after an error: what the cell showed before it failed, as in
        # a notebook.
        shown = self.displayed + _open_figures()
        if shown:
            out["display"] = shown
        self.displayed = []
        return out

    def _run(self, code):
        global _in_user_code
        self.cells += 1
        filename = "<cell-%d>" % self.cells
        # Let tracebacks show the cell's source lines, now and later (a
        # function defined in this cell may fail in a later one).
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            tree = ast.parse(code, filename, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            body = compile(tree, filename, "exec")
            last_code = compile(last, filename, "eval") if last is not None else None
        except BaseException as exc:  # SyntaxError, ValueError (null bytes), ...
            return {"error": _error(exc, "<cell-")}
        value = None
        try:
            _in_user_code = True
            try:
                exec(body, self.globals)
                if last_code is not None:
                    value = eval(last_code, self.globals)
            finally:
                _in_user_code = False
        except BaseException as exc:  # includes KeyboardInterrupt, SystemExit
            return {"error": _error(exc, "<cell-")}
        if value is None:
            return {}
        self.globals["_"] = value
        try:
            bundle = _bundle(value)
        except BaseException as exc:
            return {"error": _error(exc, "<cell-")}
        return {"result": bundle}

    def reseed(self, seed_hex):
        """Reset the process-wide generators from seed (see the module doc
        for what is deliberately left alone)."""
        seed = bytes.fromhex(seed_hex)
        random.seed(seed)
        np = sys.modules.get("numpy")
        if np is not None:
            words = [int.from_bytes(seed[i:i + 4], "little") for i in range(0, len(seed) - 3, 4)]
            np.random.seed(words)
        _reseed_tempfile(seed)
        return {}


    def rehearse(self, code, timeout_ms=0):
        """Run code as run does, in a throwaway copy of this process (see
        the module doc); return the copy's failure, if any, as an error.
        This process waits for the copy, and kills it (SIGKILL, its pid
        only) past timeout_ms: the session is never interrupted for it."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()  # nothing of the parent's is written twice
            except BaseException:
                pass
        pid = os.fork()
        if pid == 0:  # the copy: never returns
            status = 1
            try:
                # No collection in the copy: the finalizers of garbage the
                # session has not collected yet must not run twice.
                gc.disable()
                signal.alarm(_REHEARSE_ALARM)
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                os.close(REQ_FD)
                os.close(RESP_FD)
                status = 3
                _deny_writes()
                status = 1
                self.reseed(os.urandom(32).hex())
                out = self.run(code)
                json.dumps(out)
                status = 2 if "error" in out else 0
            finally:
                os._exit(status)
        deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms else None
        killed = False
        while True:
            try:
                done, status = os.waitpid(pid, os.WNOHANG if deadline else 0)
            except ChildProcessError:  # SIGCHLD ignored by user code
                return _rehearsal_error("could not be waited for")
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                deadline, killed = None, True
                continue
            time.sleep(0.01)
        rc = os.waitstatus_to_exitcode(status)
        if rc == 0:
            return {}
        if killed:
            return _rehearsal_error("was stopped at its deadline (%d ms)" % timeout_ms)
        return _rehearsal_error({
            2: "raised an error",
            3: "could not be kept from writing files: the guest kernel has no Landlock",
        }.get(rc, "ended with status %d" % rc))


def _rehearsal_error(what):
    return {"error": {"name": "RehearsalFailed", "value": "the rehearsal " + what, "traceback": ""}}


# A rehearsal's copy ends after this many seconds whatever it runs.
_REHEARSE_ALARM = 120

# Landlock (linux/landlock.h): system call numbers (the same on every
# architecture), and the file system rights a rehearsal's copy loses.
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_PR_SET_NO_NEW_PRIVS = 38
_LANDLOCK_WRITES = {
    1: (1 << 1) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12),
    2: 1 << 13,  # REFER: links and renames across directories
    3: 1 << 14,  # TRUNCATE
}


def _deny_writes():
    """Forbid this process, for good, every write to the file system: a
    Landlock ruleset that handles every writing right and grants none.
    Reads, and descriptors already open, are not affected. Raises OSError
    where the kernel has no Landlock."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 1:
        raise OSError(ctypes.get_errno(), "Landlock is not available")
    handled = 0
    for version, rights in _LANDLOCK_WRITES.items():
        if abi >= version:
            handled |= rights
    attr = ctypes.c_uint64(handled)  # struct landlock_ruleset_attr, fs rights only
    fd = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(8), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(fd)


def _reseed_tempfile(seed):
    """Give tempfile's name sequence a generator derived from seed.

    tempfile draws names from one _RandomNameSequence (created on first
    use, under _once_lock), whose Random is seeded once and replaced only
    when os.getpid() changes, which a restored VM does not do. It is
    reseeded in place, since code may hold it (_get_candidate_names());
    its stream is kept apart from random's global one by hashing the seed.
    """
    tempfile = sys.modules.get("tempfile")
    if tempfile is None:
        return  # imported later: its sequence is created then, from urandom
    import hashlib
    rng = random.Random(hashlib.sha256(b"forkd tempfile names\0" + seed).digest())
    lock = getattr(tempfile, "_once_lock", None)
    if lock is None:
        tempfile._name_sequence = None
        return
    with lock:
        seq = getattr(tempfile, "_name_sequence", None)
        if seq is None:
            return
        if isinstance(getattr(type(seq), "rng", None), property):
            # rng replaces _rng only when _rng_pid is not this pid.
            seq._rng = rng
            seq._rng_pid = os.getpid()
        else:  # an unknown implementation: let tempfile make a new one
            tempfile._name_sequence = None


def main():
    token = sys.argv[1]
    signal.signal(signal.SIGINT, _on_sigint)
    # User code and its children must not see (or write) the protocol fds.
    os.set_inheritable(REQ_FD, False)
    os.set_inheritable(RESP_FD, False)
    requests = os.fdopen(REQ_FD, "rb")
    responses = os.fdopen(RESP_FD, "wb", buffering=0)
    runner = Runner(token)

    def answer(msg):
        responses.write(json.dumps(msg).encode() + b"\n")

    answer({"id": 0, "python": sys.version.split()[0]})
    while True:
        line = requests.readline()  # PEP 475: EINTR from a SIGINT is retried
        if not line:
            return  # the agent closed the channel
        req = {}
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "run":
                out = runner.run(req.get("code", ""))
            elif op == "reseed":
                out = runner.reseed(req["seed"])
            elif op == "rehearse":
                out = runner.rehearse(req.get("code", ""), int(req.get("timeout_ms") or 0))
            else:
                out = {"error": {"name": "ProtocolError", "value": "unknown op %r" % (op,), "traceback": ""}}
        except BaseException as exc:
            if not isinstance(req, dict):
                req = {}
            out = {"error": {"name": type(exc).__name__, "value": str(exc), "traceback": traceback.format_exc()}}
        req_id = req.get("id", -1)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass  # user replaced or closed it
        mark = _marker(token, req_id)
        for fd in (1, 2):
            try:
                os.write(fd, mark)
            except OSError:
                pass
        out["id"] = req_id
        answer(out)


if __name__ == "__main__":
    main()
