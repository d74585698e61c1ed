"""The forkd API client: daemon, snapshots and sandboxes.

:class:`Client` holds the connection settings and a pool of keep-alive
connections; :class:`~forkd.Sandbox` uses one under the hood. Clients are
thread-safe: share one between threads.
"""

from __future__ import annotations

import json
import os
import stat as _stat
import threading
import time
from typing import (
    TYPE_CHECKING,
    Any,
    BinaryIO,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
    Union,
)

from ._api import (
    DEFAULT_SANDBOX_TIMEOUT,
    Pager,
    fork_body,
    kill_ids,
    list_query,
    q,
    registry_credentials,
    removed_tags,
    sandbox_path,
    set_timeout_body,
    snapshot_delete_query,
)
from ._context import ContextLike, context_body
from ._http import DEFAULT, DEFAULT_REQUEST_TIMEOUT, DEFAULT_RETRIES, Endpoint, Transport, _BLOCK
from .errors import ForkdError, InvalidArgument, NotFound, StreamInterrupted, Timeout, error_from_problem
from .models import NetworkPolicyLike, OperationInfo, SandboxInfo, SnapshotInfo, VersionInfo, _network_body
from .operations import Operations, _idempotency_headers

if TYPE_CHECKING:  # pragma: no cover
    from .sandbox import Sandbox

__all__ = ["Client", "Snapshots", "Sandboxes", "Branch", "Operations"]


PathLike = Union[str, "os.PathLike[str]"]

_q = q


class Client:
    """A connection to one forkd daemon.

    Args:
        host: The daemon's URL: ``https://HOST:PORT``, ``http://127.0.0.1:PORT``
            or ``unix:///path/to/forkd.sock``. Default: ``$FORKD_HOST``, else
            the local Unix socket.
        token: Bearer token for a TCP daemon (``forkd token create``).
            Default: ``$FORKD_TOKEN``. The Unix socket needs none; one given
            there makes the client act as the token's tenant, under its quotas.
        ca_cert: PEM file of the CA that signed the daemon's certificate
            (https only). Default: ``$FORKD_CA_CERT``, else the system roots.
        socket: Path of the daemon's Unix socket. Default: ``$FORKD_SOCKET``,
            else ``$FORKD_RUN_DIR/forkd.sock`` (``/run/forkd/forkd.sock``).
        request_timeout: Seconds a plain request may wait for the daemon
            (None: forever). Streams (exec, run_code, snapshot create,
            archives) are bounded by their own ``timeout`` instead.
        pool_size: Idle keep-alive connections kept for reuse.
        retries: Times a request the daemon refused with 429 or 503 and a
            ``Retry-After`` (a limit such as ``--max-sandboxes``, the branch
            cap, a restarting daemon: nothing was done) is sent again after
            waiting as told; 0 raises at once. A wait over 10 s, or a
            streamed body, is never retried. The error raised last carries
            ``retry_after``.

    Arguments given here override the environment. A client is
    thread-safe; close it (or use it as a context manager) to drop its idle
    connections.
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
        self._transport = Transport(self._endpoint, request_timeout=request_timeout, pool_size=pool_size, retries=retries)
        self.snapshots = Snapshots(self)
        self.operations = Operations(self)
        """Snapshot operations (:class:`Snapshots`)."""
        self.sandboxes = Sandboxes(self)
        """Sandbox operations (:class:`Sandboxes`)."""

    # -- shared default clients -------------------------------------------

    _shared: Dict[Tuple[Any, ...], "Client"] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def shared(
        cls,
        host: Optional[str] = None,
        *,
        token: Optional[str] = None,
        ca_cert: Optional[str] = None,
        socket: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
    ) -> "Client":
        """A process-wide client for these settings (resolved against the
        environment now), created on first use. ``Sandbox.create`` and
        friends use it when given no ``client``, so their connections are
        pooled together."""
        ep = Endpoint(host=host, token=token, ca_cert=ca_cert, socket_path=socket)
        key = ep.key() + (request_timeout,)
        with cls._shared_lock:
            c = cls._shared.get(key)
            if c is None or c._transport._closed:
                c = cls(host, token=token, ca_cert=ca_cert, socket=socket, request_timeout=request_timeout)
                cls._shared[key] = c
            return c

    # -- daemon -----------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """Where this client talks: ``unix:///run/forkd/forkd.sock`` or the URL."""
        return self._endpoint.url

    def health(self) -> bool:
        """True when the daemon answers ``GET /v1/healthz``; raises
        :class:`~forkd.Unavailable` (with how to start one) when none does."""
        data = self._transport.request("GET", "/v1/healthz", what="health check").json()
        return isinstance(data, dict) and data.get("status") == "ok"

    def version(self) -> VersionInfo:
        """The daemon's version, its Go and VMM versions, and its data dir."""
        return VersionInfo.from_json(self._transport.request("GET", "/v1/version").json())

    def info(self) -> Dict[str, Any]:
        """``GET /v1/info``: the daemon's version, ``features`` (``"pty"``,
        ``"branch.live"``, ...), ``limits`` and who the caller is."""
        return self._json("GET", "/v1/info", what="daemon info") or {}

    def close(self) -> None:
        """Close idle connections. Requests in flight finish; new ones fail."""
        self._transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "Client(%r)" % self.endpoint

    # -- internals used by Sandbox -----------------------------------------

    def _json(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, Any]] = None,
        body: Any = None,
        timeout: Any = DEFAULT,
        what: str = "",
    ) -> Any:
        return self._transport.request(method, path, query=query, json_body=body, timeout=timeout, what=what).json()

    def _list(self, path: str, *, query: Optional[Mapping[str, Any]] = None) -> List[Any]:
        """Every item of a list endpoint, in its order: follows
        ``next_cursor`` page by page (a daemon from before paging answers
        one bare array)."""
        p = Pager(path, query)
        while p.query is not None:
            p.feed(self._json("GET", path, query=p.query))
        return p.items


class BranchBase:
    """What a branch returned (see :class:`Branch`); shared by the sync
    and asyncio clients."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.snapshot = SnapshotInfo.from_json(data.get("snapshot") or {})
        self.pause_ms = float(data.get("pause_ms") or 0)
        self.bytes_written = int(data.get("bytes_written") or 0)
        self.total_ms = float(data.get("total_ms") or 0)
        self.raw: Dict[str, Any] = dict(data)

    @property
    def tag(self) -> str:
        """The new snapshot's tag: fork children from it."""
        return self.snapshot.tag

    @property
    def state(self) -> str:
        """``ready``, ``writing`` or ``failed`` (as last seen)."""
        return self.snapshot.state

    @property
    def ready(self) -> bool:
        """True when the snapshot can be forked (as last seen)."""
        return self.snapshot.state == "ready"

    def __repr__(self) -> str:
        return "%s(tag=%r, state=%r, pause_ms=%.1f, bytes_written=%d)" % (
            type(self).__name__, self.tag, self.state, self.pause_ms, self.bytes_written,
        )


class Branch(BranchBase):
    """The result of :meth:`Sandbox.branch`: a new snapshot of a running
    sandbox, and what taking it cost the source.

    With ``wait=False`` the snapshot may still be ``writing``: call
    :meth:`wait` (or ``client.snapshots.get(tag)``) until it is ``ready``.

    Attributes:
        snapshot: The snapshot as last seen (:meth:`wait` and
            :meth:`refresh` update it).
        pause_ms: How long the source sandbox was paused.
        bytes_written: Bytes the branch wrote.
        total_ms: How long the branch request took.
    """

    def __init__(self, client: Client, data: Mapping[str, Any]) -> None:
        super().__init__(data)
        self._client = client

    def refresh(self) -> SnapshotInfo:
        """Fetch the snapshot's current state."""
        self.snapshot = self._client.snapshots.get(self.tag)
        return self.snapshot

    def wait(self, timeout: Optional[float] = None, poll_interval: float = 0.1) -> SnapshotInfo:
        """Wait until the snapshot is ready and return it.

        Raises:
            ForkdError: the snapshot failed (``code`` is ``snapshot_failed``,
                the message has the daemon's reason).
            Timeout: it was still being written after ``timeout`` seconds.
        """
        if self.snapshot.state != "ready":
            self.snapshot = self._client.snapshots.wait(self.tag, timeout=timeout, poll_interval=poll_interval)
        return self.snapshot


def snapshot_settled(s: SnapshotInfo, deadline: Optional[float], timeout: Optional[float]) -> bool:
    """True when s is ready; raises when it failed or the deadline passed."""
    if s.state == "ready":
        return True
    if s.state == "failed":
        raise ForkdError("snapshot %s failed: %s" % (s.tag, s.error or "no reason given"), code="snapshot_failed")
    if deadline is not None and time.monotonic() >= deadline:
        raise Timeout("snapshot %s still %s after %ss" % (s.tag, s.state, timeout))
    return False


class Snapshots:
    """Snapshot operations: ``client.snapshots``."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(
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
        on_progress: Optional[Callable[[str], None]] = None,
        timeout: Optional[float] = None,
        idempotency_key: Optional[str] = None,
    ) -> SnapshotInfo:
        """Build an image (from a recipe, an OCI image or a Dockerfile), boot
        it, warm it and save it as a snapshot to fork from.

        The daemon owns the work (an operation, see :meth:`start_create`):
        this follows it to the end, re-attaching if the connection drops.
        If this call is interrupted the snapshot is still created; cancel
        it with ``client.operations.cancel(id)``.

        Args:
            tag: The new snapshot's tag (``[a-z0-9][a-z0-9._-]{0,63}``).
            recipe: A recipe the daemon knows (``recipes/NAME.toml``). Give
                exactly one of ``recipe``, ``recipe_toml``, ``from_image`` and
                ``dockerfile``.
            recipe_toml: A recipe file's contents.
            from_image: An OCI image reference to build from with forkd's
                defaults (``registry.example.com/python:3.12-slim``); sent
                as ``from``.
            insecure_registry: Allow a plain-HTTP registry or an untrusted
                TLS certificate for the image built from.
            dockerfile: A Dockerfile's contents (a string, not a path): its
                FROM, RUN, COPY/ADD of context files, ENV, WORKDIR, USER and
                ARG are built in microVMs.
            name: With ``dockerfile``: the image's recipe name (default
                ``dockerfile``).
            build_args: With ``dockerfile``: values overriding its ARG defaults.
            context: The build context, the files a Dockerfile's COPY/ADD or
                a recipe's ``files`` name: a mapping of relative path to
                bytes or str (mode 0o644), or a local directory, read
                recursively (regular files, with their permission bits).
                At most 64 MiB and 100000 files; the daemon never reads
                the client's paths.
            build_network: The egress policy of the build VMs that run RUN
                steps (the forms of ``network``; None: the daemon's default).
            registry_username, registry_password: Credentials for the pull
                of the image built from (``from_image``, a Dockerfile's or
                a recipe's FROM), sent only when given. A tenant's build uses
                only these, never the daemon's logins; an admin's without
                them uses the daemon's.
            warm: Python warm-up code replacing the recipe's.
            memory_mib, vcpus: Override the recipe's.
            network: The network policy the snapshot's sandboxes get unless
                their fork names one (a :class:`~forkd.NetworkPolicy`,
                ``"none"``, ``"public"``, ``"allow:ENTRY,..."``, a dict
                ``{"mode": ..., "allow": [...]}``; None: the daemon's default).
            on_progress: Called with each progress message as it happens.
            timeout: Seconds to wait without any progress line (None: no limit;
                building an image can take minutes).
            idempotency_key: A retry with the same key and arguments follows
                the first create instead of starting another (24 hours).

        Raises:
            Conflict: the tag exists. InvalidArgument, NotFound: a bad tag,
            an unknown recipe, not exactly one build source, a bad or too big
            context. ForkdError: the build or boot failed.
        """
        body = self._create_body(
            tag, recipe=recipe, recipe_toml=recipe_toml, from_image=from_image, insecure_registry=insecure_registry,
            dockerfile=dockerfile, name=name, build_args=build_args, context=context, build_network=build_network,
            registry_username=registry_username, registry_password=registry_password,
            warm=warm, memory_mib=memory_mib, vcpus=vcpus, network=network,
        )
        what = "create snapshot %s" % tag
        hdrs = _idempotency_headers(idempotency_key)
        hdrs["Prefer"] = "respond-async"
        resp = self._c._transport.request("POST", "/v1/snapshots", json_body=body, headers=hdrs, timeout=timeout, what=what)
        if resp.status == 202:
            op = OperationInfo.from_json(resp.json())
            return SnapshotInfo.from_json(self._c.operations._result(self._c.operations.wait(op.id, on_progress=on_progress, timeout=timeout)))
        return self._legacy_stream(resp, what, on_progress)

    def start_create(
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
        ``client.operations.wait(op.id)``; its result is the snapshot."""
        body = self._create_body(
            tag, recipe=recipe, recipe_toml=recipe_toml, from_image=from_image, insecure_registry=insecure_registry,
            dockerfile=dockerfile, name=name, build_args=build_args, context=context, build_network=build_network,
            registry_username=registry_username, registry_password=registry_password,
            warm=warm, memory_mib=memory_mib, vcpus=vcpus, network=network,
        )
        hdrs = _idempotency_headers(idempotency_key)
        hdrs["Prefer"] = "respond-async"
        resp = self._c._transport.request("POST", "/v1/snapshots", json_body=body, headers=hdrs, what="create snapshot %s" % tag)
        if resp.status != 202:
            resp.close()
            raise ForkdError("create snapshot %s: this daemon does not run creates as operations; upgrade it, or use create()" % tag)
        return OperationInfo.from_json(resp.json())

    @staticmethod
    def _create_body(
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
    ) -> Dict[str, Any]:
        """The POST /v1/snapshots body; reads a context directory."""
        sources = {"recipe": recipe, "recipe_toml": recipe_toml, "from": from_image, "dockerfile": dockerfile}
        given = [k for k, v in sources.items() if v is not None]
        if len(given) != 1:
            raise InvalidArgument("give exactly one of recipe, recipe_toml, from_image and dockerfile")
        src = sources[given[0]]
        if not isinstance(src, str) or not src:
            raise InvalidArgument("%s must be a non-empty string, not %r" % ("from_image" if given[0] == "from" else given[0], src))
        if dockerfile is None and (name is not None or build_args is not None):
            raise InvalidArgument("name and build_args go with dockerfile")
        if from_image is not None and context is not None:
            raise InvalidArgument("context goes with a recipe's files or a Dockerfile's COPY, not with from_image")
        args: Dict[str, str] = {}
        for k, v in (build_args or {}).items():
            if not isinstance(k, str) or not k or not isinstance(v, str):
                raise InvalidArgument("build_args: want a mapping of name to str, not %r: %r" % (k, v))
            args[k] = v
        net = _network_body(network)
        bnet = _network_body(build_network)
        creds = registry_credentials(registry_username, registry_password)
        body: Dict[str, Any] = {"tag": tag, given[0]: src}
        if insecure_registry:
            body["insecure_registry"] = True
        if name:
            body["name"] = name
        if args:
            body["build_args"] = args
        if warm:
            body["warm"] = warm
        if memory_mib:
            body["memory_mib"] = int(memory_mib)
        if vcpus:
            body["vcpus"] = int(vcpus)
        if net is not None:
            body["network"] = net
        if bnet is not None:
            body["build_network"] = bnet
        body.update(creds)
        if context is not None:
            files = context_body(context)
            if files:
                body["context"] = files
        return body

    @staticmethod
    def _legacy_stream(resp: Any, what: str, on_progress: Optional[Callable[[str], None]]) -> SnapshotInfo:
        """The progress stream a daemon from before operations answers."""
        final: Optional[Dict[str, Any]] = None
        # Read to the end (the final line is the last): the connection is reused.
        for line in resp.lines():
            try:
                p = json.loads(line)
            except ValueError:
                resp.close()
                raise StreamInterrupted("%s: undecodable progress line %r" % (what, line[:200]), request_id=resp.request_id)
            if p.get("error") or p.get("snapshot"):
                final = p
            elif p.get("message") and on_progress is not None:
                on_progress(p["message"])
        if final is None:
            raise StreamInterrupted(
                "%s: the progress stream ended without a result (did the daemon restart?)" % what,
                request_id=resp.request_id,
            )
        if final.get("error"):
            raise error_from_problem(final["error"], request_id=resp.request_id)
        return SnapshotInfo.from_json(final["snapshot"])

    def list(self) -> List[SnapshotInfo]:
        """Every snapshot tag."""
        return [SnapshotInfo.from_json(d) for d in self._c._list("/v1/snapshots")]

    def get(self, tag: str) -> SnapshotInfo:
        """One snapshot. Raises NotFound."""
        return SnapshotInfo.from_json(self._c._json("GET", "/v1/snapshots/" + _q(tag, "tag")))

    info = get

    def exists(self, tag: str) -> bool:
        """True when the tag exists (in any state)."""
        try:
            self.get(tag)
            return True
        except NotFound:
            return False

    def wait(self, tag: str, *, timeout: Optional[float] = None, poll_interval: float = 0.1) -> SnapshotInfo:
        """Poll a snapshot until it is ``ready`` (a branch made with
        ``wait=False`` is ``writing`` first).

        Raises:
            ForkdError: the snapshot failed (``code`` ``snapshot_failed``).
            Timeout: not ready after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            s = self.get(tag)
            if snapshot_settled(s, deadline, timeout):
                return s
            time.sleep(poll_interval)

    def delete(self, tag: str, *, cascade: bool = False, force: bool = False) -> List[str]:
        """Remove a snapshot tag. Sandboxes forked from it keep running.

        Args:
            cascade: Also delete the snapshots that depend on this one
                (branches layered on it).
            force: Delete it even though others depend on it.

        Returns:
            The tags removed: with cascade, the layers first (deepest
            first), ``tag`` last.

        Raises:
            NotFound: no such tag. Conflict: other snapshots depend on it
            (the message names them) and neither cascade nor force was given.
        """
        q = snapshot_delete_query(cascade, force)
        body = self._c._transport.request("DELETE", "/v1/snapshots/" + _q(tag, "tag"), query=q, what="delete snapshot %s" % tag).read()
        return removed_tags(body, tag)

    def compact(self, tag: str, to: str, *, timeout: Any = DEFAULT) -> SnapshotInfo:
        """Write a flat copy (no parent, depth 0) of the chain head ``tag``
        under the new tag ``to``; ``tag`` is left as it is. Forking a flat
        snapshot reads no layers, and it no longer depends on its ancestors.

        Raises:
            NotFound: no such tag. Conflict: ``to`` exists.
        """
        data = self._c._json(
            "POST", "/v1/snapshots/%s/compact" % _q(tag, "tag"), body={"to": to}, timeout=timeout,
            what="compact snapshot %s" % tag,
        )
        return SnapshotInfo.from_json(data)

    def pack(
        self,
        tag: str,
        dest: Union[PathLike, BinaryIO],
        *,
        include_image: bool = True,
        timeout: Optional[float] = None,
    ) -> int:
        """Export a snapshot (with the image it boots, unless
        ``include_image=False``) as a portable archive, streamed to ``dest``:
        a file path (written atomically) or a binary file object. Returns the
        bytes written. ``timeout`` bounds each wait for data (None: none)."""
        what = "pack snapshot %s" % tag
        resp = self._c._transport.request(
            "GET",
            "/v1/snapshots/%s/archive" % _q(tag, "tag"),
            query={"image": "1" if include_image else "0"},
            timeout=timeout,
            what=what,
        )
        if hasattr(dest, "write"):
            n = 0
            for chunk in resp.chunks(_BLOCK):
                dest.write(chunk)
                n += len(chunk)
            return n
        path = os.fspath(dest)
        part = path + ".part"
        n = 0
        try:
            with open(part, "wb") as f:
                for chunk in resp.chunks(_BLOCK):
                    f.write(chunk)
                    n += len(chunk)
            os.replace(part, path)
        except BaseException:
            resp.close()
            try:
                os.unlink(part)
            except OSError:
                pass
            raise
        return n

    def unpack(
        self,
        src: Union[PathLike, BinaryIO],
        *,
        tag: Optional[str] = None,
        force: bool = False,
        verify_key: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> SnapshotInfo:
        """Import an archive from :meth:`pack` (a path or a binary file
        object), streamed to the daemon, which verifies it before the tag
        appears.

        Args:
            tag: Create this tag instead of the archive's.
            force: Replace an existing snapshot with the same tag.
            verify_key: An ed25519 public key (base64url of its 32 bytes);
                archives not signed by it are refused.
            timeout: Bounds each wait on the daemon (None: none; verifying a
                big archive takes a while after the upload).
        """
        q: Dict[str, str] = {}
        if tag:
            q["tag"] = tag
        if force:
            q["force"] = "1"
        if verify_key:
            q["verify_key"] = verify_key
        headers = {"Content-Type": "application/zstd"}
        f: Any
        own = False
        if hasattr(src, "read"):
            f = src
        else:
            f = open(os.fspath(src), "rb")
            own = True
        try:
            size = _remaining_size(f)
            if size is not None:
                headers["Content-Length"] = str(size)
            body = _iter_file(f)
            data = self._c._transport.request(
                "POST", "/v1/snapshots/import", query=q, body=body, headers=headers, timeout=timeout, what="unpack archive"
            ).json()
        finally:
            if own:
                f.close()
        return SnapshotInfo.from_json(data)


def _remaining_size(f: Any) -> Optional[int]:
    """Bytes left in a regular binary file, or None when unknown."""
    try:
        if "b" not in getattr(f, "mode", "b"):
            return None
        st = os.fstat(f.fileno())
        if not _stat.S_ISREG(st.st_mode):
            return None
        return max(0, int(st.st_size) - int(f.tell()))
    except (AttributeError, OSError, ValueError):
        return None


def _iter_file(f: Any, block: int = _BLOCK) -> Iterator[bytes]:
    """A file object's content as bytes blocks (text is sent as UTF-8)."""
    while True:
        b = f.read(block)
        if not b:
            return
        if isinstance(b, str):
            b = b.encode("utf-8")
        yield b


class Sandboxes:
    """Sandbox operations: ``client.sandboxes``."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def list(
        self,
        *,
        tag: Optional[str] = None,
        state: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
    ) -> List[SandboxInfo]:
        """Sandboxes, optionally only children of ``tag``, in ``state``
        (``running``, ``dead``, ``stopped``) or carrying every one of the
        ``labels`` (metadata given at fork)."""
        q = list_query(tag, state, labels)
        return [SandboxInfo.from_json(d) for d in self._c._list("/v1/sandboxes", query=q)]

    def set_timeout(
        self, sandbox_id: str, timeout: float, *, idle_timeout: Optional[float] = None
    ) -> SandboxInfo:
        """End a running sandbox ``timeout`` seconds from now (0: never),
        whatever its timeout was; ``idle_timeout``, if given, replaces its
        idle timeout (0: none). Returns the sandbox as it now is.

        Raises:
            InvalidArgument: a negative timeout or one over the daemon's
            limit (7 days). Conflict: the sandbox is dead or already ending.
            NotFound: no such sandbox (an expired one is forgotten).
        """
        body = set_timeout_body(timeout, idle_timeout)
        path = sandbox_path(sandbox_id)
        return SandboxInfo.from_json(self._c._json("PATCH", path, body=body, what="set timeout of %s" % sandbox_id))

    def get(self, sandbox_id: str) -> SandboxInfo:
        """One sandbox. Raises NotFound (a killed sandbox is forgotten)."""
        return SandboxInfo.from_json(self._c._json("GET", sandbox_path(sandbox_id)))

    def fork(
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
    ) -> List["Sandbox"]:
        """Fork ``n`` sandboxes from a snapshot; returns when every one
        answers (all or nothing: if one fails, none is left running).

        Args:
            tag: A local snapshot tag, or a registry reference
                (``host[:port]/repository:tag`` or ``...@sha256:...``) that
                ``forkd push`` wrote: the daemon pulls it for your tenant
                on first use (anonymously unless ``registry_username`` and
                ``registry_password`` are given; give a ``request_timeout``
                long enough for that pull), and later forks use its copy.
            timeout: Seconds after which the daemon kills each sandbox
                (default 300, as E2B; 0: no limit; None: the daemon's
                default, an hour unless configured). Change it later with
                :meth:`set_timeout`.
            idle_timeout: Kill a sandbox after this many seconds without a
                request (None: no limit).
            metadata: Labels for every sandbox; ``list(labels=...)`` filters on them.
            network: What the sandboxes may reach: a
                :class:`~forkd.NetworkPolicy`, ``"none"``, ``"public"``,
                ``"allow:ENTRY,..."``, a dict ``{"mode": ..., "allow": [...]}``
                or a list of allow entries. None: the snapshot's policy, else
                the daemon's default.
            cpus: CPU limit of each sandbox (0.5: half a CPU), from 0.1 to
                the snapshot's vCPUs (None: one CPU per vCPU plus half a
                CPU for its VMM).
            pull_policy: Only when ``tag`` is a registry reference:
                ``"if_not_present"`` (the daemon's default) or ``"always"``.
            registry_username, registry_password: Only when ``tag`` is a
                registry reference: credentials for its pull (without them
                it is anonymous; the daemon's own logins are never used).
                Sent only when given; with a local tag, InvalidArgument.
            request_timeout: Seconds to wait for the daemon's answer.
            idempotency_key: A retry with the same key and arguments (within
                24 hours) gets the first fork's sandboxes, not new ones: use
                it when retrying a fork whose answer was lost.
        """
        from .sandbox import Sandbox

        body = fork_body(tag, n, timeout, idle_timeout, metadata, network, cpus, pull_policy,
                         registry_username, registry_password)
        data = self._c._transport.request(
            "POST", "/v1/sandboxes", json_body=body, headers=_idempotency_headers(idempotency_key),
            timeout=request_timeout, what="fork %d from %s" % (n, tag),
        ).json()
        return [Sandbox._from_info(self._c, SandboxInfo.from_json(d)) for d in (data.get("sandboxes") or [])]

    def create(self, tag: str, **kw: Any) -> "Sandbox":
        """Fork one sandbox (see :meth:`fork` for the options)."""
        return self.fork(tag, 1, **kw)[0]

    def connect(self, sandbox_id: str) -> "Sandbox":
        """A handle on an existing sandbox. Raises NotFound."""
        from .sandbox import Sandbox

        return Sandbox._from_info(self._c, self.get(sandbox_id))

    def kill(self, *sandbox_ids: Union[str, Iterable[str]]) -> List[str]:
        """Kill sandboxes by id; returns the ids killed. Raises NotFound when
        one does not exist."""
        ids = kill_ids(sandbox_ids)
        if not ids:
            return []
        data = self._c._json("POST", "/v1/sandboxes/kill", body={"ids": ids})
        return list(data.get("killed") or [])

    def kill_all(self) -> List[str]:
        """Kill every sandbox of the daemon; returns the ids killed."""
        data = self._c._json("POST", "/v1/sandboxes/kill", body={"all": True})
        return list(data.get("killed") or [])

