"""What the sync and asyncio SDKs share about running things in a
sandbox: building exec, pty and run_code requests, and turning their
NDJSON event streams into results and errors. No I/O here.

Internal module.
"""

from __future__ import annotations

import base64
import codecs
import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import (
    CommandExitError,
    Conflict,
    ForkdError,
    InvalidArgument,
    NotFound,
    StreamInterrupted,
    Timeout,
    code_from_message,
    error_class,
    error_from_problem,
)
from .models import CommandResult, Execution, Logs

OutputHandler = Callable[[str], Any]
DataHandler = Callable[[bytes], Any]

# Seconds a stream may stay silent past its own timeout before the SDK
# gives up on the daemon (the daemon enforces the timeout itself).
GRACE = 30.0

# Error codes that, inside a stream, mean it was cut: the sandbox died or
# was killed, or the daemon is stopping.
CUT_CODES = ("unavailable", "internal", "canceled")

#: The sizes a terminal may have, rows and columns each.
PTY_MIN, PTY_MAX = 1, 1000

#: What pty.create runs when given no command: a login shell, bash when
#: the image has it.
PTY_SHELL = "if command -v bash >/dev/null 2>&1; then exec bash -i -l; else exec sh -i -l; fi"


@dataclass(frozen=True)
class PtySize:
    """A terminal's size in character cells (E2B's ``PtySize``)."""

    rows: int
    cols: int

    def to_json(self) -> Dict[str, int]:
        for name, v in (("rows", self.rows), ("cols", self.cols)):
            if isinstance(v, bool) or not isinstance(v, int) or not PTY_MIN <= v <= PTY_MAX:
                raise InvalidArgument("pty %s %r: want %d..%d" % (name, v, PTY_MIN, PTY_MAX))
        return {"rows": self.rows, "cols": self.cols}


@dataclass
class ExecSpec:
    """One exec request: its headers, how to name it in messages, and the
    stdin to stream (None: none)."""

    headers: Dict[str, str]
    describe: str
    stdin: Any
    sock_timeout: Optional[float]


def exec_spec(
    cmd: Union[str, Sequence[Any]],
    *,
    envs: Optional[Mapping[str, str]],
    cwd: Optional[str],
    timeout: Optional[float],
    stdin: Any,
    pty: Optional[PtySize] = None,
) -> ExecSpec:
    """The request for ``commands.run`` and ``pty.create``. ``stdin``:
    True keeps input open for send_stdin; False/None: none; anything else
    is streamed as the request body."""
    req: Dict[str, Any] = {}
    if isinstance(cmd, str):
        if not cmd.strip():
            raise InvalidArgument("empty command")
        req["shell"] = cmd
        d = cmd
    else:
        argv = [os.fspath(a) if not isinstance(a, str) else a for a in cmd]
        if not argv:
            raise InvalidArgument("empty argv")
        req["argv"] = argv
        d = " ".join(argv)
    describe = repr(d if len(d) <= 80 else d[:77] + "...")
    if envs:
        req["env"] = {str(k): str(v) for k, v in envs.items()}
    if cwd:
        req["cwd"] = cwd
    if timeout:
        req["timeout_ms"] = max(1, int(timeout * 1000))
    if pty is not None:
        req["pty"] = pty.to_json()
    if stdin is True:
        req["stdin_open"] = True
        stdin = None
    elif stdin is False:
        stdin = None
    if stdin is not None:
        req["stdin"] = True
    headers = {"X-Forkd-Exec": json.dumps(req, separators=(",", ":")), "Accept": "application/x-ndjson"}
    if stdin is not None:
        headers["Content-Type"] = "application/octet-stream"
    return ExecSpec(headers, describe, stdin, None if not timeout else timeout + GRACE)


def proc_path(sandbox_path: str, pid: int, sub: str) -> str:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise InvalidArgument("pid %r: want the positive pid a command reported (handle.pid, commands.list())" % (pid,))
    return "%s/processes/%d/%s" % (sandbox_path, pid, sub)


def process_gone(e: NotFound) -> bool:
    """e says a command's process is gone (it exited), not its sandbox."""
    return "no sandbox" not in (e.detail or str(e))


def header_pid(value: Optional[str]) -> Optional[int]:
    return int(value) if value and value.isdigit() else None


class ExecState:
    """One exec answer as it is read: NDJSON events, then exactly one exit
    event. ``feed`` returns the text to pass to each callback (the caller
    calls them: sync or awaited)."""

    def __init__(self, sandbox_id: str, describe: str, pid: Optional[int], request_id: Optional[str],
                 decode_out: bool, decode_err: bool) -> None:
        self.sandbox_id = sandbox_id
        self.describe = describe
        self.pid = pid
        self.request_id = request_id
        self.out = bytearray()
        self.err = bytearray()
        self.exit_event: Optional[Dict[str, Any]] = None
        self.error: Optional[BaseException] = None
        self.killed = False
        self._dec_out = codecs.getincrementaldecoder("utf-8")("replace") if decode_out else None
        self._dec_err = codecs.getincrementaldecoder("utf-8")("replace") if decode_err else None

    def feed(self, line: bytes) -> Tuple[str, bytes, str]:
        """One event line; returns (stdout text, stdout bytes, stderr text)
        it carried (text only when decoding was asked for)."""
        try:
            ev = json.loads(line)
        except ValueError as e:
            raise StreamInterrupted(
                "command %s in sandbox %s: undecodable event from the daemon: %r"
                % (self.describe, self.sandbox_id, line[:200]),
                request_id=self.request_id,
            ) from e
        t = ev.get("type")
        if t == "stdout":
            data = base64.b64decode(ev.get("data") or "")
            self.out += data
            return (self._dec_out.decode(data) if self._dec_out else ""), data, ""
        if t == "stderr":
            data = base64.b64decode(ev.get("data") or "")
            self.err += data
            return "", b"", (self._dec_err.decode(data) if self._dec_err else "")
        if t == "exit":
            self.exit_event = ev
        elif t == "start" and self.pid is None and ev.get("pid"):
            self.pid = int(ev["pid"])
        return "", b"", ""

    def flush(self) -> Tuple[str, str]:
        """Text held back by the decoders at the end of the stream."""
        out = self._dec_out.decode(b"", final=True) if self._dec_out else ""
        err = self._dec_err.decode(b"", final=True) if self._dec_err else ""
        return out, err

    def exit_code(self) -> Optional[int]:
        ev = self.exit_event
        return None if ev is None else int(ev.get("exit_code") or 0)

    def result(self, exit_ev: Mapping[str, Any]) -> CommandResult:
        out, err = bytes(self.out), bytes(self.err)
        return CommandResult(
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            exit_code=int(exit_ev.get("exit_code") or 0),
            signal=exit_ev.get("signal") or None,
            timed_out=bool(exit_ev.get("timed_out")),
            duration_ms=float(exit_ev.get("duration_us") or 0) / 1000.0,
            error=exit_ev.get("error") or None,
            stdout_bytes=out,
            stderr_bytes=err,
            pid=self.pid,
        )

    def killed_result(self, by: str) -> CommandResult:
        return self.result({"exit_code": 137, "signal": "SIGKILL", "error": "killed by %s" % by})

    def outcome(self, check: bool, killed_by: str = "CommandHandle.kill()") -> CommandResult:
        """The result, or the error it ends with."""
        rid = self.request_id
        if self.killed and self.exit_event is None:
            res = self.killed_result(killed_by)
            if check:
                raise CommandExitError(res, self.describe)
            return res
        if self.error is not None:
            # A cut stream, a timeout, or an exception from a callback.
            if isinstance(self.error, StreamInterrupted) and self.error.partial is None:
                self.error.partial = self.result({"exit_code": -1})
            raise self.error
        ev = self.exit_event
        if ev is None:
            raise StreamInterrupted(
                "command %s in sandbox %s: the stream ended before the process exited; the sandbox may have been "
                "killed or the daemon restarted" % (self.describe, self.sandbox_id),
                request_id=rid,
                partial=self.result({"exit_code": -1}),
            )
        if ev.get("error") and int(ev.get("exit_code") or 0) == -1:
            msg = str(ev["error"])
            code = ev.get("code") or code_from_message(msg)
            text = "command %s in sandbox %s: %s" % (self.describe, self.sandbox_id, msg)
            cls = error_class(code)
            if cls is ForkdError or code in CUT_CODES:
                # The agent lost the process mid-way: the sandbox died or
                # was killed, or the daemon is stopping.
                raise StreamInterrupted(text, code=code, request_id=rid, partial=self.result(ev))
            raise cls(text, code=code, request_id=rid)
        res = self.result(ev)
        if check:
            if res.timed_out:
                raise Timeout("command %s in sandbox %s ran past its timeout and was killed" % (self.describe, self.sandbox_id), result=res)
            if res.exit_code != 0:
                raise CommandExitError(res, self.describe)
        return res


class HandleView:
    """What a command handle shows of its stream, the same for the sync
    and the asyncio handle: ``_s`` has ``state`` (an ExecState) and
    ``done`` (a threading or asyncio Event)."""

    _s: Any

    @property
    def pid(self) -> Optional[int]:
        """The command's pid in the sandbox (None from an older daemon)."""
        return self._s.state.pid

    def _need_pid(self, what: str) -> int:
        if self._s.state.pid is None:
            raise Conflict(
                "%s: the daemon reported no pid for command %s; its sandbox agent predates process control"
                % (what, self._s.state.describe)
            )
        return self._s.state.pid

    @property
    def stdout(self) -> str:
        """Standard output so far (a pty's terminal output)."""
        return self._s.state.out.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """Standard error so far."""
        return self._s.state.err.decode("utf-8", "replace")

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code, or None while it runs."""
        return self._s.state.exit_code() if self._s.done.is_set() else None

    @property
    def done(self) -> bool:
        """True once the command ended (or its stream failed)."""
        return self._s.done.is_set()

    def is_running(self) -> bool:
        """True while the command runs."""
        return not self._s.done.is_set()


def run_code_body(code: str, timeout: Optional[float]) -> Tuple[Dict[str, Any], Optional[float]]:
    """The run_code request body and the socket timeout to read it with."""
    body: Dict[str, Any] = {"code": code}
    if timeout:
        body["timeout_ms"] = max(1, int(timeout * 1000))
    return body, (None if not timeout else timeout + GRACE)


class RunCodeState:
    """A streamed run_code answer as it is read."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.logs = Logs()
        self.final: Optional[Dict[str, Any]] = None

    def feed(self, line: bytes) -> Tuple[str, str]:
        """One event; returns the (stdout, stderr) text it carried."""
        ev = json.loads(line)
        t = ev.get("type")
        if t == "stdout":
            d = ev.get("data") or ""
            self.logs.stdout.append(d)
            return d, ""
        if t == "stderr":
            d = ev.get("data") or ""
            self.logs.stderr.append(d)
            return "", d
        if t in ("result", "error"):
            self.final = ev
        return "", ""

    def execution(self, request_id: Optional[str]) -> Execution:
        """The Execution the stream ended with, or its error raised."""
        final, what, logs = self.final, self.what, self.logs
        if final is None:
            raise StreamInterrupted(
                "%s: the stream ended before the code finished; the sandbox may have been killed" % what,
                request_id=request_id,
                partial=Execution(logs=logs),
            )
        if final.get("type") == "error":
            problem = final.get("error") or {"detail": "run_code failed"}
            if problem.get("code") in CUT_CODES:
                # The session or the sandbox went away mid-run.
                raise StreamInterrupted(
                    "%s: %s" % (what, problem.get("detail") or "the code could not finish"),
                    status=problem.get("status"),
                    code=problem.get("code"),
                    title=problem.get("title"),
                    type=problem.get("type"),
                    request_id=problem.get("request_id") or request_id,
                    problem=problem,
                    partial=Execution(logs=logs),
                )
            raise error_from_problem(problem, request_id=request_id)
        return Execution.from_json(final.get("result") or {}, logs=logs)


def check_execution(ex: Execution, sandbox_id: str, timeout: Optional[float]) -> Execution:
    if ex.timed_out:
        raise Timeout("code in sandbox %s ran past its timeout of %ss and was interrupted" % (sandbox_id, timeout), execution=ex)
    return ex


def bytes_chunks(data: Union[bytes, bytearray, memoryview], block: int) -> List[bytes]:
    b = bytes(data)
    return [b[i:i + block] for i in range(0, len(b), block)] or [b""]
