"""The asyncio API client: :class:`AsyncClient`, its sandboxes and
snapshots. Same calls as :class:`forkd.Client`, awaited; requests are
built and answers parsed by the code the sync client uses.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

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
from ._async_io import call
from ._context import ContextLike
from ._http import DEFAULT, DEFAULT_REQUEST_TIMEOUT, DEFAULT_RETRIES, Endpoint
from .client import BranchBase, Snapshots, snapshot_settled
from .errors import ForkdError, NotFound
from .models import NetworkPolicyLike, OperationInfo, SandboxInfo, SnapshotInfo, VersionInfo
from .operations import Operations, _Follow, _idempotency_headers, _op_path

if TYPE_CHECKING:  # pragma: no cover
    from .async_sandbox import AsyncSandbox

__all__ = ["AsyncClient", "AsyncSandboxes", "AsyncSnapshots", "AsyncOperations", "AsyncBranch"]


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
        """Snapshot creates and lookups (:class:`AsyncSnapshots`)."""
        self.operations = AsyncOperations(self)
        """Long operations the daemon owns (:class:`AsyncOperations`)."""

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
    """Snapshot creates and lookups: ``client.snapshots``. Compact, pack
    and import snapshots with the sync :class:`forkd.Client`."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self,
        tag: str,
        *,
        recipe: Optional[str] = None,
        recipe_toml: Optional[str] = None,
        from_image: Optional[str] = None,
        insecure_registry: bool = False,
        dockerfile: Optional[str] = None,
        name: Optional[str] = None,
        build_args: Optional[Mapping[str, str]] = None,
        context: Optional[ContextLike] = None,
        build_network: Optional[NetworkPolicyLike] = None,
        registry_username: Optional[str] = None,
        registry_password: Optional[str] = None,
        warm: Optional[str] = None,
        memory_mib: Optional[int] = None,
        vcpus: Optional[int] = None,
        network: Optional[NetworkPolicyLike] = None,
        on_progress: Optional[Callable[[str], Any]] = None,
        timeout: Optional[float] = None,
        idempotency_key: Optional[str] = None,
    ) -> SnapshotInfo:
        """Build an image, boot it, warm it and save it as a snapshot: the
        arguments of :meth:`forkd.Snapshots.create` (a recipe, an OCI image
        or a Dockerfile and its context). ``on_progress`` may be a
        coroutine function. The daemon owns the work: a cancelled call does
        not stop it; ``await client.operations.cancel(id)`` does."""
        op = await self._start(
            tag, timeout, idempotency_key,
            recipe=recipe, recipe_toml=recipe_toml, from_image=from_image, insecure_registry=insecure_registry,
            dockerfile=dockerfile, name=name, build_args=build_args, context=context, build_network=build_network,
            registry_username=registry_username, registry_password=registry_password,
            warm=warm, memory_mib=memory_mib, vcpus=vcpus, network=network,
        )
        return SnapshotInfo.from_json(
            Operations._result(await self._c.operations.wait(op.id, on_progress=on_progress, timeout=timeout))
        )

    async def start_create(
        self,
        tag: str,
        *,
        recipe: Optional[str] = None,
        recipe_toml: Optional[str] = None,
        from_image: Optional[str] = None,
        insecure_registry: bool = False,
        dockerfile: Optional[str] = None,
        name: Optional[str] = None,
        build_args: Optional[Mapping[str, str]] = None,
        context: Optional[ContextLike] = None,
        build_network: Optional[NetworkPolicyLike] = None,
        registry_username: Optional[str] = None,
        registry_password: Optional[str] = None,
        warm: Optional[str] = None,
        memory_mib: Optional[int] = None,
        vcpus: Optional[int] = None,
        network: Optional[NetworkPolicyLike] = None,
        idempotency_key: Optional[str] = None,
    ) -> OperationInfo:
        """Start a snapshot create and return its operation at once (the
        arguments are :meth:`create`'s). Follow it with
        ``await client.operations.wait(op.id)``; its result is the snapshot."""
        return await self._start(
            tag, DEFAULT, idempotency_key,
            recipe=recipe, recipe_toml=recipe_toml, from_image=from_image, insecure_registry=insecure_registry,
            dockerfile=dockerfile, name=name, build_args=build_args, context=context, build_network=build_network,
            registry_username=registry_username, registry_password=registry_password,
            warm=warm, memory_mib=memory_mib, vcpus=vcpus, network=network,
        )

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

    async def _start(self, tag: str, timeout: Any, idempotency_key: Optional[str], **kw: Any) -> OperationInfo:
        build = functools.partial(Snapshots._create_body, tag, **kw)
        if isinstance(kw.get("context"), (str, os.PathLike)):
            body = await asyncio.get_running_loop().run_in_executor(None, build)  # reads a directory
        else:
            body = build()
        hdrs = _idempotency_headers(idempotency_key)
        hdrs["Prefer"] = "respond-async"
        resp = await self._c._transport.request(
            "POST", "/v1/snapshots", json_body=body, headers=hdrs, timeout=timeout, what="create snapshot %s" % tag
        )
        if resp.status != 202:
            resp.close()
            raise ForkdError("create snapshot %s: this daemon does not run creates as operations; upgrade it" % tag)
        return OperationInfo.from_json(await resp.json())


class AsyncOperations:
    """Long operations the daemon owns (image builds, snapshot creates and
    compacts, background branches): ``client.operations``, as
    :class:`forkd.Operations`, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self) -> List[OperationInfo]:
        """Your tenant's operations (all for an admin), oldest first."""
        return [OperationInfo.from_json(d) for d in await self._c._list("/v1/operations")]

    async def get(self, op_id: str) -> OperationInfo:
        """One operation as it is now."""
        return OperationInfo.from_json(await self._c._json("GET", _op_path(op_id)))

    async def cancel(self, op_id: str) -> OperationInfo:
        """Cancel a running operation (see :meth:`forkd.Operations.cancel`)."""
        return OperationInfo.from_json(
            await self._c._json("POST", _op_path(op_id) + "/cancel", what="cancel operation %s" % op_id)
        )

    async def wait(
        self,
        op_id: str,
        *,
        on_progress: Optional[Callable[[str], Any]] = None,
        timeout: Optional[float] = None,
    ) -> OperationInfo:
        """Follow an operation's events until it ends and return it,
        re-attaching a cut stream (see :meth:`forkd.Operations.wait`).
        ``on_progress`` may be a coroutine function."""
        path = _op_path(op_id) + "/events"
        f = _Follow(op_id)
        while True:
            resp = await self._c._transport.request(
                "GET", path, headers={"Accept": "application/x-ndjson"}, timeout=timeout, what="operation %s" % op_id
            )
            try:
                async for line in resp.lines():
                    msgs, done = f.event(line)
                    for msg in msgs:
                        await call(on_progress, msg)
                    if done is not None:
                        return done
            except (ValueError, ForkdError) as e:
                f.cut(e, None)
                continue
            finally:
                resp.close()
            f.cut(None, resp.request_id)


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
        registry_username: Optional[str] = None,
        registry_password: Optional[str] = None,
        request_timeout: Any = DEFAULT,
        idempotency_key: Optional[str] = None,
    ) -> List["AsyncSandbox"]:
        """Fork ``n`` sandboxes from a snapshot in one request (all or
        nothing); options as :meth:`forkd.Sandboxes.fork`."""
        from .async_sandbox import AsyncSandbox

        body = fork_body(tag, n, timeout, idle_timeout, metadata, network, cpus, pull_policy,
                         registry_username, registry_password)
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
