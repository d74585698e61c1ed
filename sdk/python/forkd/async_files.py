"""Files inside a sandbox, for asyncio: ``async_sandbox.files``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncIterator, List, Literal, Optional, Union, overload

from ._api import decode_text, file_query, read_format
from ._async_http import AsyncResponse
from ._async_io import body_of
from ._http import DEFAULT, _BLOCK
from .errors import Conflict, NotFound
from .files import mkdir_body, parent_missing
from .models import FileInfo

if TYPE_CHECKING:  # pragma: no cover
    from .async_sandbox import AsyncSandbox

__all__ = ["AsyncFiles", "AsyncFileStream"]


class AsyncFileStream:
    """A sandbox file being read (``await files.read(path, format="stream")``).

    ``async for`` it for bytes chunks as they arrive, or ``await read()``;
    close it (``await aclose()`` or ``async with``) when done early. A
    transfer cut mid-way raises StreamInterrupted, never a short file.
    """

    def __init__(self, resp: AsyncResponse, path: str) -> None:
        self._resp = resp
        self._chunks = resp.chunks(_BLOCK)
        self._buf = b""
        self.path = path
        cl = resp.headers.get("Content-Length")
        self.size: Optional[int] = int(cl) if cl and cl.isdigit() else None
        """The file's size when the daemon sent it, else None."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._buf:
            b, self._buf = self._buf, b""
            yield b
        async for chunk in self._chunks:
            yield chunk

    async def read(self, size: int = -1) -> bytes:
        """Read up to ``size`` bytes (all that is left when negative)."""
        if size is None or size < 0:
            parts = [self._buf]
            self._buf = b""
            async for chunk in self._chunks:
                parts.append(chunk)
            return b"".join(parts)
        while len(self._buf) < size:
            try:
                self._buf += await self._chunks.__anext__()
            except StopAsyncIteration:
                break
        out, self._buf = self._buf[:size], self._buf[size:]
        return out

    async def aclose(self) -> None:
        """Stop reading and release the connection."""
        self._resp.close()
        await self._chunks.aclose()

    async def __aenter__(self) -> "AsyncFileStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncFiles:
    """Files inside a sandbox: ``sandbox.files``. Paths are absolute; the
    calls are those of :class:`forkd.Files`, awaited."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    async def _req(self, method: str, sub: str, path: str, **kw: Any) -> AsyncResponse:
        qy = file_query(path, kw.pop("query", None))
        return await self._sb.client._transport.request(
            method, self._sb._path + sub, query=qy, what="%s %s in %s" % (kw.pop("verb"), path, self._sb.id), **kw
        )

    async def write(self, path: str, data: Any, *, mode: Optional[int] = None, request_timeout: Any = DEFAULT) -> FileInfo:
        """Create or replace a file (atomically) with ``data``: str (UTF-8),
        bytes, a file object (read in a thread), or an iterable or async
        iterable of bytes chunks (streamed). Returns its :class:`FileInfo`."""
        body, headers = body_of(data)
        qy = {"mode": "0%o" % mode} if mode is not None else {}
        resp = await self._req("PUT", "/files", path, query=qy, body=body, headers=headers, timeout=request_timeout, verb="write")
        return FileInfo.from_json(await resp.json())

    @overload
    async def read(self, path: str, format: Literal["text"] = ..., *, request_timeout: Any = ...) -> str: ...

    @overload
    async def read(self, path: str, format: Literal["bytes"], *, request_timeout: Any = ...) -> bytes: ...

    @overload
    async def read(self, path: str, format: Literal["stream"], *, request_timeout: Any = ...) -> AsyncFileStream: ...

    async def read(
        self, path: str, format: str = "text", *, request_timeout: Any = DEFAULT  # noqa: A002
    ) -> Union[str, bytes, AsyncFileStream]:
        """Read a file as ``"text"`` (UTF-8), ``"bytes"``, or ``"stream"``
        (an :class:`AsyncFileStream`). Raises NotFound, InvalidArgument."""
        read_format(format)
        resp = await self._req("GET", "/files", path, timeout=request_timeout, verb="read")
        if format == "stream":
            return AsyncFileStream(resp, path)
        data = await resp.read()
        return data if format == "bytes" else decode_text(data, path, self._sb.id)

    async def list(self, path: str) -> List[FileInfo]:
        """The entries of a directory."""
        data = await (await self._req("GET", "/files/list", path, verb="list")).json()
        return [FileInfo.from_json(d) for d in (data or [])]

    async def get_info(self, path: str) -> FileInfo:
        """Describe a file or directory. Raises NotFound."""
        return FileInfo.from_json(await (await self._req("GET", "/files/stat", path, verb="stat")).json())

    async def exists(self, path: str) -> bool:
        """True when the path exists."""
        try:
            await self.get_info(path)
            return True
        except NotFound:
            return False

    async def remove(self, path: str, *, recursive: bool = True) -> None:
        """Remove a file, or a directory with everything in it."""
        qy = {"recursive": "1"} if recursive else {}
        await (await self._req("DELETE", "/files", path, query=qy, verb="remove")).read()

    async def make_dir(self, path: str, *, mode: Optional[int] = None) -> bool:
        """Create a directory and its missing parents; False when it existed."""
        body = mkdir_body(path, mode)
        url = self._sb._path + "/files/mkdir"
        what = "mkdir %s in %s" % (path, self._sb.id)
        c = self._sb.client
        try:
            await c._json("POST", url, body=body, what=what)
            return True
        except NotFound as e:
            if not parent_missing(e):
                raise  # no such sandbox
            body["parents"] = True
            await c._json("POST", url, body=body, what=what)
            return True
        except Conflict:
            if (await self.get_info(path)).is_dir:
                return False
            raise
