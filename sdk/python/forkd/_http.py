"""HTTP transport: http.client over a Unix socket, TCP or TLS, with a small
thread-safe pool of keep-alive connections.

Internal module; the public surface is :class:`forkd.Client`.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any, Dict, Generator, Iterable, Iterator, List, Mapping, Optional, Tuple

from ._wire import (
    _BLOCK,
    DEFAULT,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_RETRIES,
    MAX_PROBLEM_BODY,
    MAX_RETRY_WAIT,
    Body,
    Query,
    base_headers,
    connect_error,
    problem_error,
    replayable,
    request_headers,
    retry_wait,
    split_lines,
    target,
    timeout_value,
)
from .errors import ForkdError, InvalidArgument, StreamInterrupted, Timeout, Unavailable

__all__ = [
    "DEFAULT", "DEFAULT_REQUEST_TIMEOUT", "DEFAULT_RETRIES", "MAX_RETRY_WAIT", "Endpoint", "Response",
    "Transport", "DuplexSender", "_BLOCK",
]

DEFAULT_RUN_DIR = "/run/forkd"


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTPConnection over an AF_UNIX stream socket."""

    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("forkd", timeout=timeout, blocksize=_BLOCK)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._path)
        except BaseException:
            s.close()
            raise
        self.sock = s


class Endpoint:
    """Resolved connection settings (see :class:`forkd.Client`)."""

    __slots__ = ("kind", "socket_path", "host", "port", "scheme", "url", "token", "ca_cert", "_ssl")

    def __init__(
        self,
        host: Optional[str] = None,
        token: Optional[str] = None,
        ca_cert: Optional[str] = None,
        socket_path: Optional[str] = None,
    ) -> None:
        env = os.environ
        if host is not None and socket_path is not None:
            raise InvalidArgument("give host or socket, not both")
        if host is None and socket_path is None:
            host = env.get("FORKD_HOST") or None
            if host is None:
                socket_path = env.get("FORKD_SOCKET") or os.path.join(
                    env.get("FORKD_RUN_DIR") or DEFAULT_RUN_DIR, "forkd.sock"
                )
        self.token: Optional[str] = token if token is not None else (env.get("FORKD_TOKEN") or None)
        self.ca_cert: Optional[str] = ca_cert if ca_cert is not None else (env.get("FORKD_CA_CERT") or None)
        self._ssl: Optional[ssl.SSLContext] = None
        self.host = ""
        self.port = 0
        self.scheme = "unix"
        if host is not None and host.startswith("unix://"):
            socket_path = host[len("unix://"):]
            host = None
        if host is None:
            if not socket_path:
                raise InvalidArgument("empty socket path")
            self.kind = "unix"
            self.socket_path = socket_path
            self.url = "unix://" + socket_path
            return
        u = urllib.parse.urlsplit(host)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise InvalidArgument(
                "host %r: want https://HOST:PORT, http://127.0.0.1:PORT or unix:///path/to/forkd.sock" % host
            )
        if u.path not in ("", "/"):
            raise InvalidArgument("host %r: give no path, only scheme, host and port" % host)
        self.kind = u.scheme
        self.socket_path = ""
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.url = "%s://%s" % (u.scheme, u.netloc)
        if u.scheme == "https":
            ctx = ssl.create_default_context(cafile=self.ca_cert) if self.ca_cert else ssl.create_default_context()
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            self._ssl = ctx
        elif self.ca_cert:
            raise InvalidArgument("a CA certificate (FORKD_CA_CERT) needs an https:// host, not %s" % self.url)

    def describe(self) -> str:
        """Where the daemon is, for messages."""
        if self.kind == "unix":
            return "unix socket %s" % self.socket_path
        return self.url

    def key(self) -> Tuple[Any, ...]:
        return (self.kind, self.socket_path, self.url, self.token, self.ca_cert)

    def new_connection(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self.kind == "unix":
            return _UnixHTTPConnection(self.socket_path, timeout)
        if self.kind == "https":
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=self._ssl, blocksize=_BLOCK
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout, blocksize=_BLOCK)


class Response:
    """One answer. Read it fully (``read``, ``json``, ``lines``, ``chunks``)
    or ``close`` it; the connection goes back to the pool only when the
    answer was read to its end."""

    __slots__ = ("status", "headers", "request_id", "reusable", "_resp", "_conn", "_transport", "_closed", "_what")

    def __init__(
        self,
        transport: "Transport",
        conn: http.client.HTTPConnection,
        resp: http.client.HTTPResponse,
        what: str,
    ) -> None:
        self._transport = transport
        self._conn = conn
        self._resp = resp
        self._closed = False
        self._what = what
        self.reusable = True
        self.status = resp.status
        self.headers = resp.headers
        self.request_id: Optional[str] = resp.getheader("X-Request-Id")

    # -- lifecycle -------------------------------------------------------

    def close(self) -> None:
        """Release the connection: back to the pool when the answer was read
        to its end, else closed (a half-read answer cannot be reused)."""
        if self._closed:
            return
        self._closed = True
        if self.reusable and self._resp.isclosed() and not self._resp.will_close:
            self._transport._put(self._conn)
        else:
            self._resp.close()
            self._conn.close()

    def abort(self) -> None:
        """Cut the connection now, from any thread: a reader blocked on it
        sees the end of the stream. The daemon then cancels the request
        (for exec: kills the process group)."""
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> "Response":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reading ---------------------------------------------------------

    def _cut(self, err: BaseException) -> ForkdError:
        if isinstance(err, ForkdError):
            return err
        if isinstance(err, socket.timeout):
            return Timeout(
                "%s: the daemon at %s sent nothing within the timeout" % (self._what, self._transport.endpoint.describe()),
                request_id=self.request_id,
            )
        return StreamInterrupted(
            "%s: the answer was cut before its end (%s: %s); the sandbox may have been killed or the daemon restarted"
            % (self._what, type(err).__name__, err),
            request_id=self.request_id,
        )

    def read(self) -> bytes:
        """The whole body."""
        try:
            data = self._resp.read()
        except (http.client.HTTPException, OSError) as e:
            self.close()
            raise self._cut(e) from e
        self.close()
        return data

    def json(self) -> Any:
        """The body decoded as JSON (None for an empty body)."""
        data = self.read()
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError as e:
            raise ForkdError(
                "%s: the daemon's answer is not JSON: %r" % (self._what, data[:200]), request_id=self.request_id
            ) from e

    def chunks(self, size: int = _BLOCK) -> Generator[bytes, None, None]:
        """The body as it arrives. A cut raises StreamInterrupted."""
        resp = self._resp
        try:
            while True:
                try:
                    # read1 returns what one chunk holds (streams); a
                    # Content-Length body reads in blocks, and read()
                    # releases the connection at its end where read1
                    # would not.
                    b = resp.read1(size) if resp.chunked else resp.read(size)
                except (http.client.HTTPException, OSError) as e:
                    raise self._cut(e) from e
                if not b:
                    if not resp.chunked and resp.length:
                        raise self._cut(http.client.IncompleteRead(b"", resp.length))
                    break
                yield b
        finally:
            self.close()

    def lines(self) -> Iterator[bytes]:
        """The body's lines (NDJSON), each as it arrives, without the newline."""
        buf = b""
        for chunk in self.chunks(65536):
            done, buf = split_lines(buf, chunk)
            yield from done
        if buf.strip():
            yield buf


class Transport:
    """Sends requests to one daemon over a pool of keep-alive connections."""

    def __init__(
        self,
        endpoint: Endpoint,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
        pool_size: int = 16,
        retries: int = DEFAULT_RETRIES,
    ) -> None:
        if retries < 0:
            raise InvalidArgument("retries must be >= 0, not %r" % retries)
        self.endpoint = endpoint
        self.request_timeout = request_timeout
        self.retries = retries
        self._pool_size = pool_size
        self._idle: List[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._base_headers = base_headers(endpoint.token)

    # -- pool ------------------------------------------------------------

    def _get(self) -> Tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self.endpoint.new_connection(self.request_timeout), False

    def _put(self, conn: http.client.HTTPConnection) -> None:
        if conn.sock is not None:
            with self._lock:
                if not self._closed and len(self._idle) < self._pool_size:
                    self._idle.append(conn)
                    return
        conn.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def close(self) -> None:
        """Close every idle connection; answers still being read finish."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    # -- errors ----------------------------------------------------------

    def _connect_error(self, err: BaseException) -> ForkdError:
        return connect_error(self.endpoint, err)

    def _problem(self, resp: http.client.HTTPResponse, what: str) -> ForkdError:
        try:
            data = resp.read(MAX_PROBLEM_BODY)
        except (http.client.HTTPException, OSError):
            data = b""
        return problem_error(resp.status, resp.reason, resp.getheader, data, what, bool(self.endpoint.token))

    # -- requests --------------------------------------------------------

    def url(self, path: str, query: Query = None) -> str:
        return target(path, query)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query = None,
        body: Body = None,
        json_body: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Any = DEFAULT,
        what: str = "",
    ) -> Response:
        """Send one request and return its answer once the status line and
        headers arrived. Error statuses raise the typed ForkdError. The
        caller must read or close the answer."""
        hdrs, body = request_headers(self._base_headers, method, body, json_body, headers)
        t = timeout_value(timeout, self.request_timeout)
        target = self.url(path, query)
        what = what or "%s %s" % (method, path)
        attempt = 0
        retried = 0
        while True:
            attempt += 1
            if self._closed:
                raise ForkdError("the client is closed")
            if replayable(body):
                conn, reused = self._get()
            else:
                # A streamed body cannot be sent twice: a fresh connection
                # rules out a pooled one the daemon closed (a restart).
                conn, reused = self.endpoint.new_connection(t), False
            try:
                if conn.sock is None:
                    conn.timeout = t
                    try:
                        conn.connect()
                    except (OSError, ssl.SSLError) as e:
                        raise self._connect_error(e) from None
                else:
                    conn.sock.settimeout(t)
                sent_err: Optional[BaseException] = None
                try:
                    conn.request(method, target, body=body, headers=hdrs)
                except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError) as e:
                    # The daemon may have answered early (an upload to a
                    # sandbox that does not exist): read that answer.
                    sent_err = e
                resp = conn.getresponse()
            except ForkdError:
                conn.close()
                raise
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
                    ConnectionAbortedError) as e:
                conn.close()
                if reused and attempt == 1 and replayable(body):
                    continue  # a keep-alive connection the daemon had closed
                raise Unavailable(
                    "%s: the connection to the forkd daemon at %s was lost (%s)" % (what, self.endpoint.describe(), e)
                ) from e
            except socket.timeout as e:
                conn.close()
                raise Timeout(
                    "%s: the forkd daemon at %s did not answer within %ss" % (what, self.endpoint.describe(), t)
                ) from e
            except (http.client.HTTPException, OSError) as e:
                conn.close()
                raise Unavailable("%s: talking to the forkd daemon at %s failed: %s" % (what, self.endpoint.describe(), e)) from e
            if resp.status >= 400:
                try:
                    err = self._problem(resp, what)
                finally:
                    r = Response(self, conn, resp, what)
                    # A request body cut short leaves the connection unusable.
                    r.reusable = sent_err is None
                    r.close()
                wait = retry_wait(err, body, retried, self.retries)
                if wait is not None:
                    retried += 1
                    time.sleep(wait)
                    attempt = 0  # a fresh try: a pooled connection may be stale again
                    continue
                raise err
            if sent_err is not None:
                conn.close()
                raise Unavailable("%s: the connection broke while sending the request body: %s" % (what, sent_err))
            return Response(self, conn, resp, what)

    def open_duplex(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        timeout: Optional[float],
        what: str,
    ) -> Tuple[http.client.HTTPConnection, "DuplexSender"]:
        """Start a request whose body (chunked) is written while its answer
        is read: returns the connection, after the headers were sent, and a
        sender for the body."""
        hdrs: Dict[str, str] = dict(self._base_headers)
        hdrs.update(headers)
        hdrs["Transfer-Encoding"] = "chunked"
        # Always a fresh connection: a streamed body cannot be replayed if a
        # pooled one turned out to be closed, and this one is not reused.
        conn = self.endpoint.new_connection(timeout)
        try:
            if conn.sock is None:
                conn.timeout = timeout
                try:
                    conn.connect()
                except (OSError, ssl.SSLError) as e:
                    raise self._connect_error(e) from None
            else:
                conn.sock.settimeout(timeout)
            conn.putrequest(method, path, skip_accept_encoding=True)
            for k, v in hdrs.items():
                conn.putheader(k, v)
            conn.endheaders()
        except ForkdError:
            conn.close()
            raise
        except (http.client.HTTPException, OSError) as e:
            conn.close()
            raise Unavailable("%s: sending to the forkd daemon at %s failed: %s" % (what, self.endpoint.describe(), e)) from e
        return conn, DuplexSender(conn)

    def finish_duplex(self, conn: http.client.HTTPConnection, what: str) -> Response:
        """Read the answer of a request started with open_duplex."""
        try:
            resp = conn.getresponse()
        except socket.timeout as e:
            conn.close()
            raise Timeout("%s: the forkd daemon at %s did not answer in time" % (what, self.endpoint.describe())) from e
        except (http.client.HTTPException, OSError) as e:
            conn.close()
            raise Unavailable("%s: talking to the forkd daemon at %s failed: %s" % (what, self.endpoint.describe(), e)) from e
        if resp.status >= 400:
            err = self._problem(resp, what)
            conn.close()
            raise err
        r = Response(self, conn, resp, what)
        # The body may still be being sent when the answer ends: never
        # reuse the connection.
        r.reusable = False
        return r


class DuplexSender:
    """Writes a chunked request body on a connection whose answer another
    thread reads."""

    def __init__(self, conn: http.client.HTTPConnection) -> None:
        # The socket itself, not conn.send: once the reader closed the
        # connection, conn.send would silently open a new one.
        self._sock = conn.sock
        self.error: Optional[BaseException] = None

    def send(self, data: bytes) -> None:
        if data:
            self._sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))

    def finish(self) -> None:
        self._sock.sendall(b"0\r\n\r\n")

    def pump(self, source: Iterable[bytes]) -> None:
        """Send every chunk of source, then the end of the body. Errors are
        kept in .error (the answer tells what went wrong)."""
        try:
            for chunk in source:
                if chunk:
                    self.send(bytes(chunk))
            self.finish()
        except BaseException as e:  # noqa: BLE001 - reported via .error
            self.error = e
