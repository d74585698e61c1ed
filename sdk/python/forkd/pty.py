"""Interactive terminals in a sandbox: ``sandbox.pty`` (E2B's shapes).

A pty command runs in a new session with a pseudo-terminal as its stdin,
stdout and stderr: everything it prints arrives as stdout bytes, and what
you send is what a keyboard types (``b"\\x03"`` is Ctrl-C to the
foreground job, the line discipline echoes input).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Mapping, Optional, Sequence, Tuple, Union

from ._exec import PTY_SHELL, DataHandler, ExecSpec, PtySize, exec_spec, proc_path

if TYPE_CHECKING:  # pragma: no cover
    from .commands import CommandHandle
    from .sandbox import Sandbox

__all__ = ["Pty", "PtySize"]

#: Seconds a pty lives by default, as E2B (0 or None: no limit).
DEFAULT_PTY_TIMEOUT = 60.0


def pty_spec(
    size: PtySize,
    cmd: Optional[Union[str, Sequence[str]]],
    cwd: Optional[str],
    envs: Optional[Mapping[str, str]],
    timeout: Optional[float],
) -> ExecSpec:
    """The exec request of pty.create: the size, input kept open."""
    if not isinstance(size, PtySize):
        raise TypeError("size must be a forkd.PtySize(rows=..., cols=...), not %r" % (size,))
    return exec_spec(cmd or PTY_SHELL, envs=envs, cwd=cwd, timeout=timeout, stdin=True, pty=size)


def resize_path_body(sandbox_path: str, pid: int, size: PtySize) -> Tuple[str, Dict[str, int]]:
    if not isinstance(size, PtySize):
        raise TypeError("size must be a forkd.PtySize(rows=..., cols=...), not %r" % (size,))
    return proc_path(sandbox_path, pid, "resize"), size.to_json()


class Pty:
    """Terminals in a sandbox: ``sandbox.pty``."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def create(
        self,
        size: PtySize = PtySize(rows=24, cols=80),
        *,
        cwd: Optional[str] = None,
        envs: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = DEFAULT_PTY_TIMEOUT,
        on_data: Optional[DataHandler] = None,
        cmd: Optional[Union[str, Sequence[str]]] = None,
    ) -> "CommandHandle":
        """Start a terminal running ``cmd`` (default: a login shell, bash
        when the image has it) and return its handle at once.

        Args:
            size: The terminal's rows and columns (1..1000 each).
            cwd, envs: Working directory and extra variables (``TERM``
                defaults to ``xterm-256color``).
            timeout: Seconds after which it is killed (default 60, as E2B;
                0 or None: no limit).
            on_data: Called with each piece of output, as bytes, from the
                handle's reader thread.
            cmd: What to run instead of the shell (a command line or argv).

        Returns:
            A :class:`~forkd.CommandHandle`: ``pid``, ``wait()``, ``kill()``,
            ``send_stdin()``; its ``stdout`` is everything the terminal
            printed. ``wait()`` raises CommandExitError for a non-zero exit.
        """
        spec = pty_spec(size, cmd, cwd, envs, timeout)
        from .commands import CommandHandle

        stream = self._sb.commands._start(spec, None, None, on_data, True)
        return CommandHandle(stream, self._sb.commands)

    def send_stdin(self, pid: int, data: bytes) -> None:
        """Type ``data`` into terminal ``pid`` (``b"ls\\n"``, ``b"\\x03"``)."""
        self._sb.commands.send_stdin(pid, data)

    def resize(self, pid: int, size: PtySize) -> None:
        """Change terminal ``pid``'s size; the program gets SIGWINCH.

        Raises:
            InvalidArgument: rows or cols outside 1..1000. NotFound: no such
            process. Conflict: the process has no terminal.
        """
        path, body = resize_path_body(self._sb._path, pid, size)
        self._sb.client._transport.request(
            "POST", path, json_body=body, what="resize terminal %d in %s" % (pid, self._sb.id)
        ).read()

    def kill(self, pid: int) -> bool:
        """SIGKILL terminal ``pid``'s session; False when it had exited."""
        return self._sb.commands.kill(pid)
