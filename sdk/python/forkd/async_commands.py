"""Processes and terminals in a sandbox, for asyncio:
``async_sandbox.commands`` and ``async_sandbox.pty``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Sequence, Union

from ._async_http import AsyncResponse
from ._async_io import body_of, call, stdin_of
from ._exec import DataHandler, ExecSpec, ExecState, HandleView, OutputHandler, PtySize, exec_spec, header_pid, proc_path, process_gone
from .errors import ForkdError, NotFound, Timeout
from .models import CommandResult, ProcessInfo
from .pty import DEFAULT_PTY_TIMEOUT, pty_spec, resize_path_body

if TYPE_CHECKING:  # pragma: no cover
    from .async_sandbox import AsyncSandbox

__all__ = ["AsyncCommands", "AsyncCommandHandle", "AsyncPty"]


class _AsyncExecStream:
    """Reads one exec answer into an ExecState, calling (or awaiting) the
    callbacks."""

    def __init__(self, sandbox_id: str, describe: str, resp: AsyncResponse, on_stdout: Optional[OutputHandler],
                 on_stderr: Optional[OutputHandler], on_data: Optional[DataHandler], check: bool) -> None:
        self.resp = resp
        self.on_stdout = on_stdout
        self.on_stderr = on_stderr
        self.on_data = on_data
        self.check = check
        self.done = asyncio.Event()
        pid = header_pid(resp.headers.get("X-Forkd-Pid"))
        self.state = ExecState(sandbox_id, describe, pid, resp.request_id, on_stdout is not None, on_stderr is not None)

    async def consume(self) -> None:
        """Read the stream to its end; raises only when cancelled (the
        connection is then closed: the agent kills the process group)."""
        st = self.state
        try:
            async for line in self.resp.lines():
                out, raw, err = st.feed(line)
                if raw:
                    await call(self.on_data, raw)
                if out:
                    await call(self.on_stdout, out)
                if err:
                    await call(self.on_stderr, err)
            out, err = st.flush()
            if out:
                await call(self.on_stdout, out)
            if err:
                await call(self.on_stderr, err)
        except Exception as e:  # noqa: BLE001 - reported by outcome()
            st.error = e
        finally:
            self.resp.close()  # a no-op after a clean end; else cuts the stream
            self.done.set()

    def outcome(self) -> CommandResult:
        return self.state.outcome(self.check)


class AsyncCommandHandle(HandleView):
    """A command started with ``await commands.run(..., background=True)``
    or ``await pty.create()``: its output is read by a task (callbacks run
    there). ``await wait()`` for the result, ``await kill()`` to stop it."""

    def __init__(self, stream: _AsyncExecStream, commands: "AsyncCommands") -> None:
        self._s = stream
        self._commands = commands
        self._task = asyncio.ensure_future(stream.consume())

    async def send_stdin(self, data: Any) -> None:
        """Write ``data`` to the command's stdin (started with ``stdin=True``)."""
        await self._commands.send_stdin(self._need_pid("send_stdin"), data)

    async def close_stdin(self) -> None:
        """Close the command's stdin (EOF); fine after it exited."""
        try:
            await self._commands.close_stdin(self._need_pid("close_stdin"))
        except NotFound as e:
            if not process_gone(e):
                raise

    async def wait(self, timeout: Optional[float] = None) -> CommandResult:
        """The result once the command ends, raising as ``run`` does.
        ``timeout``: seconds to wait (Timeout; the command keeps running).
        Cancelling the wait leaves the command running."""
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except asyncio.TimeoutError:
            raise Timeout("command %s still running after %ss" % (self._s.state.describe, timeout)) from None
        return self._s.outcome()

    async def _settled(self, t: float) -> bool:
        try:
            await asyncio.wait_for(self._s.done.wait(), t)
            return True
        except asyncio.TimeoutError:
            return False

    async def kill(self) -> bool:
        """SIGKILL the command's process group; False when it had ended."""
        if self._s.done.is_set():
            return False
        pid = self._s.state.pid
        if pid is not None:
            try:
                sent = await self._commands.kill(pid)
            except ForkdError:
                sent = False  # cut the connection instead (below)
            if sent and await self._settled(10):
                return True
            if not sent and await self._settled(1):
                return False  # it had exited; its exit event was on the way
        self._s.state.killed = True
        self._s.resp.abort()
        await self._settled(10)
        return True


class AsyncCommands:
    """Run processes in a sandbox: ``sandbox.commands`` (the calls of
    :class:`forkd.Commands`, awaited; callbacks may be coroutines)."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    async def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        envs: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
        stdin: Any = None,
        background: bool = False,
        check: bool = True,
    ) -> Any:
        """Run a command; the arguments and errors of :meth:`forkd.Commands.run`.
        ``stdin`` may also be an async iterable of bytes. Returns a
        CommandResult, or an :class:`AsyncCommandHandle` with
        ``background=True``. Cancelling the call cuts the stream, and the
        daemon kills the process group."""
        spec = exec_spec(cmd, envs=envs, cwd=cwd, timeout=timeout, stdin=stdin)
        stream = await self._start(spec, on_stdout, on_stderr, None, check)
        if background:
            return AsyncCommandHandle(stream, self)
        await stream.consume()
        return stream.outcome()

    async def _start(self, spec: ExecSpec, on_stdout: Optional[OutputHandler], on_stderr: Optional[OutputHandler],
                     on_data: Optional[DataHandler], check: bool) -> _AsyncExecStream:
        sb = self._sb
        body = None if spec.stdin is None else stdin_of(spec.stdin)
        resp = await sb.client._transport.request(
            "POST", sb._path + "/exec", body=body, headers=spec.headers, timeout=spec.sock_timeout,
            what="exec %s in %s" % (spec.describe, sb.id),
        )
        return _AsyncExecStream(sb.id, spec.describe, resp, on_stdout, on_stderr, on_data, check)

    async def list(self) -> List[ProcessInfo]:
        """The commands running in the sandbox."""
        data = await self._sb.client._json("GET", self._sb._path + "/processes", what="list processes in %s" % self._sb.id)
        return [ProcessInfo.from_json(d) for d in (data or [])]

    async def send_stdin(self, pid: int, data: Any) -> None:
        """Write ``data`` to the stdin of command ``pid`` (started with ``stdin=True``)."""
        await self._write_stdin(pid, data, close=False)

    async def close_stdin(self, pid: int) -> None:
        """Close the stdin (EOF) of command ``pid``."""
        await self._write_stdin(pid, b"", close=True)

    async def _write_stdin(self, pid: int, data: Any, close: bool) -> None:
        path = proc_path(self._sb._path, pid, "stdin")
        body, headers = body_of(data)
        if isinstance(body, bytes) and not body:
            body = None
        what = "%s stdin of process %d in %s" % ("close" if close else "write", pid, self._sb.id)
        resp = await self._sb.client._transport.request(
            "POST", path, query={"close": "true"} if close else None, body=body, headers=headers, what=what
        )
        await resp.read()

    async def kill(self, pid: int, signal: str = "SIGKILL") -> bool:
        """Send ``signal`` to command ``pid``'s process group; False when it exited."""
        try:
            await self._sb.client._json(
                "POST", proc_path(self._sb._path, pid, "signal"), body={"signal": signal},
                what="signal %s to process %d in %s" % (signal, pid, self._sb.id),
            )
        except NotFound as e:
            if not process_gone(e):
                raise
            return False
        return True


class AsyncPty:
    """Terminals in a sandbox: ``sandbox.pty`` (see :class:`forkd.pty.Pty`)."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    async def create(
        self,
        size: PtySize = PtySize(rows=24, cols=80),
        *,
        cwd: Optional[str] = None,
        envs: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = DEFAULT_PTY_TIMEOUT,
        on_data: Optional[DataHandler] = None,
        cmd: Optional[Union[str, Sequence[str]]] = None,
    ) -> AsyncCommandHandle:
        """Start a terminal (default: a login shell) and return its handle;
        ``on_data`` gets its output as bytes (and may be a coroutine)."""
        stream = await self._sb.commands._start(pty_spec(size, cmd, cwd, envs, timeout), None, None, on_data, True)
        return AsyncCommandHandle(stream, self._sb.commands)

    async def send_stdin(self, pid: int, data: bytes) -> None:
        """Type ``data`` into terminal ``pid``."""
        await self._sb.commands.send_stdin(pid, data)

    async def resize(self, pid: int, size: PtySize) -> None:
        """Change terminal ``pid``'s size (raises as ``Pty.resize``)."""
        path, body = resize_path_body(self._sb._path, pid, size)
        resp = await self._sb.client._transport.request(
            "POST", path, json_body=body, what="resize terminal %d in %s" % (pid, self._sb.id)
        )
        await resp.read()

    async def kill(self, pid: int) -> bool:
        """SIGKILL terminal ``pid``'s session; False when it had exited."""
        return await self._sb.commands.kill(pid)
