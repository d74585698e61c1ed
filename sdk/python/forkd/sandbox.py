"""Sandboxes: lifecycle, network, ports, Python code and branches.

Commands, files and terminals live in :mod:`forkd.commands`,
:mod:`forkd.files` and :mod:`forkd.pty`.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional

from ._api import DEFAULT_SANDBOX_TIMEOUT, branch_body, check_branch_mode, host_for, port_path, q as _q
from ._exec import OutputHandler, RunCodeState, check_execution, run_code_body
from ._http import DEFAULT, DEFAULT_REQUEST_TIMEOUT
from .client import Branch, Client
from .commands import CommandHandle, Commands
from .errors import ForkdError, NotFound
from .files import Files, FileStream
from .models import Execution, NetworkPolicy, NetworkPolicyLike, PortInfo, SandboxInfo, SandboxNetwork
from .pty import Pty

__all__ = ["Sandbox", "Commands", "CommandHandle", "Files", "FileStream", "Pty"]


def _client(
    client: Optional[Client],
    host: Optional[str],
    token: Optional[str],
    ca_cert: Optional[str],
    socket: Optional[str],
    request_timeout: Optional[float],
) -> Client:
    if client is not None:
        return client
    return Client.shared(host, token=token, ca_cert=ca_cert, socket=socket, request_timeout=request_timeout)


class Sandbox:
    """A running microVM forked from a snapshot.

    Create one with :meth:`create`, many with :meth:`fork`, or attach to an
    existing one with :meth:`connect`. Used as a context manager, the
    sandbox is killed on exit::

        with Sandbox.create("py") as sb:
            print(sb.commands.run("uname -a").stdout)
            print(sb.run_code("1 + 1").text)

    Connection arguments (``host``, ``token``, ``ca_cert``, ``socket``,
    ``request_timeout``) default to the environment (see :class:`Client`);
    pass ``client=`` to use a client of your own.

    Attributes:
        id: The sandbox id.
        client: The :class:`Client` it talks through.
        commands: Run processes (:class:`Commands`).
        files: Read and write files (:class:`Files`).
        pty: Interactive terminals (:class:`~forkd.pty.Pty`).
    """

    def __init__(self, sandbox_id: str, *, client: Client, info: Optional[SandboxInfo] = None) -> None:
        _q(sandbox_id, "sandbox id")
        self.id = sandbox_id
        self.client = client
        self._info = info
        self._path = "/v1/sandboxes/" + _q(sandbox_id, "sandbox id")
        self.commands = Commands(self)
        self.files = Files(self)
        self.pty = Pty(self)

    @classmethod
    def _from_info(cls, client: Client, info: SandboxInfo) -> "Sandbox":
        return cls(info.id, client=client, info=info)

    # -- constructors -------------------------------------------------------

    @classmethod
    def create(
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
        client: Optional[Client] = None,
        host: Optional[str] = None,
        token: Optional[str] = None,
        ca_cert: Optional[str] = None,
        socket: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
    ) -> "Sandbox":
        """Fork one sandbox from the snapshot ``tag``.

        Args:
            tag: The snapshot to fork from: a local tag, or a registry
                reference (``host[:port]/repository:tag`` or
                ``...@sha256:...``) that ``forkd push`` wrote, which the
                daemon pulls for your tenant on first use (anonymously
                unless ``registry_username`` and ``registry_password`` are
                given; give a ``request_timeout`` long enough for that pull).
            timeout: Seconds after which the daemon kills the sandbox:
                default 300 (five minutes, as E2B); 0: no limit; None: the
                daemon's default (an hour unless configured). Extend it
                with :meth:`set_timeout`.
            idle_timeout: Kill it after this many seconds without a request.
            metadata: Labels (str -> str); ``Sandbox.list(labels=...)`` filters on them.
            network: What the sandbox may reach: a :class:`NetworkPolicy`,
                ``"none"``, ``"public"``, ``"allow:ENTRY,ENTRY"``, a dict
                ``{"mode": "allow", "allow": ["198.51.100.0/24", "*.example.com"]}``,
                a list of allow entries, or a bool (E2B's
                ``allow_internet_access``). None: the snapshot's policy, else
                the daemon's default. Change it later with :meth:`set_network`.
            cpus: Its CPU limit (0.5: half a CPU), up to the snapshot's
                vCPUs. None: one CPU per vCPU plus half a CPU for its VMM.
            pull_policy: Only when ``tag`` is a registry reference:
                ``"if_not_present"`` (the daemon's default) or ``"always"``.
            registry_username, registry_password: Only when ``tag`` is a
                registry reference: credentials for its pull, sent only when
                given (the daemon's own logins are never used).

        Raises:
            NotFound: no snapshot ``tag`` (or no such reference in its registry). RateLimited: a daemon limit was
            reached. Unavailable: no daemon answers. InvalidArgument: a
            malformed network policy, registry credentials with a local tag.
        """
        c = _client(client, host, token, ca_cert, socket, request_timeout)
        return c.sandboxes.fork(
            tag, 1, timeout=timeout, idle_timeout=idle_timeout, metadata=metadata, network=network, cpus=cpus,
            pull_policy=pull_policy, registry_username=registry_username, registry_password=registry_password,
        )[0]

    @classmethod
    def fork(
        cls,
        tag: str,
        n: int,
        *,
        timeout: Optional[float] = DEFAULT_SANDBOX_TIMEOUT,
        idle_timeout: Optional[float] = None,
        metadata: Optional[Mapping[str, str]] = None,
        network: Optional[NetworkPolicyLike] = None,
        pull_policy: Optional[str] = None,
        registry_username: Optional[str] = None,
        registry_password: Optional[str] = None,
        client: Optional[Client] = None,
        host: Optional[str] = None,
        token: Optional[str] = None,
        ca_cert: Optional[str] = None,
        socket: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
    ) -> List["Sandbox"]:
        """Fork ``n`` sandboxes from ``tag`` in one request (all or nothing);
        returns when every one answers. Options as for :meth:`create`."""
        c = _client(client, host, token, ca_cert, socket, request_timeout)
        return c.sandboxes.fork(tag, n, timeout=timeout, idle_timeout=idle_timeout, metadata=metadata, network=network,
                                pull_policy=pull_policy,
                                registry_username=registry_username, registry_password=registry_password)

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        *,
        client: Optional[Client] = None,
        host: Optional[str] = None,
        token: Optional[str] = None,
        ca_cert: Optional[str] = None,
        socket: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
    ) -> "Sandbox":
        """Attach to an existing sandbox by id. Raises NotFound."""
        c = _client(client, host, token, ca_cert, socket, request_timeout)
        return c.sandboxes.connect(sandbox_id)

    @classmethod
    def list(
        cls,
        *,
        tag: Optional[str] = None,
        state: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        client: Optional[Client] = None,
        host: Optional[str] = None,
        token: Optional[str] = None,
        ca_cert: Optional[str] = None,
        socket: Optional[str] = None,
    ) -> List[SandboxInfo]:
        """The daemon's sandboxes, filtered (see :meth:`Sandboxes.list`)."""
        c = _client(client, host, token, ca_cert, socket, DEFAULT_REQUEST_TIMEOUT)
        return c.sandboxes.list(tag=tag, state=state, labels=labels)

    # -- lifecycle -----------------------------------------------------------

    @property
    def sandbox_id(self) -> str:
        """The sandbox id (E2B's name for :attr:`id`)."""
        return self.id

    @property
    def tag(self) -> str:
        """The snapshot tag this sandbox was forked from."""
        if self._info is None:
            self._info = self.info()
        return self._info.tag

    def info(self) -> SandboxInfo:
        """The sandbox's current description. Raises NotFound once killed."""
        self._info = self.client.sandboxes.get(self.id)
        return self._info

    def is_running(self) -> bool:
        """True while the sandbox runs (False once killed, dead or gone)."""
        try:
            return self.info().state == "running"
        except NotFound:
            return False

    def kill(self) -> bool:
        """Kill the sandbox. Returns False when it was already gone."""
        try:
            self.client._transport.request("DELETE", self._path, what="kill %s" % self.id).read()
            return True
        except NotFound:
            return False

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.kill()
        except ForkdError:
            if exc[0] is None:
                raise

    def __repr__(self) -> str:
        return "Sandbox(%r)" % self.id

    # -- network and ports ---------------------------------------------------

    def get_network(self) -> SandboxNetwork:
        """The sandbox's network policy and traffic counters
        (``.policy.mode``, ``.policy.allow``, ``.stats.tx_bytes``, ...).
        Raises NotFound."""
        data = self.client._json("GET", self._path + "/network", what="get network of %s" % self.id)
        return SandboxNetwork.from_json(data)

    @property
    def network(self) -> SandboxNetwork:
        """The sandbox's network, fetched now: same as :meth:`get_network`."""
        return self.get_network()

    def set_network(self, policy: NetworkPolicyLike) -> SandboxNetwork:
        """Change what the running sandbox may reach, at once (its rules
        change in one step; addresses opened by earlier DNS answers close).

        Args:
            policy: A :class:`NetworkPolicy`, ``"none"``, ``"public"``,
                ``"allow:ENTRY,ENTRY"``, a dict ``{"mode": ..., "allow": [...]}``,
                a list of allow entries or a bool.

        Returns:
            The sandbox's network as it now is.

        Raises:
            InvalidArgument: a malformed policy, or one the daemon refuses
            (a reserved range it does not permit). Conflict: the sandbox is
            not running. NotFound: no such sandbox.
        """
        body = NetworkPolicy.parse(policy).to_json()
        data = self.client._json("PUT", self._path + "/network", body=body, what="set network of %s" % self.id)
        return SandboxNetwork.from_json(data)

    def set_timeout(self, timeout: float, *, idle_timeout: Optional[float] = None) -> SandboxInfo:
        """End the running sandbox ``timeout`` seconds from now (0: never),
        whatever its timeout was, as E2B's ``set_timeout``: call it again
        to keep a sandbox alive. ``idle_timeout``, if given, replaces its
        idle timeout (0: none).

        Returns:
            The sandbox as it now is (``expires_at``).

        Raises:
            InvalidArgument: a negative timeout, or one over the daemon's
            limit (7 days). Conflict: the sandbox is dead or already ending.
            NotFound: no such sandbox (an expired one is forgotten).
        """
        return self.client.sandboxes.set_timeout(self.id, timeout, idle_timeout=idle_timeout)

    def get_port(self, port: int) -> PortInfo:
        """Where the daemon serves TCP ``port`` of this sandbox: the proxy
        ``path`` on its API and, when it routes a domain to sandbox ports,
        the ``host``. Nothing checks that a server listens there yet; it
        must listen on 0.0.0.0 (or the guest's address), not 127.0.0.1.

        Raises:
            InvalidArgument: not a port (1-65535). NotFound: no such sandbox.
        """
        data = self.client._json("GET", port_path(self._path, port), what="get port %d of %s" % (port, self.id))
        return PortInfo.from_json(data)

    def get_host(self, port: int) -> str:
        """Where to reach a server listening on ``port`` inside the sandbox
        (E2B's ``get_host``); HTTP and WebSocket requests there are proxied
        to it.

        Returns the host ``PORT-ID.DOMAIN`` (no scheme) when the daemon
        routes a domain to sandbox ports (``forkd serve --port-domain``),
        like E2B. Otherwise the full URL of the port's proxy path on this
        client's daemon, ``BASE/v1/sandboxes/ID/ports/PORT/``, to which the
        app's own path is appended.

        Requests to either go through the daemon's API: a TCP daemon wants
        this client's token (``Authorization: Bearer TOKEN``; the daemon
        removes it before the app sees the request). For a client on the
        daemon's **Unix socket** the URL is ``http://forkd/v1/...``, which
        is reachable only through that socket (for example
        ``curl --unix-socket /run/forkd/forkd.sock URL``), not from a
        browser; use ``forkd port-forward`` for a local TCP port.
        """
        ep = self.client._endpoint
        return host_for(self.get_port(port), ep.kind, ep.url)

    # -- code ------------------------------------------------------------------

    def run_code(
        self,
        code: str,
        *,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
    ) -> Execution:
        """Run Python in the sandbox's persistent session (variables persist
        between calls, and into children forked from a branch).

        Returns an :class:`Execution` like E2B's code interpreter: ``results``
        (display outputs, then the value of the last expression with
        ``is_main_result``), ``logs.stdout``/``logs.stderr``, and ``error`` for
        an exception the code raised (not raised here).

        Args:
            timeout: Seconds before the code is interrupted (None: no limit).
                The session and its variables survive.
            on_stdout, on_stderr: Called with output text as the code writes
                it (the streamed endpoint is used then).

        Raises:
            Timeout: the code ran past ``timeout`` (``.execution`` holds what it
                produced). Conflict: the snapshot has no Python session.
            StreamInterrupted: the stream was cut (the sandbox died).
        """
        body, sock_t = run_code_body(code, timeout)
        if on_stdout is None and on_stderr is None:
            data = self.client._json(
                "POST", self._path + "/run_code", body=body, timeout=sock_t, what="run_code in %s" % self.id
            )
            ex = Execution.from_json(data)
        else:
            ex = self._run_code_stream(body, sock_t, on_stdout, on_stderr)
        return check_execution(ex, self.id, timeout)

    def _run_code_stream(
        self,
        body: Mapping[str, Any],
        sock_t: Optional[float],
        on_stdout: Optional[OutputHandler],
        on_stderr: Optional[OutputHandler],
    ) -> Execution:
        st = RunCodeState("run_code in %s" % self.id)
        resp = self.client._transport.request(
            "POST",
            self._path + "/run_code/stream",
            json_body=body,
            headers={"Accept": "application/x-ndjson"},
            timeout=sock_t,
            what=st.what,
        )
        try:
            for line in resp.lines():
                out, err = st.feed(line)
                if out and on_stdout is not None:
                    on_stdout(out)
                if err and on_stderr is not None:
                    on_stderr(err)
        except BaseException:
            resp.close()  # a callback raised: disconnecting interrupts the code
            raise
        return st.execution(resp.request_id)

    # -- branch ----------------------------------------------------------------

    def branch(
        self,
        tag: Optional[str] = None,
        *,
        mode: str = "diff",
        wait: bool = True,
        timeout: Any = DEFAULT,
    ) -> Branch:
        """Snapshot this running sandbox (memory, processes, Python session,
        files) into a new tag that forks like any other.

        Args:
            tag: The new tag; None generates ``<source tag>-br-<random>``.
            mode: ``diff`` (default; a layer over the source's snapshot,
                brief pause), ``full`` (self-contained, brief pause) or ``live``
                (no pause; needs the sandbox's memory on tmpfs/hugetlbfs).
            wait: False answers as soon as the source runs again, with the
                snapshot possibly still ``writing``: call ``.wait()`` on the
                result (or poll ``client.snapshots.get(tag)``) before forking.
            timeout: Seconds to wait for the daemon's answer.

        Returns:
            A :class:`Branch`: ``.snapshot``, ``.tag``, ``.state``,
            ``.pause_ms``, ``.bytes_written``, ``.total_ms`` and ``.wait()``.

        Raises:
            Conflict: the tag exists, or the mode cannot work here (the
            daemon's message says why). Unavailable: too many branches at
            once (retry after ``retry_after``).
        """
        check_branch_mode(mode)
        body = branch_body(tag, mode, wait, self.tag if tag is None else "")
        data = self.client._json("POST", self._path + "/branch", body=body, timeout=timeout, what="branch %s" % self.id)
        return Branch(self.client, data)
