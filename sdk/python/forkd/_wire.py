"""What the sync and the asyncio transports share: request targets and
headers, retry decisions, and the mapping of connect failures and problem
answers to typed errors. No I/O here.

Internal module.
"""

from __future__ import annotations

import json
import socket
import ssl
import urllib.parse
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import AuthenticationError, ForkdError, Timeout, Unavailable, error_from_problem

if TYPE_CHECKING:  # pragma: no cover
    from ._http import Endpoint

#: Seconds a plain (non-streamed) request may wait for the daemon by default.
DEFAULT_REQUEST_TIMEOUT = 120.0

#: Times a request answered 429 or 503 with a Retry-After is sent again by
#: default (the daemon refused it without acting: a limit, a cap, a restart).
DEFAULT_RETRIES = 2

#: The longest Retry-After a client waits out; a longer one is raised at once.
MAX_RETRY_WAIT = 10.0

#: The most of an error answer's body read to describe it.
MAX_PROBLEM_BODY = 1 << 20

_BLOCK = 256 * 1024  # upload/download block size

Query = Optional[Mapping[str, Union[str, Sequence[str]]]]
Body = Union[None, bytes, bytearray, memoryview, Iterable[bytes], Any]


class _Unset:
    def __repr__(self) -> str:  # pragma: no cover
        return "<default>"


#: Sentinel: "use the client's default timeout".
DEFAULT: Any = _Unset()


def timeout_value(t: Any, default: Optional[float]) -> Optional[float]:
    """A call's timeout: DEFAULT is the client's, None or <= 0 none."""
    if t is DEFAULT:
        return default
    if t is None or t <= 0:
        return None
    return float(t)


def parse_retry_after(v: Optional[str]) -> Optional[float]:
    if not v:
        return None
    try:
        return float(v)
    except ValueError:
        return None


def replayable(body: Body) -> bool:
    """True when a body can be sent twice (bytes, or none)."""
    return body is None or isinstance(body, (bytes, bytearray, memoryview))


def target(path: str, query: Query = None) -> str:
    """The request target: path plus the encoded query (None values and
    empty queries dropped; a list value repeats the key)."""
    if query:
        items: List[Tuple[str, str]] = []
        for k, v in query.items():
            if v is None:
                continue
            if isinstance(v, (list, tuple)):
                items.extend((k, str(x)) for x in v)
            else:
                items.append((k, str(v)))
        if items:
            return path + "?" + urllib.parse.urlencode(items)
    return path


def base_headers(token: Optional[str], agent: str = "forkd-python") -> Dict[str, str]:
    h = {"User-Agent": agent, "Accept-Encoding": "identity"}
    if token:
        h["Authorization"] = "Bearer " + token
    return h


def request_headers(
    base: Mapping[str, str], method: str, body: Body, json_body: Any, headers: Optional[Mapping[str, str]]
) -> Tuple[Dict[str, str], Body]:
    """The headers and body of one request: the JSON body encoded, an
    empty POST/PUT/PATCH given ``Content-Length: 0``."""
    hdrs: Dict[str, str] = dict(base)
    if headers:
        hdrs.update(headers)
    if json_body is not None:
        body = json.dumps(json_body, separators=(",", ":")).encode()
        hdrs["Content-Type"] = "application/json"
    if body is None and method in ("POST", "PUT", "PATCH"):
        hdrs["Content-Length"] = "0"
    return hdrs, body


def retry_wait(err: ForkdError, body: Body, retried: int, retries: int) -> Optional[float]:
    """Seconds to wait before sending a refused request again, or None to
    raise err. Only 429 and 503 answers that carry a Retry-After are
    retried: the daemon says it did nothing and when to come back. A body
    that cannot be sent twice, a wait over MAX_RETRY_WAIT, or the retries
    used up raise at once."""
    retry_after = getattr(err, "retry_after", None)
    if (
        err.status not in (429, 503)
        or retry_after is None
        or retried >= retries
        or not replayable(body)
        or retry_after > MAX_RETRY_WAIT
    ):
        return None
    return max(0.0, float(retry_after))


def connect_error(ep: "Endpoint", err: BaseException) -> ForkdError:
    """A failure to connect, as the error that says how to fix it."""
    where = ep.describe()
    if isinstance(err, (socket.timeout, TimeoutError)):
        return Timeout("connecting to the forkd daemon at %s timed out" % where)
    if ep.kind == "unix":
        if isinstance(err, FileNotFoundError):
            return Unavailable(
                "forkd daemon is not running: no socket at %s. Start it with `forkd daemon start` "
                "(or `sudo forkd serve`), or point FORKD_SOCKET or FORKD_HOST at a running daemon" % ep.socket_path
            )
        if isinstance(err, ConnectionRefusedError):
            return Unavailable(
                "forkd daemon is not running: nothing listens on %s (a stale socket). Start it with "
                "`forkd daemon start` (or `sudo forkd serve`)" % ep.socket_path
            )
        if isinstance(err, PermissionError):
            return Unavailable(
                "permission denied on the forkd socket %s: it is root-only (0600). Run as root, or reach a "
                "TCP listener with FORKD_HOST and FORKD_TOKEN" % ep.socket_path
            )
        return Unavailable("cannot connect to the forkd daemon at %s: %s" % (where, err))
    if isinstance(err, ssl.SSLError):
        hint = " (is FORKD_CA_CERT the CA that signed the daemon's certificate?)"
        return Unavailable("TLS handshake with the forkd daemon at %s failed: %s%s" % (where, err, hint))
    if isinstance(err, ConnectionRefusedError):
        return Unavailable(
            "forkd daemon is not reachable at %s: connection refused. Is `forkd serve --listen` running there?"
            % where
        )
    if isinstance(err, socket.gaierror):
        return Unavailable("cannot resolve the forkd host in %s: %s" % (where, err))
    return Unavailable("cannot connect to the forkd daemon at %s: %s" % (where, err))


def problem_error(
    status: int,
    reason: str,
    header: Callable[[str], Optional[str]],
    data: bytes,
    what: str,
    has_token: bool,
) -> ForkdError:
    """The typed error for an answer >= 400: its problem+json, or, for a
    body that is not one, a message with the status and the start of the
    body. ``header`` looks a header up by name (case-insensitive)."""
    rid = header("X-Request-Id")
    retry = parse_retry_after(header("Retry-After"))
    problem: Any = None
    try:
        problem = json.loads(data) if data else None
    except ValueError:
        problem = None
    if isinstance(problem, dict) and (problem.get("detail") or problem.get("title")):
        err = error_from_problem(problem, status=status, request_id=rid, retry_after=retry)
    else:
        text = data.decode("utf-8", "replace").strip()[:500]
        err = error_from_problem(
            {"status": status, "detail": "%s: daemon answered HTTP %d %s%s"
             % (what, status, reason, (": " + text) if text else "")},
            status=status,
            request_id=rid,
            retry_after=retry,
        )
    if isinstance(err, AuthenticationError) and not has_token:
        err.message += " (set FORKD_TOKEN or pass token=)"
    return err


def split_lines(buf: bytes, chunk: bytes) -> Tuple[List[bytes], bytes]:
    """NDJSON framing: the complete non-empty lines in buf + chunk, and
    what is left of an unfinished one."""
    buf = buf + chunk if buf else chunk
    if b"\n" not in chunk:
        return [], buf
    parts = buf.split(b"\n")
    rest = parts.pop()
    return [p for p in parts if p], rest
