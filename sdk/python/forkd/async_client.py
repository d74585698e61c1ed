"""The asyncio API client: :class:`AsyncClient`, its sandboxes and
snapshots. Same calls as :class:`forkd.Client`, awaited; requests are
built and answers parsed by the code the sync client uses.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ._api import (
    DEFAULT_SANDBOX_TIMEOUT,
    Pager,
    fork_body,
    kill_ids,
    list_query,
    q,
    removed_tags,
    sandbox_path,
    set_timeout_body,
    snapshot_delete_query,
)
from ._async_http import AsyncTransport
from ._http import DEFAULT, DEFAULT_REQUEST_TIMEOUT, DEFAULT_RETRIES, Endpoint
from .client import BranchBase, snapshot_settled
from .errors import NotFound
from .models import NetworkPolicyLike, SandboxInfo, SnapshotInfo, VersionInfo
from .operations import _idempotency_headers

if TYPE_CHECKING:  # pragma: no cover
    from .async_sandbox import AsyncSandbox

__all__ = ["AsyncClient", "AsyncSandboxes", "AsyncSnapshots", "AsyncBranch"]


class AsyncClient:
    """A connection to one forkd daemon for asyncio code: the arguments,
    defaults and environment of :class:`forkd.Client`.

    Every call is a coroutine; nothing blocks the event loop. Connections
    are pooled per client (and belong to the loop that opened them).
    Close it with ``await client.aclose()`` or ``async with``.
    """

    def __init__(
        self,
        host: Optional[str] = None,
        *,
        token: Optional[str] = None,
        ca_cert: Optional[str] = None,
        socket: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
        pool_size: int = 16,
        retries: int = DEFAULT_RETRIES,
    ) -> None:
        self._endpoint = Endpoint(host=host, token=token, ca_cert=ca_cert, socket_path=socket)
        self._transport = AsyncTransport(self._endpoint, request_timeout=request_timeout, pool_size=pool_size, retries=retries)
        self.sandboxes = AsyncSandboxes(self)
        """Sandbox operations (:class:`AsyncSandboxes`)."""
        self.snapshots = AsyncSnapshots(self)
        """Snapshot lookups (:class:`AsyncSnapshots`)."""

    _shared: Dict[Tuple[Any, ...], "AsyncClient"] = {}

    @classmethod
    def shared(
        cls,
        host: Optional[str] = None,
        *,
        token: Optional[str] = None,
        ca_cert: Optional[str] = None,
        socket: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
    ) -> "AsyncClient":
        """A process-wide client for these settings, created on first use;
        ``AsyncSandbox.create`` and friends use it when given no client."""
        ep = Endpoint(host=host, token=token, ca_cert=ca_cert, socket_path=socket)
        key = ep.key() + (request_timeout,)
        c = cls._shared.get(key)
        if c is None or c._transport._closed:
            c = cls(host, token=token, ca_cert=ca_cert, socket=socket, request_timeout=request_timeout)
            cls._shared[key] = c
        return c

    @property
    def endpoint(self) -> str:
        """Where this client talks: ``unix:///run/forkd/forkd.sock`` or the URL."""
        return self._endpoint.url

    async def health(self) -> bool:
        """True when the daemon answers ``GET /v1/healthz``."""
        data = await self._json("GET", "/v1/healthz", what="health check")
        return isinstance(data, dict) and data.get("status") == "ok"

    async def version(self) -> VersionInfo:
        """The daemon's version, its Go and VMM versions, and its data dir."""
        return VersionInfo.from_json(await self._json("GET", "/v1/version"))

    async def info(self) -> Dict[str, Any]:
        """``GET /v1/info``: version, ``features``, ``limits``, caller."""
        return await self._json("GET", "/v1/info", what="daemon info") or {}

    async def aclose(self) -> None:
        """Close idle connections. Requests in flight finish; new ones fail."""
        self._transport.close()

    def close(self) -> None:
        """As :meth:`aclose`, from sync code."""
        self._transport.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return "AsyncClient(%r)" % self.endpoint

    # -- internals used by AsyncSandbox ------------------------------------

    async def _json(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, Any]] = None,
        body: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Any = DEFAULT,
        what: str = "",
    ) -> Any:
        resp = await self._transport.request(
            method, path, query=query, json_body=body, headers=headers, timeout=timeout, what=what
        )
        return await resp.json()

    async def _list(self, path: str, *, query: Optional[Mapping[str, Any]] = None) -> List[Any]:
        """Every item of a list endpoint, following ``next_cursor``."""
        p = Pager(path, query)
        while p.query is not None:
            p.feed(await self._json("GET", path, query=p.query))
        return p.items


class AsyncBranch(BranchBase):
    """The result of :meth:`AsyncSandbox.branch` (see :class:`forkd.Branch`);
    ``refresh`` and ``wait`` are awaited."""

    def __init__(self, client: AsyncClient, data: Mapping[str, Any]) -> None:
        super().__init__(data)
        self._client = client

    async def refresh(self) -> SnapshotInfo:
        """Fetch the snapshot's current state."""
        self.snapshot = await self._client.snapshots.get(self.tag)
        return self.snapshot

    async def wait(self, timeout: Optional[float] = None, poll_interval: float = 0.1) -> SnapshotInfo:
        """Wait until the snapshot is ready (raises as ``Branch.wait``)."""
        if self.snapshot.state != "ready":
            self.snapshot = await self._client.snapshots.wait(self.tag, timeout=timeout, poll_interval=poll_interval)
        return self.snapshot


class AsyncSnapshots:
    """Snapshot lookups: ``client.snapshots``. Build, pack and import
    snapshots with the sync :class:`forkd.Client`."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self) -> List[SnapshotInfo]:
        """Every snapshot tag."""
        return [SnapshotInfo.from_json(d) for d in await self._c._list("/v1/snapshots")]

    async def get(self, tag: str) -> SnapshotInfo:
        """One snapshot. Raises NotFound."""
        return SnapshotInfo.from_json(await self._c._json("GET", "/v1/snapshots/" + q(tag, "tag")))

    async def exists(self, tag: str) -> bool:
        """True when the tag exists (in any state)."""
        try:
            await self.get(tag)
            return True
        except NotFound:
            return False

    async def wait(self, tag: str, *, timeout: Optional[float] = None, poll_interval: float = 0.1) -> SnapshotInfo:
        """Poll a snapshot until it is ``ready`` (raises as the sync one)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            s = await self.get(tag)
            if snapshot_settled(s, deadline, timeout):
                return s
            await asyncio.sleep(poll_interval)

    async def delete(self, tag: str, *, cascade: bool = False, force: bool = False) -> List[str]:
        """Remove a snapshot tag; returns the tags removed (see the sync one)."""
        resp = await self._c._transport.request(
            "DELETE", "/v1/snapshots/" + q(tag, "tag"), query=snapshot_delete_query(cascade, force),
            what="delete snapshot %s" % tag,
        )
        return removed_tags(await resp.read(), tag)


class AsyncSandboxes:
    """Sandbox operations: ``client.sandboxes``."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(
        self,
        *,
        tag: Optional[str] = None,
        state: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
    ) -> List[SandboxInfo]:
        """Sandboxes, optionally filtered (see :meth:`forkd.Sandboxes.list`)."""
        data = await self._c._list("/v1/sandboxes", query=list_query(tag, state, labels))
        return [SandboxInfo.from_json(d) for d in data]

    async def get(self, sandbox_id: str) -> SandboxInfo:
        """One sandbox. Raises NotFound (a killed sandbox is forgotten)."""
        return SandboxInfo.from_json(await self._c._json("GET", sandbox_path(sandbox_id)))

    async def set_timeout(self, sandbox_id: str, timeout: float, *, idle_timeout: Optional[float] = None) -> SandboxInfo:
        """End a running sandbox ``timeout`` seconds from now (0: never)."""
        data = await self._c._json(
            "PATCH", sandbox_path(sandbox_id), body=set_timeout_body(timeout, idle_timeout),
            what="set timeout of %s" % sandbox_id,
        )
        return SandboxInfo.from_json(data)

    async def fork(
        self,
        tag: str,
        n: int = 1,
        *,
        timeout: Optional[float] = DEFAULT_SANDBOX_TIMEOUT,
        idle_timeout: Optional[float] = None,
        metadata: Optional[Mapping[str, str]] = None,
        network: Optional[NetworkPolicyLike] = None,
        cpus: Optional[float] = None,
        pull_policy: Optional[str] = None,
        request_timeout: Any = DEFAULT,
        idempotency_key: Optional[str] = None,
    ) -> List["AsyncSandbox"]:
        """Fork ``n`` sandboxes from a snapshot in one request (all or
        nothing); options as :meth:`forkd.Sandboxes.fork`."""
        from .async_sandbox import AsyncSandbox

        body = fork_body(tag, n, timeout, idle_timeout, metadata, network, cpus, pull_policy)
        data = await self._c._json(
            "POST", "/v1/sandboxes", body=body, headers=_idempotency_headers(idempotency_key),
            timeout=request_timeout, what="fork %d from %s" % (n, tag),
        )
        return [AsyncSandbox(self._c, SandboxInfo.from_json(d)) for d in (data.get("sandboxes") or [])]

    async def create(self, tag: str, **kw: Any) -> "AsyncSandbox":
        """Fork one sandbox (see :meth:`fork` for the options)."""
        return (await self.fork(tag, 1, **kw))[0]

    async def connect(self, sandbox_id: str) -> "AsyncSandbox":
        """A handle on an existing sandbox. Raises NotFound."""
        from .async_sandbox import AsyncSandbox

        return AsyncSandbox(self._c, await self.get(sandbox_id))

    async def kill(self, *sandbox_ids: Union[str, Iterable[str]]) -> List[str]:
        """Kill sandboxes by id; returns the ids killed."""
        ids = kill_ids(sandbox_ids)
        if not ids:
            return []
        data = await self._c._json("POST", "/v1/sandboxes/kill", body={"ids": ids})
        return list(data.get("killed") or [])

    async def kill_all(self) -> List[str]:
        """Kill every sandbox of the daemon; returns the ids killed."""
        data = await self._c._json("POST", "/v1/sandboxes/kill", body={"all": True})
        return list(data.get("killed") or [])
