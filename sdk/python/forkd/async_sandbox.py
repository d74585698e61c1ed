"""AsyncSandbox: the :class:`forkd.Sandbox` API for asyncio code."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional

from ._api import DEFAULT_SANDBOX_TIMEOUT, branch_body, check_branch_mode, host_for, port_path, sandbox_path
from ._async_io import call
from ._exec import OutputHandler, RunCodeState, check_execution, run_code_body
from ._http import DEFAULT, DEFAULT_REQUEST_TIMEOUT
from .async_client import AsyncBranch, AsyncClient
from .async_commands import AsyncCommands, AsyncPty
from .async_files import AsyncFiles
from .errors import ForkdError, NotFound
from .models import Execution, NetworkPolicy, NetworkPolicyLike, PortInfo, SandboxInfo, SandboxNetwork

__all__ = ["AsyncSandbox"]


def _client(client: Optional[AsyncClient], host: Optional[str], token: Optional[str], ca_cert: Optional[str],
            socket: Optional[str], request_timeout: Optional[float]) -> AsyncClient:
    if client is not None:
        return client
    return AsyncClient.shared(host, token=token, ca_cert=ca_cert, socket=socket, request_timeout=request_timeout)


class AsyncSandbox:
    """A running microVM, for asyncio code: every call of
    :class:`forkd.Sandbox`, awaited. ``async with`` kills it on exit::

        async with await AsyncSandbox.create("py") as sb:
            r = await sb.commands.run("uname -a")
            ex = await sb.run_code("1 + 1")

    Many at once::

        sbs = await AsyncSandbox.fork("py", 20)
        results = await asyncio.gather(*(s.commands.run("hostname") for s in sbs))

    Attributes:
        id: The sandbox id.
        client: The :class:`AsyncClient` it talks through.
        commands: :class:`~forkd.async_commands.AsyncCommands`.
        files: :class:`~forkd.async_files.AsyncFiles`.
        pty: :class:`~forkd.async_commands.AsyncPty`.
    """

    def __init__(self, client: AsyncClient, info: SandboxInfo) -> None:
        self.id = info.id
        self.client = client
        self._info = info
        self._path = sandbox_path(info.id)
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.pty = AsyncPty(self)

    # -- constructors -------------------------------------------------------

    @classmethod
    async def create(
        cls,
        tag: str,
        *,
        timeout: Optional[float] = DEFAULT_SANDBOX_TIMEOUT,
        idle_timeout: Optional[float] = None,
        metadata: Optional[Mapping[str, str]] = None,
        network: Optional[NetworkPolicyLike] = None,
        cpus: Optional[float] = None,
        pull_policy: Optional[str] = None,
        registry_username: Optional[str] = None,
        registry_password: Optional[str] = None,
        client: Optional[AsyncClient] = None,
        host: Optional[str] = None,
        token: Optional[str] = None,
        ca_cert: Optional[str] = None,
        socket: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
    ) -> "AsyncSandbox":
        """Fork one sandbox from ``tag`` (options as :meth:`forkd.Sandbox.create`)."""
        c = _client(client, host, token, ca_cert, socket, request_timeout)
        return (await c.sandboxes.fork(tag, 1, timeout=timeout, idle_timeout=idle_timeout, metadata=metadata,
                                       network=network, cpus=cpus, pull_policy=pull_policy,
                                       registry_username=registry_username, registry_password=registry_password))[0]

    @classmethod
    async def fork(
        cls,
        tag: str,
        n: int,
        *,
        timeout: Optional[float] = DEFAULT_SANDBOX_TIMEOUT,
        idle_timeout: Optional[float] = None,
        metadata: Optional[Mapping[str, str]] = None,
        network: Optional[NetworkPolicyLike] = None,
        cpus: Optional[float] = None,
        pull_policy: Optional[str] = None,
        registry_username: Optional[str] = None,
        registry_password: Optional[str] = None,
        client: Optional[AsyncClient] = None,
        host: Optional[str] = None,
        token: Optional[str] = None,
        ca_cert: Optional[str] = None,
        socket: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
    ) -> List["AsyncSandbox"]:
        """Fork ``n`` sandboxes from ``tag`` in one request (all or nothing)."""
        c = _client(client, host, token, ca_cert, socket, request_timeout)
        return await c.sandboxes.fork(tag, n, timeout=timeout, idle_timeout=idle_timeout, metadata=metadata,
                                      network=network, cpus=cpus, pull_policy=pull_policy,
                                      registry_username=registry_username, registry_password=registry_password)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        *,
        client: Optional[AsyncClient] = None,
        host: Optional[str] = None,
        token: Optional[str] = None,
        ca_cert: Optional[str] = None,
        socket: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
    ) -> "AsyncSandbox":
        """Attach to an existing sandbox by id. Raises NotFound."""
        return await _client(client, host, token, ca_cert, socket, request_timeout).sandboxes.connect(sandbox_id)

    @classmethod
    async def list(
        cls,
        *,
        tag: Optional[str] = None,
        state: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        client: Optional[AsyncClient] = None,
        host: Optional[str] = None,
        token: Optional[str] = None,
        ca_cert: Optional[str] = None,
        socket: Optional[str] = None,
    ) -> List[SandboxInfo]:
        """The daemon's sandboxes, filtered (see :meth:`forkd.Sandboxes.list`)."""
        c = _client(client, host, token, ca_cert, socket, DEFAULT_REQUEST_TIMEOUT)
        return await c.sandboxes.list(tag=tag, state=state, labels=labels)

    # -- lifecycle -----------------------------------------------------------

    @property
    def sandbox_id(self) -> str:
        """The sandbox id (E2B's name for :attr:`id`)."""
        return self.id

    @property
    def tag(self) -> str:
        """The snapshot tag this sandbox was forked from."""
        return self._info.tag

    async def info(self) -> SandboxInfo:
        """The sandbox's current description. Raises NotFound once killed."""
        self._info = await self.client.sandboxes.get(self.id)
        return self._info

    async def is_running(self) -> bool:
        """True while the sandbox runs."""
        try:
            return (await self.info()).state == "running"
        except NotFound:
            return False

    async def kill(self) -> bool:
        """Kill the sandbox. Returns False when it was already gone."""
        try:
            resp = await self.client._transport.request("DELETE", self._path, what="kill %s" % self.id)
            await resp.read()
            return True
        except NotFound:
            return False

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.kill()
        except ForkdError:
            if exc[0] is None:
                raise

    def __repr__(self) -> str:
        return "AsyncSandbox(%r)" % self.id

    # -- network and ports ---------------------------------------------------

    async def get_network(self) -> SandboxNetwork:
        """The sandbox's network policy and traffic counters."""
        data = await self.client._json("GET", self._path + "/network", what="get network of %s" % self.id)
        return SandboxNetwork.from_json(data)

    async def set_network(self, policy: NetworkPolicyLike) -> SandboxNetwork:
        """Change what the running sandbox may reach, at once."""
        body = NetworkPolicy.parse(policy).to_json()
        data = await self.client._json("PUT", self._path + "/network", body=body, what="set network of %s" % self.id)
        return SandboxNetwork.from_json(data)

    async def set_timeout(self, timeout: float, *, idle_timeout: Optional[float] = None) -> SandboxInfo:
        """End the running sandbox ``timeout`` seconds from now (0: never)."""
        self._info = await self.client.sandboxes.set_timeout(self.id, timeout, idle_timeout=idle_timeout)
        return self._info

    async def get_port(self, port: int) -> PortInfo:
        """Where the daemon serves TCP ``port`` of this sandbox."""
        data = await self.client._json("GET", port_path(self._path, port), what="get port %d of %s" % (port, self.id))
        return PortInfo.from_json(data)

    async def get_host(self, port: int) -> str:
        """Where to reach a server on ``port`` (see :meth:`forkd.Sandbox.get_host`)."""
        ep = self.client._endpoint
        return host_for(await self.get_port(port), ep.kind, ep.url)

    # -- code ------------------------------------------------------------------

    async def run_code(
        self,
        code: str,
        *,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
    ) -> Execution:
        """Run Python in the sandbox's persistent session (see
        :meth:`forkd.Sandbox.run_code`); callbacks may be coroutines.
        Cancelling the call interrupts the code."""
        body, sock_t = run_code_body(code, timeout)
        if on_stdout is None and on_stderr is None:
            data = await self.client._json(
                "POST", self._path + "/run_code", body=body, timeout=sock_t, what="run_code in %s" % self.id
            )
            return check_execution(Execution.from_json(data), self.id, timeout)
        st = RunCodeState("run_code in %s" % self.id)
        resp = await self.client._transport.request(
            "POST", self._path + "/run_code/stream", json_body=body, headers={"Accept": "application/x-ndjson"},
            timeout=sock_t, what=st.what,
        )
        try:
            async for line in resp.lines():
                out, err = st.feed(line)
                if out:
                    await call(on_stdout, out)
                if err:
                    await call(on_stderr, err)
        finally:
            resp.close()  # after an error or a cancel: disconnecting interrupts the code
        return check_execution(st.execution(resp.request_id), self.id, timeout)

    # -- branch ----------------------------------------------------------------

    async def branch(
        self, tag: Optional[str] = None, *, mode: str = "diff", wait: bool = True, timeout: Any = DEFAULT
    ) -> AsyncBranch:
        """Snapshot this running sandbox into a new tag (see
        :meth:`forkd.Sandbox.branch`)."""
        check_branch_mode(mode)
        body = branch_body(tag, mode, wait, self.tag if tag is None else "")
        data = await self.client._json("POST", self._path + "/branch", body=body, timeout=timeout, what="branch %s" % self.id)
        return AsyncBranch(self.client, data)
