"""asyncio helpers shared by the async SDK classes: callbacks that may be
coroutines, and request bodies read without blocking the loop.

Internal module.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, AsyncIterator, Callable, Dict, Optional, Tuple

from ._exec import bytes_chunks
from ._wire import _BLOCK
from .client import _remaining_size


async def call(cb: Optional[Callable[[Any], Any]], arg: Any) -> None:
    """Call a callback, awaiting it when it is a coroutine function."""
    if cb is None:
        return
    r = cb(arg)
    if inspect.isawaitable(r):
        await r


async def _read_file(f: Any, block: int) -> AsyncIterator[bytes]:
    """A file object's content, each read run in a thread (a local file's
    read blocks)."""
    loop = asyncio.get_running_loop()
    while True:
        b = await loop.run_in_executor(None, f.read, block)
        if not b:
            return
        yield b.encode("utf-8") if isinstance(b, str) else bytes(b)


async def _encode(source: Any) -> AsyncIterator[bytes]:
    if hasattr(source, "__aiter__"):
        async for x in source:
            yield x.encode("utf-8") if isinstance(x, str) else bytes(x)
    else:
        for x in source:
            yield x.encode("utf-8") if isinstance(x, str) else bytes(x)


def body_of(data: Any) -> Tuple[Any, Dict[str, str]]:
    """A raw-bytes request body and its headers: str (UTF-8), bytes-like,
    a file object (read in a thread, its remaining size as Content-Length
    when known), an iterable or async iterable of bytes/str chunks."""
    headers = {"Content-Type": "application/octet-stream"}
    if isinstance(data, str):
        return data.encode("utf-8"), headers
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data), headers
    if hasattr(data, "read"):
        size = _remaining_size(data)
        if size is not None:
            headers["Content-Length"] = str(size)
        return _read_file(data, _BLOCK), headers
    return _encode(data), headers


def stdin_of(stdin: Any) -> Any:
    """An exec's stdin as a streamed body (always chunked)."""
    if isinstance(stdin, str):
        return _encode([stdin])
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        return _encode(bytes_chunks(stdin, _BLOCK))
    if hasattr(stdin, "read"):
        return _read_file(stdin, _BLOCK)
    return _encode(stdin)
