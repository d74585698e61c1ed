"""Processes in a sandbox: ``sandbox.commands`` and their handles."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Iterable, List, Literal, Mapping, Optional, Sequence, Union, overload

from ._exec import DataHandler, ExecSpec, ExecState, HandleView, OutputHandler, bytes_chunks, exec_spec, header_pid, proc_path, process_gone
from ._http import Response, _BLOCK
from .client import _iter_file
from .errors import ForkdError, NotFound, Timeout
from .files import _raw_body
from .models import CommandResult, ProcessInfo

if TYPE_CHECKING:  # pragma: no cover
    from .sandbox import Sandbox

__all__ = ["Commands", "CommandHandle"]

Stdin = Union[str, bytes, bytearray, memoryview, Iterable[bytes], object]
StdinData = Union[str, bytes, bytearray, memoryview, Iterable[bytes], object]


class CommandHandle(HandleView):
    """A command started with ``commands.run(..., background=True)``.

    Output is collected as it arrives (and passed to the callbacks given to
    ``run``, from a background thread). Call :meth:`wait` for the result or
    :meth:`kill` to stop it; with ``stdin=True``, write to it with
    :meth:`send_stdin` and end its input with :meth:`close_stdin`.
    """

    def __init__(self, stream: "_ExecStream", commands: "Commands") -> None:
        self._s = stream
        self._commands = commands
        self._thread = threading.Thread(target=stream.consume, name="forkd-exec-%s" % stream.state.sandbox_id, daemon=True)
        self._thread.start()

    def send_stdin(self, data: StdinData) -> None:
        """Write ``data`` (str as UTF-8, bytes, a file object or an iterable
        of bytes) to the command's stdin. It returns once the process's
        stdin pipe took all of it.

        Raises:
            Conflict: the command was not started with ``stdin=True``, or its
            stdin is closed. NotFound: the command has exited.
        """
        self._commands.send_stdin(self._need_pid("send_stdin"), data)

    def close_stdin(self) -> None:
        """Close the command's stdin (EOF). Closing twice is fine, and so is
        closing after the command exited (one that read to EOF may exit
        before a second close arrives).

        Raises:
            Conflict: the command was not started with ``stdin=True``.
        """
        try:
            self._commands.close_stdin(self._need_pid("close_stdin"))
        except NotFound as e:
            if not process_gone(e):
                raise

    def wait(self, timeout: Optional[float] = None) -> CommandResult:
        """Wait for the command to end and return its result, raising as
        ``run`` does (CommandExitError for a non-zero exit unless
        ``check=False`` was given, Timeout for the command's own timeout,
        StreamInterrupted when the sandbox died).

        Args:
            timeout: Seconds to wait; on expiry raises Timeout and the command
                keeps running.
        """
        if not self._s.done.wait(timeout):
            raise Timeout("command %s still running after %ss" % (self._s.state.describe, timeout))
        self._thread.join()
        return self._s.outcome()

    def kill(self) -> bool:
        """Stop the command: SIGKILL to its process group (the process and
        what it started). Returns False when it had already ended. A later
        :meth:`wait` reports exit code 137 (SIGKILL)."""
        if self._s.done.is_set():
            return False
        if self._s.state.pid is not None:
            try:
                sent = self._commands.kill(self._s.state.pid)
            except ForkdError:
                sent = False  # cut the connection instead (below)
            if sent and self._s.done.wait(10):
                return True
            if not sent and self._s.done.wait(1):
                return False  # it had exited; its exit event was on the way
        # No pid (an older daemon), or the signal did not end it: cutting
        # the connection makes the agent kill the process group.
        self._s.state.killed = True
        self._s.resp.abort()
        self._s.done.wait(10)
        return True


class _ExecStream:
    """Reads one exec answer into an ExecState, calling the callbacks."""

    def __init__(
        self,
        sandbox_id: str,
        describe: str,
        resp: Response,
        on_stdout: Optional[OutputHandler],
        on_stderr: Optional[OutputHandler],
        on_data: Optional[DataHandler],
        check: bool,
        sender: Optional[threading.Thread] = None,
    ) -> None:
        self.resp = resp
        self.on_stdout = on_stdout
        self.on_stderr = on_stderr
        self.on_data = on_data
        self.check = check
        self.sender = sender
        self.done = threading.Event()
        # The daemon sends the pid with the 200 (and again in the start
        # event, which an older daemon does not send).
        pid = header_pid(resp.headers.get("X-Forkd-Pid") if resp.headers is not None else None)
        self.state = ExecState(sandbox_id, describe, pid, resp.request_id, on_stdout is not None, on_stderr is not None)

    def consume(self) -> None:
        """Read the stream to its end; never raises (see outcome)."""
        st = self.state
        try:
            for line in self.resp.lines():
                out, raw, err = st.feed(line)
                if raw and self.on_data is not None:
                    self.on_data(raw)
                if out:
                    self.on_stdout(out)  # type: ignore[misc]
                if err:
                    self.on_stderr(err)  # type: ignore[misc]
            out, err = st.flush()
            if out:
                self.on_stdout(out)  # type: ignore[misc]
            if err:
                self.on_stderr(err)  # type: ignore[misc]
        except Exception as e:  # noqa: BLE001 - reported by outcome()
            st.error = e
            self.resp.close()
        except BaseException:
            self.resp.close()  # cut: the agent kills the process group
            raise
        finally:
            if self.sender is not None:
                self.resp.close()  # unblocks a sender still writing stdin
                self.sender.join()
            self.done.set()

    def outcome(self) -> CommandResult:
        """The result, or the error it ends with."""
        return self.state.outcome(self.check)


def _stdin_source(stdin: Stdin) -> Iterable[bytes]:
    if isinstance(stdin, str):
        return [stdin.encode("utf-8")]
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        return bytes_chunks(stdin, _BLOCK)
    if hasattr(stdin, "read"):
        return _iter_file(stdin)
    return (x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in stdin)  # type: ignore[union-attr]


class Commands:
    """Run processes in a sandbox: ``sandbox.commands``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    @overload
    def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        envs: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        timeout: Optional[float] = ...,
        on_stdout: Optional[OutputHandler] = ...,
        on_stderr: Optional[OutputHandler] = ...,
        stdin: Optional[Stdin] = ...,
        background: Literal[False] = ...,
        check: bool = ...,
    ) -> CommandResult: ...

    @overload
    def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        envs: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        timeout: Optional[float] = ...,
        on_stdout: Optional[OutputHandler] = ...,
        on_stderr: Optional[OutputHandler] = ...,
        stdin: Optional[Stdin] = ...,
        background: Literal[True],
        check: bool = ...,
    ) -> CommandHandle: ...

    @overload
    def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        envs: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        timeout: Optional[float] = ...,
        on_stdout: Optional[OutputHandler] = ...,
        on_stderr: Optional[OutputHandler] = ...,
        stdin: Optional[Stdin] = ...,
        background: bool = ...,
        check: bool = ...,
    ) -> Union[CommandResult, CommandHandle]: ...

    def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        envs: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
        stdin: Optional[Stdin] = None,
        background: bool = False,
        check: bool = True,
    ) -> Union[CommandResult, CommandHandle]:
        """Run a command and return its :class:`CommandResult`.

        Args:
            cmd: A shell command line (run by ``/bin/sh -c``) or an argv list
                (executed directly, never through a shell).
            envs: Extra environment variables.
            cwd: Working directory.
            timeout: Seconds after which the process group is killed (None:
                no limit).
            on_stdout, on_stderr: Called with output text as it arrives
                (decoded as UTF-8; a character is never split).
            stdin: Data for the process's stdin: str, bytes, a binary (or
                text) file object, or an iterable of bytes; it is streamed
                while the output is read. ``True`` (E2B's meaning) keeps
                stdin open for :meth:`send_stdin` (``handle.send_stdin`` with
                ``background=True``) until :meth:`close_stdin`. None: stdin
                is /dev/null.
            background: Return a :class:`CommandHandle` at once instead of
                waiting.
            check: True (the default, like E2B) raises CommandExitError for a
                non-zero exit and Timeout when ``timeout`` killed the command;
                False returns the result in both cases (see ``exit_code`` and
                ``timed_out``).

        Raises:
            CommandExitError: non-zero exit (with ``check=True``).
            Timeout: killed by ``timeout`` (with ``check=True``).
            NotFound: no such sandbox, or the executable or cwd does not exist.
            StreamInterrupted: the stream ended before the process did (the
                sandbox was killed or died).
        """
        spec = exec_spec(cmd, envs=envs, cwd=cwd, timeout=timeout, stdin=stdin)
        stream = self._start(spec, on_stdout, on_stderr, None, check)
        if background:
            return CommandHandle(stream, self)
        try:
            stream.consume()
        except BaseException:
            stream.resp.close()
            raise
        return stream.outcome()

    def _start(
        self,
        spec: ExecSpec,
        on_stdout: Optional[OutputHandler],
        on_stderr: Optional[OutputHandler],
        on_data: Optional[DataHandler],
        check: bool,
    ) -> "_ExecStream":
        """Send an exec request; returns its stream once the answer's
        headers arrived (stdin, if any, is written by a thread meanwhile)."""
        sb = self._sb
        path = sb._path + "/exec"
        what = "exec %s in %s" % (spec.describe, sb.id)
        transport = sb.client._transport
        sender_thread: Optional[threading.Thread] = None
        if spec.stdin is None:
            resp = transport.request("POST", path, headers=spec.headers, timeout=spec.sock_timeout, what=what)
        else:
            # Full duplex: stdin is written by a thread while the output is
            # read, so a process that echoes as it reads never deadlocks.
            conn, sender = transport.open_duplex("POST", path, spec.headers, spec.sock_timeout, what)
            source = _stdin_source(spec.stdin)
            sender_thread = threading.Thread(target=sender.pump, args=(source,), name="forkd-stdin", daemon=True)
            sender_thread.start()
            try:
                resp = transport.finish_duplex(conn, what)
            except BaseException:
                conn.close()
                sender_thread.join()
                raise
        return _ExecStream(sb.id, spec.describe, resp, on_stdout, on_stderr, on_data, check, sender_thread)

    # -- running commands ----------------------------------------------------

    def _proc_path(self, pid: int, sub: str) -> str:
        return proc_path(self._sb._path, pid, sub)

    def list(self) -> List[ProcessInfo]:
        """The commands running in the sandbox, by pid (each from its start
        until its process exits)."""
        data = self._sb.client._json("GET", self._sb._path + "/processes", what="list processes in %s" % self._sb.id)
        return [ProcessInfo.from_json(d) for d in (data or [])]

    def send_stdin(self, pid: int, data: StdinData) -> None:
        """Write ``data`` (str as UTF-8, bytes, a file object or an iterable
        of bytes) to the stdin of the running command ``pid``, which must
        have been started with ``stdin=True``. Returns once the process's
        stdin pipe took all of it (a process that does not read holds the
        call until ``request_timeout``). Concurrent calls are written one
        after the other, never interleaved.

        Raises:
            NotFound: no running command with this pid. Conflict: it was not
            started with ``stdin=True``, or its stdin is closed.
        """
        self._write_stdin(pid, data, close=False)

    def close_stdin(self, pid: int) -> None:
        """Close the stdin (EOF) of the running command ``pid``, started
        with ``stdin=True``. Closing twice is fine. Raises NotFound,
        Conflict as :meth:`send_stdin`."""
        self._write_stdin(pid, b"", close=True)

    def _write_stdin(self, pid: int, data: StdinData, close: bool) -> None:
        path = self._proc_path(pid, "stdin")
        body, headers = _raw_body(data)
        if isinstance(body, (bytes, bytearray)) and not body:
            body = None  # Content-Length: 0
        what = "%s stdin of process %d in %s" % ("close" if close else "write", pid, self._sb.id)
        self._sb.client._transport.request(
            "POST", path, query={"close": "true"} if close else None, body=body, headers=headers, what=what
        ).read()

    def kill(self, pid: int, signal: str = "SIGKILL") -> bool:
        """Send ``signal`` (a name: ``SIGTERM``, ``TERM``; default SIGKILL)
        to the process group of the running command ``pid``. Returns False
        when no such command runs (it exited), as E2B's ``kill`` does."""
        try:
            self._sb.client._json(
                "POST",
                self._proc_path(pid, "signal"),
                body={"signal": signal},
                what="signal %s to process %d in %s" % (signal, pid, self._sb.id),
            )
        except NotFound as e:
            if not process_gone(e):
                raise  # the sandbox itself is gone
            return False
        return True
