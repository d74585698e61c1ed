"""forkd: Python SDK for the forkd microVM sandbox daemon.

Fork sandboxes from a warmed snapshot in milliseconds, run commands and
Python code in them, move files, and branch a running sandbox into a new
snapshot to fork from::

    from forkd import Sandbox

    with Sandbox.create("py") as sb:
        print(sb.commands.run("echo hello").stdout)
        print(sb.run_code("21 * 2").text)

For asyncio code, :class:`AsyncSandbox` has the same calls, awaited::

    async with await AsyncSandbox.create("py") as sb:
        print((await sb.commands.run("echo hello")).stdout)

Standard library only; Python >= 3.9. See README.md for the full guide.
"""

from ._http import DEFAULT_REQUEST_TIMEOUT
from .async_client import AsyncBranch, AsyncClient, AsyncOperations, AsyncSandboxes, AsyncSnapshots
from .async_commands import AsyncCommandHandle, AsyncCommands, AsyncPty
from .async_files import AsyncFiles, AsyncFileStream
from .async_sandbox import AsyncSandbox
from .client import DEFAULT_SANDBOX_TIMEOUT, Branch, Client, Operations, Sandboxes, Snapshots
from .errors import (
    AuthenticationError,
    PermissionDenied,
    CommandExitError,
    Conflict,
    ForkdError,
    InvalidArgument,
    NotFound,
    RateLimited,
    StreamInterrupted,
    Timeout,
    Unavailable,
)
from .models import (
    CommandResult,
    Execution,
    ExecutionError,
    FileInfo,
    Logs,
    NetworkPolicy,
    NetworkStats,
    OperationInfo,
    ParentRef,
    PortInfo,
    ProcessInfo,
    Result,
    SandboxInfo,
    SandboxNetwork,
    SnapshotFile,
    SnapshotInfo,
    VersionInfo,
)
from .pty import Pty, PtySize
from .sandbox import CommandHandle, Commands, Files, FileStream, Sandbox

__version__ = "0.1.0"

#: E2B's name for CommandExitError, for code ported from E2B.
CommandExitException = CommandExitError

__all__ = [
    "__version__",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_SANDBOX_TIMEOUT",
    "Client",
    "Snapshots",
    "Sandboxes",
    "Branch",
    "Operations",
    "OperationInfo",
    "Sandbox",
    "Commands",
    "CommandHandle",
    "Files",
    "FileStream",
    "Pty",
    "PtySize",
    "AsyncClient",
    "AsyncSandboxes",
    "AsyncSnapshots",
    "AsyncOperations",
    "AsyncBranch",
    "AsyncSandbox",
    "AsyncCommands",
    "AsyncCommandHandle",
    "AsyncFiles",
    "AsyncFileStream",
    "AsyncPty",
    "CommandResult",
    "Execution",
    "ExecutionError",
    "Result",
    "Logs",
    "FileInfo",
    "ProcessInfo",
    "SandboxInfo",
    "SandboxNetwork",
    "NetworkPolicy",
    "NetworkStats",
    "PortInfo",
    "SnapshotInfo",
    "SnapshotFile",
    "ParentRef",
    "VersionInfo",
    "ForkdError",
    "InvalidArgument",
    "AuthenticationError",
    "PermissionDenied",
    "NotFound",
    "Conflict",
    "RateLimited",
    "Unavailable",
    "Timeout",
    "StreamInterrupted",
    "CommandExitError",
    "CommandExitException",
]
