"""Files inside a sandbox: ``sandbox.files``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Generator, Iterable, Iterator, List, Literal, Optional, Tuple, Union, overload

from ._api import decode_text, file_query, read_format
from ._http import DEFAULT, Response, _BLOCK
from .client import _iter_file, _remaining_size
from .errors import Conflict, NotFound
from .models import FileInfo

if TYPE_CHECKING:  # pragma: no cover
    from .sandbox import Sandbox

__all__ = ["Files", "FileStream"]


def mkdir_body(path: str, mode: Optional[int]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"path": path}
    if mode is not None:
        body["mode"] = mode
    return body


def parent_missing(e: NotFound) -> bool:
    """e is a mkdir's missing parent, not a missing sandbox."""
    return "parent" in (e.detail or "")


def _raw_body(data: Any) -> Tuple[Any, Dict[str, str]]:
    """The body and headers of a request carrying raw bytes given as str
    (UTF-8), bytes-like, a file object (streamed, its remaining size as
    Content-Length when known) or an iterable of bytes/str chunks."""
    headers = {"Content-Type": "application/octet-stream"}
    body: Any
    if isinstance(data, str):
        body = data.encode("utf-8")
    elif isinstance(data, (bytes, bytearray, memoryview)):
        body = bytes(data) if isinstance(data, memoryview) else data
    elif hasattr(data, "read"):
        size = _remaining_size(data)
        if size is not None:
            headers["Content-Length"] = str(size)
        body = _iter_file(data)
    else:
        body = (x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in data)
    return body, headers


class FileStream:
    """A sandbox file being read (``files.read(path, format="stream")``).

    Iterate it for bytes chunks as they arrive, or ``read()`` it like a
    binary file; close it (or use ``with``) when done early. A transfer
    cut mid-way raises StreamInterrupted, never a short file.
    """

    def __init__(self, resp: Response, path: str) -> None:
        self._resp = resp
        self._chunks: Generator[bytes, None, None] = resp.chunks(_BLOCK)
        self._buf = b""
        self.path = path
        cl = resp.headers.get("Content-Length")
        self.size: Optional[int] = int(cl) if cl and cl.isdigit() else None
        """The file's size when the daemon sent it, else None."""

    def __iter__(self) -> Iterator[bytes]:
        if self._buf:
            b, self._buf = self._buf, b""
            yield b
        for chunk in self._chunks:
            yield chunk

    def read(self, size: int = -1) -> bytes:
        """Read up to ``size`` bytes (all that is left when negative)."""
        if size is None or size < 0:
            parts = [self._buf]
            self._buf = b""
            parts.extend(self._chunks)
            return b"".join(parts)
        while len(self._buf) < size:
            nxt = next(self._chunks, None)
            if nxt is None:
                break
            self._buf += nxt
        out, self._buf = self._buf[:size], self._buf[size:]
        return out

    def close(self) -> None:
        """Stop reading and release the connection."""
        self._chunks.close()
        self._resp.close()

    def __enter__(self) -> "FileStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Files:
    """Files inside a sandbox: ``sandbox.files``. Paths are absolute."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _req(self, method: str, sub: str, path: str, **kw: Any) -> Response:
        q = file_query(path, kw.pop("query", None))
        return self._sb.client._transport.request(
            method, self._sb._path + sub, query=q, what="%s %s in %s" % (kw.pop("verb"), path, self._sb.id), **kw
        )

    def write(
        self,
        path: str,
        data: Union[str, bytes, bytearray, memoryview, Iterable[bytes], Any],
        *,
        mode: Optional[int] = None,
        request_timeout: Any = DEFAULT,
    ) -> FileInfo:
        """Create or replace a file (atomically) with ``data``: str (written
        as UTF-8), bytes, a file object (binary or text) or an iterable of
        bytes chunks. File objects and iterables are streamed, never loaded
        whole. The parent directory must exist (see :meth:`make_dir`).

        Args:
            mode: Permission bits (default 0o644).

        Returns:
            The written file's :class:`FileInfo`.
        """
        body, headers = _raw_body(data)
        q: Dict[str, str] = {}
        if mode is not None:
            q["mode"] = "0%o" % mode
        resp = self._req("PUT", "/files", path, query=q, body=body, headers=headers, timeout=request_timeout, verb="write")
        return FileInfo.from_json(resp.json())

    @overload
    def read(self, path: str, format: Literal["text"] = ..., *, request_timeout: Any = ...) -> str: ...

    @overload
    def read(self, path: str, format: Literal["bytes"], *, request_timeout: Any = ...) -> bytes: ...

    @overload
    def read(self, path: str, format: Literal["stream"], *, request_timeout: Any = ...) -> FileStream: ...

    @overload
    def read(self, path: str, format: str, *, request_timeout: Any = ...) -> Union[str, bytes, FileStream]: ...

    def read(
        self, path: str, format: str = "text", *, request_timeout: Any = DEFAULT  # noqa: A002
    ) -> Union[str, bytes, FileStream]:
        """Read a file.

        Args:
            format: ``"text"`` (str, UTF-8), ``"bytes"``, or ``"stream"``: a
                :class:`FileStream` yielding chunks as they arrive (for big
                files; close it when done).

        Raises:
            NotFound: no such file. InvalidArgument: a directory, or
            ``"text"`` for bytes that are not UTF-8.
        """
        read_format(format)
        resp = self._req("GET", "/files", path, timeout=request_timeout, verb="read")
        if format == "stream":
            return FileStream(resp, path)
        data = b"".join(resp.chunks(_BLOCK))
        if format == "bytes":
            return data
        return decode_text(data, path, self._sb.id)

    def list(self, path: str) -> List[FileInfo]:
        """The entries of a directory."""
        data = self._req("GET", "/files/list", path, verb="list").json()
        return [FileInfo.from_json(d) for d in (data or [])]

    def get_info(self, path: str) -> FileInfo:
        """Describe a file or directory. Raises NotFound."""
        return FileInfo.from_json(self._req("GET", "/files/stat", path, verb="stat").json())

    def exists(self, path: str) -> bool:
        """True when the path exists."""
        try:
            self.get_info(path)
            return True
        except NotFound:
            return False

    def remove(self, path: str, *, recursive: bool = True) -> None:
        """Remove a file, or a directory with everything in it (E2B's
        behaviour; ``recursive=False`` refuses a non-empty directory).
        Raises NotFound."""
        q = {"recursive": "1"} if recursive else {}
        self._req("DELETE", "/files", path, query=q, verb="remove").read()

    def make_dir(self, path: str, *, mode: Optional[int] = None) -> bool:
        """Create a directory and its missing parents. Returns False when it
        already existed (E2B's behaviour). Raises Conflict when a file is in
        the way."""
        body = mkdir_body(path, mode)
        url = self._sb._path + "/files/mkdir"
        what = "mkdir %s in %s" % (path, self._sb.id)
        c = self._sb.client
        try:
            c._json("POST", url, body=body, what=what)
            return True
        except NotFound as e:
            if not parent_missing(e):
                raise  # no such sandbox
            body["parents"] = True
            c._json("POST", url, body=body, what=what)
            return True
        except Conflict:
            if self.get_info(path).is_dir:
                return False
            raise
