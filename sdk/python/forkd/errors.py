"""Typed errors of the forkd SDK.

Every error the SDK raises is a :class:`ForkdError`. Errors the daemon
answered carry its RFC 9457 problem details (``status``, ``code``,
``title``, ``detail``, ``type``) and the request id, so a failure can be
traced in the daemon's log (``forkd serve`` logs the same id).

The subclasses follow the daemon's stable error codes::

    ForkdError
    ├── InvalidArgument   400 invalid_argument          (also a ValueError)
    ├── AuthenticationError 401 unauthenticated
    ├── PermissionDenied  403 permission_denied         (also a PermissionError)
    ├── NotFound          404 not_found                 (also a LookupError)
    ├── Conflict          409 already_exists, failed_precondition
    ├── RateLimited       429 resource_exhausted        (retry_after)
    ├── Unavailable       503 unavailable, daemon not reachable (also a ConnectionError)
    ├── Timeout           504 deadline_exceeded, client-side and command timeouts (also a TimeoutError)
    ├── StreamInterrupted a streamed answer ended before its final event
    └── CommandExitError  a command exited non-zero (commands.run with check=True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Type

if TYPE_CHECKING:  # pragma: no cover
    from .models import CommandResult, Execution

__all__ = [
    "ForkdError",
    "InvalidArgument",
    "AuthenticationError",
    "PermissionDenied",
    "PermissionDenied",
    "NotFound",
    "Conflict",
    "RateLimited",
    "Unavailable",
    "Timeout",
    "StreamInterrupted",
    "CommandExitError",
    "error_from_problem",
]


class ForkdError(Exception):
    """Base class of every error the SDK raises.

    Attributes:
        message: The human-readable message (also ``str(err)``).
        status: The HTTP status the daemon answered, or None when the
            error did not come from an HTTP answer.
        code: The daemon's stable error class (``not_found``,
            ``already_exists``, ``invalid_argument``, ...), or None.
        title: The problem's title (the HTTP status text).
        detail: The problem's detail: what the daemon said went wrong.
        type: The problem type URI.
        request_id: The request's ``X-Request-Id``, to find it in the
            daemon's log.
        problem: The whole problem document as received (a dict), or None.
    """

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        code: Optional[str] = None,
        title: Optional[str] = None,
        detail: Optional[str] = None,
        type: Optional[str] = None,  # noqa: A002 - RFC 9457 field name
        request_id: Optional[str] = None,
        problem: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail if detail is not None else message
        self.type = type
        self.request_id = request_id
        self.problem: Optional[Dict[str, Any]] = dict(problem) if problem is not None else None

    def __str__(self) -> str:
        if self.request_id:
            return "%s (request id %s)" % (self.message, self.request_id)
        return self.message

    def __repr__(self) -> str:
        parts = [repr(self.message)]
        if self.status is not None:
            parts.append("status=%d" % self.status)
        if self.code:
            parts.append("code=%r" % self.code)
        if self.request_id:
            parts.append("request_id=%r" % self.request_id)
        return "%s(%s)" % (type(self).__name__, ", ".join(parts))


class InvalidArgument(ForkdError, ValueError):
    """The request was refused as invalid (400 ``invalid_argument``).

    Also raised by the SDK itself for arguments it can reject before
    sending anything (an empty sandbox id, an unknown branch mode).
    """


class AuthenticationError(ForkdError):
    """The bearer token is missing or unknown (401 ``unauthenticated``)."""


class PermissionDenied(ForkdError, PermissionError):
    """The token's role may not do this (403 ``permission_denied``): e.g. a
    read-only token writing, a user token on an admin route, a tenant
    removing a snapshot only shared with it, or an archive the daemon's
    import policy refuses."""


class NotFound(ForkdError, LookupError):
    """No such sandbox, snapshot, recipe or file (404 ``not_found``)."""


class Conflict(ForkdError):
    """Already exists, or the target is in the wrong state (409).

    ``code`` tells which: ``already_exists`` (a snapshot tag is taken) or
    ``failed_precondition`` (e.g. a sandbox without a Python session asked
    to run code, a snapshot that others depend on).
    """


class RateLimited(ForkdError):
    """A daemon limit was reached (429 ``resource_exhausted``).

    Attributes:
        retry_after: Seconds the daemon suggests waiting (from the
            ``Retry-After`` header), or None.
    """

    def __init__(self, message: str, *, retry_after: Optional[float] = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class Unavailable(ForkdError, ConnectionError):
    """The daemon is not reachable, or answered 503 ``unavailable``.

    When the daemon cannot be reached at all the message names the socket
    or host that was tried and how to start a daemon.

    Attributes:
        retry_after: Seconds the daemon suggests waiting, or None.
    """

    def __init__(self, message: str, *, retry_after: Optional[float] = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class Timeout(ForkdError, TimeoutError):
    """Something ran out of time.

    Raised when the daemon answers 504 ``deadline_exceeded``, when the
    daemon does not answer within the client's request timeout, when a
    command or code cell is stopped by its ``timeout``, and by
    :meth:`CommandHandle.wait` when its own wait times out.

    Attributes:
        result: For a command stopped by its timeout, the
            :class:`~forkd.CommandResult` with the output it produced.
        execution: For code stopped by its timeout, the
            :class:`~forkd.Execution` with the output it produced.
    """

    def __init__(
        self,
        message: str,
        *,
        result: Optional["CommandResult"] = None,
        execution: Optional["Execution"] = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.result = result
        self.execution = execution


class StreamInterrupted(ForkdError):
    """A streamed answer (exec, run_code stream, file read, snapshot
    create, archive export) ended before its final event or byte.

    Typical causes: the sandbox was killed or died while the command ran,
    the daemon restarted, the connection dropped. What was received is
    never returned as a success.

    Attributes:
        partial: What was received before the cut, where it makes sense
            (a :class:`~forkd.CommandResult` for exec), else None.
    """

    def __init__(self, message: str, *, partial: Any = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.partial = partial


class CommandExitError(ForkdError):
    """A command exited with a non-zero status (``commands.run`` with the
    default ``check=True``, like E2B's ``CommandExitException``).

    Attributes:
        result: The full :class:`~forkd.CommandResult`.
        exit_code, stdout, stderr, signal: Shortcuts into ``result``.
    """

    def __init__(self, result: "CommandResult", command: str = "") -> None:
        what = "command %s" % command if command else "command"
        msg = "%s exited with code %d" % (what, result.exit_code)
        if result.signal:
            msg += " (%s)" % result.signal
        tail = (result.stderr or "").strip()
        if tail:
            if len(tail) > 500:
                tail = "..." + tail[-500:]
            msg += ": " + tail
        super().__init__(msg)
        self.result = result
        self.exit_code = result.exit_code
        self.stdout = result.stdout
        self.stderr = result.stderr
        self.signal = result.signal


_BY_CODE: Dict[str, Type[ForkdError]] = {
    "invalid_argument": InvalidArgument,
    "unauthenticated": AuthenticationError,
    "permission_denied": PermissionDenied,
    "not_found": NotFound,
    "already_exists": Conflict,
    "failed_precondition": Conflict,
    "resource_exhausted": RateLimited,
    "unavailable": Unavailable,
    "deadline_exceeded": Timeout,
}

_BY_STATUS: Dict[int, Type[ForkdError]] = {
    400: InvalidArgument,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    429: RateLimited,
    503: Unavailable,
    504: Timeout,
}

# The daemon's error messages end with the errdefs class text; an exec
# event's error string carries no code field, so the suffix gives it.
_SUFFIX_CODES = (
    ("not found", "not_found"),
    ("already exists", "already_exists"),
    ("invalid argument", "invalid_argument"),
    ("failed precondition", "failed_precondition"),
    ("resource exhausted", "resource_exhausted"),
    ("unavailable", "unavailable"),
    ("not implemented", "not_implemented"),
    ("deadline exceeded", "deadline_exceeded"),
    ("canceled", "canceled"),
    ("internal error", "internal"),
    ("unauthenticated", "unauthenticated"),
    ("permission denied", "permission_denied"),
)


def code_from_message(message: str) -> Optional[str]:
    """The daemon error code a plain error string ends with, if any."""
    m = message.rstrip()
    for suffix, code in _SUFFIX_CODES:
        if m.endswith(": " + suffix) or m == suffix:
            return code
    return None


def error_class(code: Optional[str], status: Optional[int] = None) -> Type[ForkdError]:
    """The error class for a daemon error code (or, failing that, status)."""
    if code and code in _BY_CODE:
        return _BY_CODE[code]
    if status is not None and status in _BY_STATUS:
        return _BY_STATUS[status]
    return ForkdError


def error_from_problem(
    problem: Mapping[str, Any],
    *,
    status: Optional[int] = None,
    request_id: Optional[str] = None,
    retry_after: Optional[float] = None,
) -> ForkdError:
    """Build the typed error for an RFC 9457 problem document."""
    st = problem.get("status") if isinstance(problem.get("status"), int) else status
    code = problem.get("code") or None
    detail = str(problem.get("detail") or problem.get("title") or "daemon answered HTTP %s" % st)
    rid = problem.get("request_id") or request_id
    cls = error_class(code, st)
    kw: Dict[str, Any] = dict(
        status=st,
        code=code,
        title=problem.get("title"),
        detail=detail,
        type=problem.get("type"),
        request_id=rid,
        problem=problem,
    )
    if cls in (RateLimited, Unavailable):
        kw["retry_after"] = retry_after
    return cls(detail, **kw)
