"""Build contexts: the files a snapshot create's Dockerfile COPY/ADD or
recipe ``files`` name travel in the request (the daemon never reads the
client's paths). Shared by the sync and asyncio clients.

Internal module.
"""

from __future__ import annotations

import base64
import os
import posixpath
import stat as _stat
from typing import Any, Dict, List, Mapping, Union

from .errors import InvalidArgument

#: The daemon's bounds on a build context (recipe.MaxContextBytes and
#: MaxContextFiles): refused here before anything is sent.
MAX_CONTEXT_BYTES = 64 << 20
MAX_CONTEXT_FILES = 100_000

#: A build context: a mapping of relative path to contents (bytes, or str
#: sent as UTF-8; mode 0o644), or a local directory read recursively.
ContextLike = Union[str, "os.PathLike[str]", Mapping[str, Union[bytes, str]]]


def context_path(p: Any) -> str:
    """A context file's path for the wire: relative, "/"-separated, no
    ".." component; "./" and doubled slashes are dropped."""
    if not isinstance(p, str) or not p or "\x00" in p:
        raise InvalidArgument("context: a path must be a non-empty string, not %r" % (p,))
    if p.startswith("/") or ".." in p.split("/"):
        raise InvalidArgument("context: path %r must be relative to the context, without .." % p)
    c = posixpath.normpath(p)
    if c == ".":
        raise InvalidArgument("context: path %r names the context itself, not a file" % p)
    return c


def _too_big(files: int, size: int) -> None:
    if files > MAX_CONTEXT_FILES or size > MAX_CONTEXT_BYTES:
        raise InvalidArgument(
            "context: over the daemon's limit of %d bytes or %d files (have %s files, %s bytes so far)"
            % (MAX_CONTEXT_BYTES, MAX_CONTEXT_FILES, files, size)
        )


def _entry(path: str, mode: int, data: bytes) -> Dict[str, Any]:
    return {"path": path, "mode": mode, "data": base64.b64encode(data).decode("ascii")}


def context_body(context: ContextLike) -> List[Dict[str, Any]]:
    """The request's ``context`` array ({path, mode, data}), sorted by path.

    A mapping's files get mode 0o644. A directory (str or os.PathLike) is
    read recursively: its regular files, by path relative to it, with their
    permission bits; symlinks and special files are left out. Raises
    InvalidArgument for a bad path or type, a missing directory, or a
    context over 64 MiB or 100000 files (before reading it all)."""
    if isinstance(context, Mapping):
        out: Dict[str, Dict[str, Any]] = {}
        total = 0
        for p, v in context.items():
            rel = context_path(p)
            if rel in out:
                raise InvalidArgument("context: path %r is given twice" % rel)
            if isinstance(v, str):
                data = v.encode("utf-8")
            elif isinstance(v, (bytes, bytearray, memoryview)):
                data = bytes(v)
            else:
                raise InvalidArgument("context[%r]: want bytes or str, not %s" % (p, type(v).__name__))
            total += len(data)
            _too_big(len(out) + 1, total)
            out[rel] = _entry(rel, 0o644, data)
        return [out[k] for k in sorted(out)]
    if isinstance(context, (str, os.PathLike)):
        return _read_dir(os.fspath(context))
    raise InvalidArgument(
        "context: want a mapping of relative path to bytes/str, or a directory path, not %s" % type(context).__name__
    )


def _read_dir(root: str) -> List[Dict[str, Any]]:
    if not os.path.isdir(root):
        raise InvalidArgument("context: %s is not a directory" % root)
    found: List[Any] = []  # (relative path, host path, mode)
    total = 0
    for d, dirs, names in os.walk(root):  # does not descend into symlinked directories
        dirs.sort()
        for n in sorted(names):
            host = os.path.join(d, n)
            try:
                st = os.lstat(host)
            except OSError as e:
                raise InvalidArgument("context: %s" % e) from e
            if not _stat.S_ISREG(st.st_mode):
                continue
            rel = os.path.relpath(host, root).replace(os.sep, "/")
            total += st.st_size
            _too_big(len(found) + 1, total)
            found.append((rel, host, st.st_mode & 0o777))
    out = []
    total = 0
    for rel, host, mode in found:
        try:
            with open(host, "rb") as f:
                data = f.read(MAX_CONTEXT_BYTES + 1 - total)
        except OSError as e:
            raise InvalidArgument("context: %s" % e) from e
        total += len(data)
        _too_big(len(out) + 1, total)  # a file that grew since its stat
        out.append(_entry(rel, mode, data))
    out.sort(key=lambda e: e["path"])
    return out
