"""asyncio transport: a small HTTP/1.1 client over asyncio streams (Unix
socket, TCP or TLS) with a pool of keep-alive connections. Request
building, retries and error mapping are shared with the sync transport
(:mod:`forkd._wire`). Nothing here blocks the event loop.

Internal module; the public surface is :class:`forkd.AsyncClient`.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any, AsyncIterable, AsyncIterator, Iterable, List, Mapping, Optional, Tuple, Union

from ._http import Endpoint
from ._wire import (
    _BLOCK,
    DEFAULT,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_RETRIES,
    MAX_PROBLEM_BODY,
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

#: Longest status or header line, and most header lines, of an answer.
MAX_HEADER_LINE = 64 * 1024
MAX_HEADERS = 100

AsyncBody = Union[None, bytes, bytearray, memoryview, Iterable[bytes], AsyncIterable[bytes]]


class Headers:
    """An answer's headers; ``get`` is case-insensitive as http.client's."""

    __slots__ = ("_items", "_map")

    def __init__(self, items: List[Tuple[str, str]]) -> None:
        self._items = items
        self._map = {k.lower(): v for k, v in items}

    def get(self, name: str, default: Optional[str] = None) -> Optional[str]:
        return self._map.get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return self._map[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._map

    def items(self) -> List[Tuple[str, str]]:
        return list(self._items)


class _Conn:
    __slots__ = ("reader", "writer", "loop")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.loop = asyncio.get_running_loop()

    def alive(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        try:
            self.writer.close()
        except RuntimeError:  # its loop is closed
            pass


async def _within(aw: Any, t: Optional[float]) -> Any:
    return await (aw if t is None else asyncio.wait_for(aw, t))


class _Cut(Exception):
    """The connection ended inside an answer."""


class AsyncResponse:
    """One answer. Read it fully (``read``, ``json``, ``lines``,
    ``chunks``) or ``close`` it; the connection goes back to the pool only
    when the answer was read to its end. A call cancelled while reading
    closes the connection (the daemon then cancels the request)."""

    def __init__(self, transport: "AsyncTransport", conn: _Conn, status: int, reason: str, headers: Headers,
                 what: str, timeout: Optional[float], method: str, sender: Optional["asyncio.Task[None]"]) -> None:
        self._transport = transport
        self._conn = conn
        self._what = what
        self._timeout = timeout
        self._sender = sender
        self.status = status
        self.reason = reason
        self.headers = headers
        self.request_id: Optional[str] = headers.get("X-Request-Id")
        self.reusable = (headers.get("Connection") or "").lower() != "close"
        self._closed = False
        self._done = False
        self._chunk_left = 0
        self._remaining = -1
        te = (headers.get("Transfer-Encoding") or "").lower()
        cl = headers.get("Content-Length")
        if method == "HEAD" or status in (204, 304):
            self._mode = "none"
            self._done = True
        elif "chunked" in te:
            self._mode = "chunked"
        elif cl is not None and cl.strip().isdigit():
            self._mode = "length"
            self._remaining = int(cl)
            self._done = self._remaining == 0
        else:
            self._mode = "eof"
            self.reusable = False

    # -- lifecycle -------------------------------------------------------

    def close(self) -> None:
        """Release the connection: back to the pool when the answer was read
        to its end (and any request body sent), else closed."""
        if self._closed:
            return
        self._closed = True
        s = self._sender
        sent = s is None or (s.done() and not s.cancelled() and s.exception() is None)
        if s is not None and not s.done():
            s.cancel()
        if self._done and self.reusable and sent:
            self._transport._put(self._conn)
        else:
            self._conn.close()

    def abort(self) -> None:
        """Cut the connection now: a reader waiting on it sees the end of
        the stream, and the daemon cancels the request (for exec: kills the
        process group)."""
        self._conn.close()

    async def __aenter__(self) -> "AsyncResponse":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    # -- reading ---------------------------------------------------------

    def _cut(self, err: BaseException) -> ForkdError:
        if isinstance(err, ForkdError):
            return err
        if isinstance(err, asyncio.TimeoutError):
            return Timeout(
                "%s: the daemon at %s sent nothing within the timeout" % (self._what, self._transport.endpoint.describe()),
                request_id=self.request_id,
            )
        return StreamInterrupted(
            "%s: the answer was cut before its end (%s: %s); the sandbox may have been killed or the daemon restarted"
            % (self._what, type(err).__name__, err),
            request_id=self.request_id,
        )

    async def _read_some(self, n: int) -> bytes:
        """Up to n bytes of the body; b"" at its end."""
        if self._done:
            return b""
        r, t = self._conn.reader, self._timeout
        if self._mode == "length":
            data = await _within(r.read(min(n, self._remaining)), t)
            if not data:
                raise _Cut("%d bytes short" % self._remaining)
            self._remaining -= len(data)
            self._done = self._remaining == 0
            return data
        if self._mode == "eof":
            data = await _within(r.read(n), t)
            self._done = not data
            return data
        if self._chunk_left == 0:
            line = await _within(r.readline(), t)
            if not line.endswith(b"\n"):
                raise _Cut("the connection ended inside the chunked body")
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while True:  # trailers, up to the blank line
                    tl = await _within(r.readline(), t)
                    if not tl.endswith(b"\n"):
                        raise _Cut("the connection ended inside the trailers")
                    if tl in (b"\r\n", b"\n"):
                        break
                self._done = True
                return b""
            self._chunk_left = size
        data = await _within(r.read(min(n, self._chunk_left)), t)
        if not data:
            raise _Cut("the connection ended inside a chunk")
        self._chunk_left -= len(data)
        if self._chunk_left == 0:
            await _within(r.readexactly(2), t)
        return data

    async def chunks(self, size: int = _BLOCK) -> AsyncIterator[bytes]:
        """The body in pieces as they arrive. The connection is released at
        the end, on an error, or when the iteration is stopped or cancelled."""
        try:
            while True:
                try:
                    b = await self._read_some(size)
                except (_Cut, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError, OSError) as e:
                    self._conn.close()
                    raise self._cut(e) from e
                if not b:
                    return
                yield b
        finally:
            self.close()

    async def read(self, limit: int = -1) -> bytes:
        """The whole body (at most ``limit`` bytes when >= 0)."""
        parts: List[bytes] = []
        n = 0
        async for b in self.chunks():
            parts.append(b)
            n += len(b)
            if 0 <= limit <= n:
                break
        self.close()
        data = b"".join(parts)
        return data if limit < 0 else data[:limit]

    async def json(self) -> Any:
        """The body decoded as JSON (None for an empty body)."""
        data = await self.read()
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError as e:
            raise ForkdError("%s: the daemon's answer is not JSON: %r" % (self._what, data[:200]), request_id=self.request_id) from e

    async def lines(self) -> AsyncIterator[bytes]:
        """The body's lines (NDJSON), each as it arrives, without the newline."""
        buf = b""
        try:
            async for chunk in self.chunks(65536):
                done, buf = split_lines(buf, chunk)
                for line in done:
                    yield line
            if buf.strip():
                yield buf
        finally:
            self.close()


async def _read_head(conn: _Conn, t: Optional[float]) -> Tuple[int, str, Headers]:
    """The status line and headers of the final answer (1xx skipped)."""
    r = conn.reader
    while True:
        line = await _within(r.readline(), t)
        if not line:
            raise ConnectionResetError("the daemon closed the connection without answering")
        parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise _Cut("malformed status line %r" % line[:100])
        status, reason = int(parts[1]), (parts[2] if len(parts) > 2 else "")
        items: List[Tuple[str, str]] = []
        while True:
            h = await _within(r.readline(), t)
            if not h.endswith(b"\n"):
                raise _Cut("the connection ended inside the headers")
            if h in (b"\r\n", b"\n"):
                break
            if len(items) >= MAX_HEADERS:
                raise _Cut("more than %d header lines" % MAX_HEADERS)
            k, sep, v = h.decode("latin-1").partition(":")
            if not sep:
                raise _Cut("malformed header line %r" % h[:100])
            items.append((k.strip(), v.strip()))
        if 100 <= status < 200:
            continue
        return status, reason, Headers(items)


async def _aiter(source: Union[Iterable[bytes], AsyncIterable[bytes]]) -> AsyncIterator[bytes]:
    if hasattr(source, "__aiter__"):
        async for b in source:  # type: ignore[union-attr]
            yield b
    else:
        for b in source:  # type: ignore[union-attr]
            yield b


class AsyncTransport:
    """Sends requests to one daemon over a pool of keep-alive connections
    belonging to one event loop (a client used from another loop drops the
    first loop's idle connections)."""

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
        self._idle: List[_Conn] = []
        self._closed = False
        self._base_headers = base_headers(endpoint.token, "forkd-python-asyncio")
        if endpoint.kind == "unix":
            self._host = "forkd"
        else:
            default = 443 if endpoint.kind == "https" else 80
            self._host = endpoint.host if endpoint.port == default else "%s:%d" % (endpoint.host, endpoint.port)
            if ":" in endpoint.host:  # IPv6 literal
                self._host = "[%s]:%d" % (endpoint.host, endpoint.port)

    # -- pool ------------------------------------------------------------

    async def _connect(self, t: Optional[float]) -> _Conn:
        ep = self.endpoint
        try:
            if ep.kind == "unix":
                r, w = await _within(asyncio.open_unix_connection(ep.socket_path, limit=MAX_HEADER_LINE), t)
            else:
                r, w = await _within(
                    asyncio.open_connection(
                        ep.host, ep.port, ssl=ep._ssl, server_hostname=ep.host if ep._ssl else None,
                        limit=MAX_HEADER_LINE,
                    ),
                    t,
                )
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as e:
            raise connect_error(ep, e) from None
        return _Conn(r, w)

    async def _get(self, t: Optional[float]) -> Tuple[_Conn, bool]:
        loop = asyncio.get_running_loop()
        while self._idle:
            c = self._idle.pop()
            if c.loop is loop and c.alive():
                return c, True
            c.close()
        return await self._connect(t), False

    def _put(self, conn: _Conn) -> None:
        if not self._closed and len(self._idle) < self._pool_size and conn.alive():
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Close every idle connection; answers still being read finish."""
        self._closed = True
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    # -- requests --------------------------------------------------------

    def _problem(self, status: int, reason: str, headers: Headers, data: bytes, what: str) -> ForkdError:
        return problem_error(status, reason, headers.get, data, what, bool(self.endpoint.token))

    async def _pump(self, conn: _Conn, source: Any, chunked: bool) -> None:
        """Write a streamed request body; errors end it quietly (the answer
        tells what went wrong). Returns None when all of it was sent."""
        w = conn.writer
        try:
            async for chunk in _aiter(source):
                if not chunk:
                    continue
                chunk = bytes(chunk)
                w.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                await w.drain()
            if chunked:
                w.write(b"0\r\n\r\n")
                await w.drain()
        except Exception as e:
            if not isinstance(e, OSError):
                conn.close()  # the source failed: cut the body, never end it
            raise

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Query = None,
        body: AsyncBody = None,
        json_body: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Any = DEFAULT,
        what: str = "",
    ) -> AsyncResponse:
        """Send one request and return its answer once the status line and
        headers arrived; error statuses raise the typed ForkdError. A
        streamed body (an iterable or async iterable of bytes) is written
        while the answer is read (full duplex). The caller must read or
        close the answer."""
        hdrs, body = request_headers(self._base_headers, method, body, json_body, headers)
        t = timeout_value(timeout, self.request_timeout)
        what = what or "%s %s" % (method, path)
        streamed = not replayable(body)
        if isinstance(body, (bytes, bytearray, memoryview)):
            hdrs["Content-Length"] = str(len(body))
        elif streamed and "Content-Length" not in hdrs:
            hdrs["Transfer-Encoding"] = "chunked"
        head = "%s %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (
            method, target(path, query), self._host, "".join("%s: %s\r\n" % kv for kv in hdrs.items()),
        )
        attempt = retried = 0
        while True:
            attempt += 1
            if self._closed:
                raise ForkdError("the client is closed")
            # A streamed body cannot be sent twice: a fresh connection rules
            # out a pooled one the daemon closed (a restart).
            conn, reused = (await self._connect(t), False) if streamed else await self._get(t)
            sender: Optional["asyncio.Task[None]"] = None
            try:
                conn.writer.write(head.encode("latin-1"))
                if body is not None and not streamed:
                    conn.writer.write(bytes(body))
                await _within(conn.writer.drain(), t)
                if streamed:
                    sender = asyncio.ensure_future(self._pump(conn, body, "Transfer-Encoding" in hdrs))
                status, reason, rh = await _read_head(conn, t)
            except BaseException as e:
                conn.close()
                if sender is not None:
                    if sender.done() and not sender.cancelled():
                        se = sender.exception()
                        if se is not None and not isinstance(se, OSError):
                            raise se from None  # the caller's body source failed
                    sender.cancel()
                if isinstance(e, (ConnectionError, asyncio.IncompleteReadError)) and reused and attempt == 1:
                    continue  # a keep-alive connection the daemon had closed
                if isinstance(e, asyncio.TimeoutError):
                    raise Timeout("%s: the forkd daemon at %s did not answer within %ss" % (what, self.endpoint.describe(), t)) from e
                if isinstance(e, (_Cut, OSError, ValueError, asyncio.IncompleteReadError)):
                    raise Unavailable("%s: talking to the forkd daemon at %s failed: %s" % (what, self.endpoint.describe(), e)) from e
                raise
            resp = AsyncResponse(self, conn, status, reason, rh, what, t, method, sender)
            if sender is not None:
                sender.add_done_callback(_quiet)
            if status >= 400:
                try:
                    data = await resp.read(MAX_PROBLEM_BODY)
                except ForkdError:
                    data = b""
                finally:
                    resp.close()
                err = self._problem(status, reason, rh, data, what)
                wait = retry_wait(err, body, retried, self.retries)
                if wait is None:
                    raise err
                retried += 1
                await asyncio.sleep(wait)
                attempt = 0  # a fresh try: a pooled connection may be stale again
                continue
            return resp


def _quiet(task: "asyncio.Task[None]") -> None:
    """Retrieve a body sender's error (the answer reports the problem)."""
    if not task.cancelled():
        task.exception()
