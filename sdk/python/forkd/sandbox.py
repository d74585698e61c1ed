"""Sandboxes: commands, files, Python code and branches."""

from __future__ import annotations

import base64
import codecs
import json
import os
import re
import secrets
import threading
import time
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Generator,
    Iterable,
    Iterator,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
    overload,
)

from ._http import DEFAULT, DEFAULT_REQUEST_TIMEOUT, Response, _BLOCK
from .client import DEFAULT_SANDBOX_TIMEOUT, Branch, Client, _iter_file, _q, _remaining_size
from .errors import (
    CommandExitError,
    Conflict,
    ForkdError,
    InvalidArgument,
    NotFound,
    StreamInterrupted,
    Timeout,
    code_from_message,
    error_class,
    error_from_problem,
)
from .models import (
    CommandResult,
    Execution,
    FileInfo,
    Logs,
    NetworkPolicy,
    NetworkPolicyLike,
    PortInfo,
    ProcessInfo,
    SandboxInfo,
    SandboxNetwork,
)


__all__ = ["Sandbox", "Commands", "CommandHandle", "Files", "FileStream"]

OutputHandler = Callable[[str], Any]
Stdin = Union[str, bytes, bytearray, memoryview, Iterable[bytes], Any]
StdinData = Union[str, bytes, bytearray, memoryview, Iterable[bytes], Any]

# Seconds a stream may stay silent past its own timeout before the SDK
# gives up on the daemon (the daemon enforces the timeout itself).
_GRACE = 30.0

# Error codes that, inside a stream, mean it was cut: the sandbox died or
# was killed, or the daemon is stopping.
_CUT_CODES = ("unavailable", "internal", "canceled")

_TAG_UNSAFE = re.compile(r"[^a-z0-9._-]+")


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
    """

    def __init__(self, sandbox_id: str, *, client: Client, info: Optional[SandboxInfo] = None) -> None:
        _q(sandbox_id, "sandbox id")
        self.id = sandbox_id
        self.client = client
        self._info = info
        self._path = "/v1/sandboxes/" + _q(sandbox_id, "sandbox id")
        self.commands = Commands(self)
        self.files = Files(self)

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
        client: Optional[Client] = None,
        host: Optional[str] = None,
        token: Optional[str] = None,
        ca_cert: Optional[str] = None,
        socket: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
    ) -> "Sandbox":
        """Fork one sandbox from the snapshot ``tag``.

        Args:
            tag: The snapshot to fork from.
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

        Raises:
            NotFound: no snapshot ``tag``. RateLimited: a daemon limit was
            reached. Unavailable: no daemon answers. InvalidArgument: a
            malformed network policy.
        """
        c = _client(client, host, token, ca_cert, socket, request_timeout)
        return c.sandboxes.fork(
            tag, 1, timeout=timeout, idle_timeout=idle_timeout, metadata=metadata, network=network, cpus=cpus
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
        return c.sandboxes.fork(tag, n, timeout=timeout, idle_timeout=idle_timeout, metadata=metadata, network=network)

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
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise InvalidArgument("port %r: want an int from 1 to 65535" % (port,))
        data = self.client._json("GET", "%s/ports/%d" % (self._path, port), what="get port %d of %s" % (port, self.id))
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
        info = self.get_port(port)
        if info.host:
            return info.host
        ep = self.client._endpoint
        base = "http://forkd" if ep.kind == "unix" else ep.url
        return base + info.path

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
        body: Dict[str, Any] = {"code": code}
        if timeout:
            body["timeout_ms"] = max(1, int(timeout * 1000))
        sock_t = None if not timeout else timeout + _GRACE
        if on_stdout is None and on_stderr is None:
            data = self.client._json(
                "POST", self._path + "/run_code", body=body, timeout=sock_t, what="run_code in %s" % self.id
            )
            ex = Execution.from_json(data)
        else:
            ex = self._run_code_stream(body, sock_t, on_stdout, on_stderr)
        if ex.timed_out:
            raise Timeout("code in sandbox %s ran past its timeout of %ss and was interrupted" % (self.id, timeout), execution=ex)
        return ex

    def _run_code_stream(
        self,
        body: Mapping[str, Any],
        sock_t: Optional[float],
        on_stdout: Optional[OutputHandler],
        on_stderr: Optional[OutputHandler],
    ) -> Execution:
        what = "run_code in %s" % self.id
        resp = self.client._transport.request(
            "POST",
            self._path + "/run_code/stream",
            json_body=body,
            headers={"Accept": "application/x-ndjson"},
            timeout=sock_t,
            what=what,
        )
        logs = Logs()
        final: Optional[Dict[str, Any]] = None
        try:
            for line in resp.lines():
                ev = json.loads(line)
                t = ev.get("type")
                if t == "stdout":
                    d = ev.get("data") or ""
                    logs.stdout.append(d)
                    if on_stdout is not None and d:
                        on_stdout(d)
                elif t == "stderr":
                    d = ev.get("data") or ""
                    logs.stderr.append(d)
                    if on_stderr is not None and d:
                        on_stderr(d)
                elif t in ("result", "error"):
                    final = ev
        except BaseException:
            resp.close()  # a callback raised: disconnecting interrupts the code
            raise
        if final is None:
            raise StreamInterrupted(
                "%s: the stream ended before the code finished; the sandbox may have been killed" % what,
                request_id=resp.request_id,
                partial=Execution(logs=logs),
            )
        if final.get("type") == "error":
            problem = final.get("error") or {"detail": "run_code failed"}
            if problem.get("code") in _CUT_CODES:
                # The session or the sandbox went away mid-run.
                raise StreamInterrupted(
                    "%s: %s" % (what, problem.get("detail") or "the code could not finish"),
                    status=problem.get("status"),
                    code=problem.get("code"),
                    title=problem.get("title"),
                    type=problem.get("type"),
                    request_id=problem.get("request_id") or resp.request_id,
                    problem=problem,
                    partial=Execution(logs=logs),
                )
            raise error_from_problem(problem, request_id=resp.request_id)
        return Execution.from_json(final.get("result") or {}, logs=logs)

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
        if mode not in ("diff", "full", "live"):
            raise InvalidArgument("branch mode %r: use diff, full or live" % (mode,))
        if tag is None:
            base = _TAG_UNSAFE.sub("-", self.tag.lower()).strip("-._")[:40] or "sandbox"
            tag = "%s-br-%s" % (base, secrets.token_hex(4))
        body: Dict[str, Any] = {"tag": tag, "mode": mode}
        if not wait:
            body["no_wait"] = True
        data = self.client._json("POST", self._path + "/branch", body=body, timeout=timeout, what="branch %s" % self.id)
        return Branch(self.client, data)


class CommandHandle:
    """A command started with ``commands.run(..., background=True)``.

    Output is collected as it arrives (and passed to the callbacks given to
    ``run``, from a background thread). Call :meth:`wait` for the result or
    :meth:`kill` to stop it; with ``stdin=True``, write to it with
    :meth:`send_stdin` and end its input with :meth:`close_stdin`.
    """

    def __init__(self, stream: "_ExecStream", commands: "Commands") -> None:
        self._s = stream
        self._commands = commands
        self._thread = threading.Thread(target=stream.consume, name="forkd-exec-%s" % stream.sandbox_id, daemon=True)
        self._thread.start()

    @property
    def pid(self) -> Optional[int]:
        """The command's pid in the sandbox (None from an older daemon)."""
        return self._s.pid

    def _need_pid(self, what: str) -> int:
        if self._s.pid is None:
            raise Conflict(
                "%s: the daemon reported no pid for command %s; its sandbox agent predates process control"
                % (what, self._s.describe)
            )
        return self._s.pid

    def send_stdin(self, data: StdinData) -> None:
        """Write ``data`` (str as UTF-8, bytes, a file object or an iterable
        of bytes) to the command's stdin. It returns once the process's
        stdin pipe took all of it.

        Raises:
            Conflict: the command was not started with ``stdin=True``, or its
            stdin is closed. NotFound: the command has exited.
        """
        self._commands.send_stdin(self._need_pid("send_stdin"), data)

    def close_stdin(self) -> None:
        """Close the command's stdin (EOF). Closing twice is fine, and so is
        closing after the command exited (one that read to EOF may exit
        before a second close arrives).

        Raises:
            Conflict: the command was not started with ``stdin=True``.
        """
        try:
            self._commands.close_stdin(self._need_pid("close_stdin"))
        except NotFound as e:
            if not _process_gone(e):
                raise

    @property
    def stdout(self) -> str:
        """Standard output so far."""
        return self._s.out.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """Standard error so far."""
        return self._s.err.decode("utf-8", "replace")

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code, or None while it runs."""
        ev = self._s.exit_event
        return None if ev is None or not self._s.done.is_set() else int(ev.get("exit_code") or 0)

    @property
    def done(self) -> bool:
        """True once the command ended (or its stream failed)."""
        return self._s.done.is_set()

    def is_running(self) -> bool:
        """True while the command runs."""
        return not self._s.done.is_set()

    def wait(self, timeout: Optional[float] = None) -> CommandResult:
        """Wait for the command to end and return its result, raising as
        ``run`` does (CommandExitError for a non-zero exit unless
        ``check=False`` was given, Timeout for the command's own timeout,
        StreamInterrupted when the sandbox died).

        Args:
            timeout: Seconds to wait; on expiry raises Timeout and the command
                keeps running.
        """
        if not self._s.done.wait(timeout):
            raise Timeout("command %s still running after %ss" % (self._s.describe, timeout))
        self._thread.join()
        return self._s.outcome()

    def kill(self) -> bool:
        """Stop the command: SIGKILL to its process group (the process and
        what it started). Returns False when it had already ended. A later
        :meth:`wait` reports exit code 137 (SIGKILL)."""
        if self._s.done.is_set():
            return False
        if self._s.pid is not None:
            try:
                sent = self._commands.kill(self._s.pid)
            except ForkdError:
                sent = False  # cut the connection instead (below)
            if sent and self._s.done.wait(10):
                return True
            if not sent and self._s.done.wait(1):
                return False  # it had exited; its exit event was on the way
        # No pid (an older daemon), or the signal did not end it: cutting
        # the connection makes the agent kill the process group.
        self._s.killed = True
        self._s.resp.abort()
        self._s.done.wait(10)
        return True


class _ExecStream:
    """Reads one exec answer: NDJSON events, then exactly one exit event."""

    def __init__(
        self,
        sandbox_id: str,
        describe: str,
        resp: Response,
        on_stdout: Optional[OutputHandler],
        on_stderr: Optional[OutputHandler],
        check: bool,
        sender: Optional[threading.Thread] = None,
    ) -> None:
        self.sandbox_id = sandbox_id
        self.describe = describe
        self.resp = resp
        self.on_stdout = on_stdout
        self.on_stderr = on_stderr
        self.check = check
        self.sender = sender
        self.out = bytearray()
        self.err = bytearray()
        self.exit_event: Optional[Dict[str, Any]] = None
        self.error: Optional[BaseException] = None
        self.killed = False
        self.done = threading.Event()
        # The daemon sends the pid with the 200 (and again in the start
        # event, which an older daemon does not send).
        pid = resp.headers.get("X-Forkd-Pid") if resp.headers is not None else None
        self.pid: Optional[int] = int(pid) if pid and pid.isdigit() else None

    def consume(self) -> None:
        """Read the stream to its end; never raises (see outcome)."""
        dec_out = codecs.getincrementaldecoder("utf-8")("replace") if self.on_stdout else None
        dec_err = codecs.getincrementaldecoder("utf-8")("replace") if self.on_stderr else None
        b64 = base64.b64decode
        try:
            for line in self.resp.lines():
                try:
                    ev = json.loads(line)
                except ValueError as e:
                    raise StreamInterrupted(
                        "command %s in sandbox %s: undecodable event from the daemon: %r"
                        % (self.describe, self.sandbox_id, line[:200]),
                        request_id=self.resp.request_id,
                    ) from e
                t = ev.get("type")
                if t == "stdout":
                    data = b64(ev.get("data") or "")
                    self.out += data
                    if dec_out is not None:
                        s = dec_out.decode(data)
                        if s:
                            self.on_stdout(s)  # type: ignore[misc]
                elif t == "stderr":
                    data = b64(ev.get("data") or "")
                    self.err += data
                    if dec_err is not None:
                        s = dec_err.decode(data)
                        if s:
                            self.on_stderr(s)  # type: ignore[misc]
                elif t == "exit":
                    self.exit_event = ev
                elif t == "start" and self.pid is None and ev.get("pid"):
                    self.pid = int(ev["pid"])
            if dec_out is not None:
                s = dec_out.decode(b"", final=True)
                if s:
                    self.on_stdout(s)  # type: ignore[misc]
            if dec_err is not None:
                s = dec_err.decode(b"", final=True)
                if s:
                    self.on_stderr(s)  # type: ignore[misc]
        except Exception as e:  # noqa: BLE001 - reported by outcome()
            self.error = e
            self.resp.close()
        except BaseException:
            self.resp.close()  # cut: the agent kills the process group
            raise
        finally:
            if self.sender is not None:
                self.resp.close()  # unblocks a sender still writing stdin
                self.sender.join()
            self.done.set()

    def result(self, exit_ev: Mapping[str, Any]) -> CommandResult:
        out, err = bytes(self.out), bytes(self.err)
        return CommandResult(
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            exit_code=int(exit_ev.get("exit_code") or 0),
            signal=exit_ev.get("signal") or None,
            timed_out=bool(exit_ev.get("timed_out")),
            duration_ms=float(exit_ev.get("duration_us") or 0) / 1000.0,
            error=exit_ev.get("error") or None,
            stdout_bytes=out,
            stderr_bytes=err,
            pid=self.pid,
        )

    def outcome(self) -> CommandResult:
        """The result, or the error it ends with."""
        rid = self.resp.request_id
        if self.killed and self.exit_event is None:
            res = self.result({"exit_code": 137, "signal": "SIGKILL", "error": "killed by CommandHandle.kill()"})
            if self.check:
                raise CommandExitError(res, self.describe)
            return res
        if self.error is not None:
            # A cut stream, a timeout, or an exception from a callback.
            if isinstance(self.error, StreamInterrupted) and self.error.partial is None:
                self.error.partial = self.result({"exit_code": -1})
            raise self.error
        ev = self.exit_event
        if ev is None:
            raise StreamInterrupted(
                "command %s in sandbox %s: the stream ended before the process exited; the sandbox may have been "
                "killed or the daemon restarted" % (self.describe, self.sandbox_id),
                request_id=rid,
                partial=self.result({"exit_code": -1}),
            )
        if ev.get("error") and int(ev.get("exit_code") or 0) == -1:
            msg = str(ev["error"])
            code = ev.get("code") or code_from_message(msg)
            text = "command %s in sandbox %s: %s" % (self.describe, self.sandbox_id, msg)
            cls = error_class(code)
            if cls is ForkdError or code in _CUT_CODES:
                # The agent lost the process mid-way: the sandbox died or
                # was killed, or the daemon is stopping.
                raise StreamInterrupted(text, code=code, request_id=rid, partial=self.result(ev))
            raise cls(text, code=code, request_id=rid)
        res = self.result(ev)
        if self.check:
            if res.timed_out:
                raise Timeout("command %s in sandbox %s ran past its timeout and was killed" % (self.describe, self.sandbox_id), result=res)
            if res.exit_code != 0:
                raise CommandExitError(res, self.describe)
        return res


def _process_gone(e: NotFound) -> bool:
    """e says a command's process is gone (it exited), not its sandbox."""
    return "no sandbox" not in (e.detail or str(e))


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


def _stdin_source(stdin: Stdin) -> Iterable[bytes]:
    if isinstance(stdin, str):
        return [stdin.encode("utf-8")]
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        data = bytes(stdin)
        return [data[i:i + _BLOCK] for i in range(0, len(data), _BLOCK)] or [b""]
    if hasattr(stdin, "read"):
        return _iter_file(stdin)
    return (x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in stdin)


class Commands:
    """Run processes in a sandbox: ``sandbox.commands``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    @overload
    def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        envs: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        timeout: Optional[float] = ...,
        on_stdout: Optional[OutputHandler] = ...,
        on_stderr: Optional[OutputHandler] = ...,
        stdin: Optional[Stdin] = ...,
        background: Literal[False] = ...,
        check: bool = ...,
    ) -> CommandResult: ...

    @overload
    def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        envs: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        timeout: Optional[float] = ...,
        on_stdout: Optional[OutputHandler] = ...,
        on_stderr: Optional[OutputHandler] = ...,
        stdin: Optional[Stdin] = ...,
        background: Literal[True],
        check: bool = ...,
    ) -> CommandHandle: ...

    @overload
    def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        envs: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        timeout: Optional[float] = ...,
        on_stdout: Optional[OutputHandler] = ...,
        on_stderr: Optional[OutputHandler] = ...,
        stdin: Optional[Stdin] = ...,
        background: bool = ...,
        check: bool = ...,
    ) -> Union[CommandResult, CommandHandle]: ...

    def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        envs: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
        stdin: Optional[Stdin] = None,
        background: bool = False,
        check: bool = True,
    ) -> Union[CommandResult, CommandHandle]:
        """Run a command and return its :class:`CommandResult`.

        Args:
            cmd: A shell command line (run by ``/bin/sh -c``) or an argv list
                (executed directly, never through a shell).
            envs: Extra environment variables.
            cwd: Working directory.
            timeout: Seconds after which the process group is killed (None:
                no limit).
            on_stdout, on_stderr: Called with output text as it arrives
                (decoded as UTF-8; a character is never split).
            stdin: Data for the process's stdin: str, bytes, a binary (or
                text) file object, or an iterable of bytes; it is streamed
                while the output is read. ``True`` (E2B's meaning) keeps
                stdin open for :meth:`send_stdin` (``handle.send_stdin`` with
                ``background=True``) until :meth:`close_stdin`. None: stdin
                is /dev/null.
            background: Return a :class:`CommandHandle` at once instead of
                waiting.
            check: True (the default, like E2B) raises CommandExitError for a
                non-zero exit and Timeout when ``timeout`` killed the command;
                False returns the result in both cases (see ``exit_code`` and
                ``timed_out``).

        Raises:
            CommandExitError: non-zero exit (with ``check=True``).
            Timeout: killed by ``timeout`` (with ``check=True``).
            NotFound: no such sandbox, or the executable or cwd does not exist.
            StreamInterrupted: the stream ended before the process did (the
                sandbox was killed or died).
        """
        req: Dict[str, Any] = {}
        if isinstance(cmd, str):
            if not cmd.strip():
                raise InvalidArgument("empty command")
            req["shell"] = cmd
            describe = repr(cmd if len(cmd) <= 80 else cmd[:77] + "...")
        else:
            argv = [os.fspath(a) if not isinstance(a, str) else a for a in cmd]
            if not argv:
                raise InvalidArgument("empty argv")
            req["argv"] = argv
            d = " ".join(argv)
            describe = repr(d if len(d) <= 80 else d[:77] + "...")
        if envs:
            req["env"] = {str(k): str(v) for k, v in envs.items()}
        if cwd:
            req["cwd"] = cwd
        if timeout:
            req["timeout_ms"] = max(1, int(timeout * 1000))
        keep_open = stdin is True
        if keep_open:
            req["stdin_open"] = True
            stdin = None
        elif stdin is False:
            stdin = None
        if stdin is not None:
            req["stdin"] = True
        headers = {"X-Forkd-Exec": json.dumps(req, separators=(",", ":")), "Accept": "application/x-ndjson"}
        sock_t = None if not timeout else timeout + _GRACE
        sb = self._sb
        path = sb._path + "/exec"
        what = "exec %s in %s" % (describe, sb.id)
        transport = sb.client._transport
        sender_thread: Optional[threading.Thread] = None
        if stdin is None:
            resp = transport.request("POST", path, headers=headers, timeout=sock_t, what=what)
        else:
            # Full duplex: stdin is written by a thread while the output is
            # read, so a process that echoes as it reads never deadlocks.
            headers["Content-Type"] = "application/octet-stream"
            conn, sender = transport.open_duplex("POST", path, headers, sock_t, what)
            source = _stdin_source(stdin)
            sender_thread = threading.Thread(target=sender.pump, args=(source,), name="forkd-stdin", daemon=True)
            sender_thread.start()
            try:
                resp = transport.finish_duplex(conn, what)
            except BaseException:
                conn.close()
                sender_thread.join()
                raise
        stream = _ExecStream(sb.id, describe, resp, on_stdout, on_stderr, check, sender_thread)
        if background:
            return CommandHandle(stream, self)
        try:
            stream.consume()
        except BaseException:
            resp.close()
            raise
        return stream.outcome()


    # -- running commands ----------------------------------------------------

    def _proc_path(self, pid: int, sub: str) -> str:
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise InvalidArgument("pid %r: want the positive pid a command reported (handle.pid, commands.list())" % (pid,))
        return "%s/processes/%d/%s" % (self._sb._path, pid, sub)

    def list(self) -> List[ProcessInfo]:
        """The commands running in the sandbox, by pid (each from its start
        until its process exits)."""
        data = self._sb.client._json("GET", self._sb._path + "/processes", what="list processes in %s" % self._sb.id)
        return [ProcessInfo.from_json(d) for d in (data or [])]

    def send_stdin(self, pid: int, data: StdinData) -> None:
        """Write ``data`` (str as UTF-8, bytes, a file object or an iterable
        of bytes) to the stdin of the running command ``pid``, which must
        have been started with ``stdin=True``. Returns once the process's
        stdin pipe took all of it (a process that does not read holds the
        call until ``request_timeout``). Concurrent calls are written one
        after the other, never interleaved.

        Raises:
            NotFound: no running command with this pid. Conflict: it was not
            started with ``stdin=True``, or its stdin is closed.
        """
        self._write_stdin(pid, data, close=False)

    def close_stdin(self, pid: int) -> None:
        """Close the stdin (EOF) of the running command ``pid``, started
        with ``stdin=True``. Closing twice is fine. Raises NotFound,
        Conflict as :meth:`send_stdin`."""
        self._write_stdin(pid, b"", close=True)

    def _write_stdin(self, pid: int, data: StdinData, close: bool) -> None:
        path = self._proc_path(pid, "stdin")
        body, headers = _raw_body(data)
        if isinstance(body, (bytes, bytearray)) and not body:
            body = None  # Content-Length: 0
        what = "%s stdin of process %d in %s" % ("close" if close else "write", pid, self._sb.id)
        self._sb.client._transport.request(
            "POST", path, query={"close": "true"} if close else None, body=body, headers=headers, what=what
        ).read()

    def kill(self, pid: int, signal: str = "SIGKILL") -> bool:
        """Send ``signal`` (a name: ``SIGTERM``, ``TERM``; default SIGKILL)
        to the process group of the running command ``pid``. Returns False
        when no such command runs (it exited), as E2B's ``kill`` does."""
        try:
            self._sb.client._json(
                "POST",
                self._proc_path(pid, "signal"),
                body={"signal": signal},
                what="signal %s to process %d in %s" % (signal, pid, self._sb.id),
            )
        except NotFound as e:
            if not _process_gone(e):
                raise  # the sandbox itself is gone
            return False
        return True


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
        q = dict(kw.pop("query", None) or {})
        q["path"] = path
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
        if format not in ("text", "bytes", "stream"):
            raise InvalidArgument("format %r: use 'text', 'bytes' or 'stream'" % (format,))
        resp = self._req("GET", "/files", path, timeout=request_timeout, verb="read")
        if format == "stream":
            return FileStream(resp, path)
        data = b"".join(resp.chunks(_BLOCK))
        if format == "bytes":
            return data
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidArgument(
                "%s in sandbox %s is not UTF-8 text (%s); read it with format='bytes'" % (path, self._sb.id, e)
            ) from e

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
        body: Dict[str, Any] = {"path": path}
        if mode is not None:
            body["mode"] = mode
        url = self._sb._path + "/files/mkdir"
        what = "mkdir %s in %s" % (path, self._sb.id)
        c = self._sb.client
        try:
            c._json("POST", url, body=body, what=what)
            return True
        except NotFound as e:
            if "parent" not in (e.detail or ""):
                raise  # no such sandbox
            body["parents"] = True
            c._json("POST", url, body=body, what=what)
            return True
        except Conflict:
            if self.get_info(path).is_dir:
                return False
            raise
