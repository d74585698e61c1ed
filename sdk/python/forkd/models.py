"""Data types returned by the forkd SDK.

Every model keeps the daemon's JSON object in ``raw``, so fields a newer
daemon adds are reachable before the SDK names them.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

from .errors import InvalidArgument

__all__ = [
    "NetworkPolicy",
    "NetworkPolicyLike",
    "NetworkStats",
    "SandboxNetwork",
    "PortInfo",
    "SandboxInfo",
    "SnapshotInfo",
    "ParentRef",
    "SnapshotFile",
    "FileInfo",
    "CommandResult",
    "ProcessInfo",
    "Result",
    "Logs",
    "ExecutionError",
    "Execution",
    "VersionInfo",
    "OperationInfo",
    "parse_time",
]

_TIME_RE = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:?\d{2})?$"
)


def parse_time(value: Optional[str]) -> Optional[_dt.datetime]:
    """Parse an RFC 3339 time as the daemon writes it (nanoseconds, ``Z``)
    into an aware datetime; None for a missing or zero time."""
    if not value:
        return None
    m = _TIME_RE.match(value)
    if not m:
        return None
    date, clock, frac, tz = m.groups()
    frac = ((frac or "") + "000000")[:6]
    if not tz or tz == "Z":
        tz = "+00:00"
    elif ":" not in tz:
        tz = tz[:3] + ":" + tz[3:]
    try:
        t = _dt.datetime.fromisoformat("%sT%s.%s%s" % (date, clock, frac, tz))
    except ValueError:
        return None
    if t.year <= 1:
        return None  # Go's zero time
    return t


def _str_map(v: Any) -> Dict[str, str]:
    return {str(k): str(x) for k, x in (v or {}).items()}


_NETWORK_MODES = ("none", "public", "allow")


@dataclass
class NetworkPolicy:
    """What a sandbox may reach on the network (its egress policy).

    ``mode`` is ``"none"`` (nothing), ``"public"`` (the internet, but never
    the daemon's host, other sandboxes, or private, CGNAT, loopback,
    link-local and multicast ranges) or ``"allow"``: only what ``allow``
    lists, networks (``"198.51.100.0/24"``, ``"203.0.113.7:443/tcp"``, port
    ranges as ``"203.0.113.7:8000-8099"``) and domain names
    (``"example.com"``, ``"*.example.com"`` for every name below it)::

        NetworkPolicy.none()
        NetworkPolicy.public()
        NetworkPolicy.allow_only(["198.51.100.0/24", "*.example.com"])

    Wherever the SDK takes a policy it also takes its short forms (see
    :meth:`parse`): ``"none"``, ``"public"``, ``"allow:ENTRY,ENTRY"`` (the
    CLI's form), a dict ``{"mode": ..., "allow": [...]}``, a list of allow
    entries, or a bool (E2B's ``allow_internet_access``: True is public,
    False none).
    """

    mode: str
    allow: List[str] = field(default_factory=list)
    #: Caps the TCP connections open through the sandbox's uplink at once (0: none).
    max_connections: int = 0
    #: Caps its traffic each way, in Mbit/s (0: none).
    rate_mbit: int = 0

    @classmethod
    def none(cls) -> "NetworkPolicy":
        """No network at all."""
        return cls("none")

    @classmethod
    def public(cls) -> "NetworkPolicy":
        """The internet (never the host, other sandboxes or reserved ranges)."""
        return cls("public")

    @classmethod
    def allow_only(cls, entries: Iterable[str]) -> "NetworkPolicy":
        """Only the networks and domain names in ``entries``."""
        return cls("allow", list(entries))

    @classmethod
    def parse(cls, value: "NetworkPolicyLike") -> "NetworkPolicy":
        """A policy from any of the forms the SDK accepts (see the class
        docstring). Raises :class:`~forkd.InvalidArgument` for anything
        else; the daemon checks the entries themselves."""
        if isinstance(value, NetworkPolicy):
            p = cls(value.mode, list(value.allow or []), value.max_connections, value.rate_mbit)
        elif isinstance(value, bool):
            p = cls("public" if value else "none")
        elif isinstance(value, str):
            s = value.strip()
            if s.startswith("allow:"):
                p = cls("allow", [e.strip() for e in s[len("allow:"):].split(",") if e.strip()])
            elif s in ("none", "public", "allow"):
                p = cls(s)
            else:
                raise InvalidArgument(
                    "network policy %r: want 'none', 'public' or 'allow:ENTRY,ENTRY' "
                    "(a CIDR, ADDR[:PORT[-PORT]][/tcp|/udp], or a domain such as *.example.com)" % (value,)
                )
        elif isinstance(value, Mapping):
            extra = set(value) - {"mode", "allow", "max_connections", "rate_mbit"}
            if extra:
                raise InvalidArgument(
                    "network policy %r: unknown keys %s (want mode, allow, max_connections, rate_mbit)" % (dict(value), sorted(extra))
                )
            allow = value.get("allow") or []
            if isinstance(allow, str):
                raise InvalidArgument("network policy allow %r: want a list of entries, not a string" % (allow,))
            mode = value.get("mode")
            if mode is None and allow:
                mode = "allow"
            p = cls(mode if isinstance(mode, str) else "", [str(e) for e in allow])
            for key in ("max_connections", "rate_mbit"):
                n = value.get(key, 0) or 0
                if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                    raise InvalidArgument("network policy %s %r: want a whole number >= 0 (0: no cap)" % (key, n))
                setattr(p, key, n)
        elif isinstance(value, (list, tuple)):
            p = cls("allow", [str(e) for e in value])
        else:
            raise InvalidArgument(
                "network policy %r: want a NetworkPolicy, 'none', 'public', 'allow:ENTRY,...', "
                "a dict {'mode': ..., 'allow': [...]}, a list of allow entries or a bool" % (value,)
            )
        if p.mode not in _NETWORK_MODES:
            raise InvalidArgument("network mode %r: want 'none', 'public' or 'allow'" % (p.mode,))
        if p.allow and p.mode != "allow":
            raise InvalidArgument(
                "network mode %r takes no allow list (got %r): use mode 'allow' to list what the sandbox may reach"
                % (p.mode, p.allow)
            )
        if any(not isinstance(e, str) or not e.strip() for e in p.allow):
            raise InvalidArgument("network allow list %r: every entry must be a non-empty string" % (p.allow,))
        return p

    def to_json(self) -> Dict[str, Any]:
        """The wire form: ``{"mode": ..., "allow": [...]}`` (allow only when set)."""
        out: Dict[str, Any] = {"mode": self.mode}
        if self.allow:
            out["allow"] = list(self.allow)
        if self.max_connections:
            out["max_connections"] = self.max_connections
        if self.rate_mbit:
            out["rate_mbit"] = self.rate_mbit
        return out

    @classmethod
    def from_json(cls, d: Optional[Mapping[str, Any]]) -> "NetworkPolicy":
        d = d or {}
        return cls(
            d.get("mode") or "",
            [str(e) for e in (d.get("allow") or [])],
            int(d.get("max_connections") or 0),
            int(d.get("rate_mbit") or 0),
        )

    def __str__(self) -> str:
        """The CLI's form: ``none``, ``public`` or ``allow:ENTRY,ENTRY``."""
        if self.mode == "allow":
            return "allow:" + ",".join(self.allow)
        return self.mode


NetworkPolicyLike = Union[NetworkPolicy, str, bool, Mapping[str, Any], Sequence[str]]
"""What a ``network=`` argument takes (see :meth:`NetworkPolicy.parse`)."""


def _network_body(value: Optional[NetworkPolicyLike]) -> Optional[Dict[str, Any]]:
    """The request's ``network`` object, or None to inherit."""
    if value is None:
        return None
    return NetworkPolicy.parse(value).to_json()


@dataclass
class NetworkStats:
    """What crossed a sandbox's network link since it was set up (all
    zero until a policy other than none first linked it)."""

    tx_bytes: int = 0
    rx_bytes: int = 0
    tx_packets: int = 0
    rx_packets: int = 0
    denied_packets: int = 0
    """Packets the policy refused."""
    spoofed_packets: int = 0
    """Packets dropped for a source address that was not the sandbox's."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "NetworkStats":
        return cls(
            tx_bytes=int(d.get("tx_bytes") or 0),
            rx_bytes=int(d.get("rx_bytes") or 0),
            tx_packets=int(d.get("tx_packets") or 0),
            rx_packets=int(d.get("rx_packets") or 0),
            denied_packets=int(d.get("denied_packets") or 0),
            spoofed_packets=int(d.get("spoofed_packets") or 0),
        )


@dataclass
class SandboxNetwork:
    """A sandbox's network (``sandbox.get_network()``): its policy and,
    when the daemon reports them, its traffic counters."""

    policy: NetworkPolicy
    stats: Optional[NetworkStats] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Optional[Mapping[str, Any]]) -> "SandboxNetwork":
        d = d or {}
        st = d.get("stats")
        return cls(
            policy=NetworkPolicy.from_json(d.get("policy")),
            stats=NetworkStats.from_json(st) if st else None,
            raw=dict(d),
        )

    @property
    def mode(self) -> str:
        """The policy's mode: ``none``, ``public`` or ``allow``."""
        return self.policy.mode

    @property
    def allow(self) -> List[str]:
        """The policy's allow list (mode ``allow``)."""
        return self.policy.allow


@dataclass
class PortInfo:
    """Where a TCP port inside a sandbox is served by the daemon
    (``sandbox.get_port(port)``)."""

    port: int
    path: str
    """The proxy path on the daemon's API: ``/v1/sandboxes/ID/ports/PORT/``."""
    host: Optional[str] = None
    """``PORT-ID.DOMAIN`` when the daemon routes a domain to sandbox ports
    (``forkd serve --port-domain``), else None."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "PortInfo":
        return cls(port=int(d.get("port") or 0), path=d.get("path", ""), host=d.get("host") or None, raw=dict(d))


@dataclass
class SandboxInfo:
    """A sandbox as the daemon describes it (``GET /v1/sandboxes/{id}``)."""

    id: str
    tag: str
    state: str
    """``running``, ``dead`` (the VMM exited on its own; see dead_reason) or ``stopped``."""
    created: Optional[_dt.datetime]
    ready_ms: float
    """Fork-to-ready: from taking a VMM to the agent answering."""
    pooled: bool
    pid: Optional[int] = None
    rehearsed: bool = False
    """The pooled VMM was restored ahead and rehearsed a first request, so
    the first ``run_code`` runs warm."""
    netns: Optional[str] = None
    guest_ip: Optional[str] = None
    dead_reason: Optional[str] = None
    metadata: Dict[str, str] = field(default_factory=dict)
    expires_at: Optional[_dt.datetime] = None
    """When its timeout ends it (None: no limit)."""
    ended_at: Optional[_dt.datetime] = None
    """When a dead sandbox was found dead; it leaves the list the daemon's
    retention period later."""
    idle_timeout_s: Optional[int] = None
    last_activity: Optional[_dt.datetime] = None
    console_tail: Optional[str] = None
    network: Optional[SandboxNetwork] = None
    """Its network policy (and traffic, for one sandbox), when the daemon
    reports it."""
    cpus: Optional[float] = None
    """The CPU limit its fork asked for (None: the default)."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SandboxInfo":
        return cls(
            id=d.get("id", ""),
            tag=d.get("tag", ""),
            state=d.get("state", ""),
            created=parse_time(d.get("created")),
            ready_ms=float(d.get("ready_ms") or 0),
            pooled=bool(d.get("pooled")),
            pid=d.get("pid"),
            rehearsed=bool(d.get("rehearsed")),
            netns=d.get("netns"),
            guest_ip=d.get("guest_ip"),
            dead_reason=d.get("dead_reason"),
            metadata=_str_map(d.get("metadata")),
            expires_at=parse_time(d.get("expires_at")),
            ended_at=parse_time(d.get("ended_at")),
            idle_timeout_s=d.get("idle_timeout_s"),
            last_activity=parse_time(d.get("last_activity")),
            console_tail=d.get("console_tail"),
            network=SandboxNetwork.from_json(d["network"]) if d.get("network") else None,
            cpus=float(d["cpus"]) if d.get("cpus") else None,
            raw=dict(d),
        )

    @property
    def running(self) -> bool:
        """True while the sandbox runs."""
        return self.state == "running"


@dataclass
class ParentRef:
    """A diff layer's parent snapshot, by tag and manifest digest."""

    tag: str
    digest: str


@dataclass
class SnapshotFile:
    """One file of a snapshot."""

    size: int
    sha256: str


@dataclass
class SnapshotInfo:
    """A snapshot tag (``GET /v1/snapshots/{tag}``).

    ``state`` is ``ready`` (can be forked), ``writing`` (a branch made with
    ``wait=False`` is still being saved) or ``failed`` (``error`` says why).
    """

    tag: str
    id: str
    state: str
    created: Optional[_dt.datetime]
    recipe: str
    image_digest: str
    vmm: str
    vmm_version: str
    accel: str
    memory_mib: int
    vcpus: int
    python: bool
    size_bytes: int
    disk_bytes: int
    create_ms: int
    pooled_vmms: int
    depth: int = 0
    """Layers above a self-contained snapshot (0: flat)."""
    parent: Optional[ParentRef] = None
    ancestors: List[str] = field(default_factory=list)
    """Parent first, then its parent, up to the root."""
    dependents: List[str] = field(default_factory=list)
    """Tags whose chains need this snapshot."""
    error: Optional[str] = None
    files: Dict[str, SnapshotFile] = field(default_factory=dict, repr=False)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SnapshotInfo":
        parent = d.get("parent")
        return cls(
            tag=d.get("tag", ""),
            id=d.get("id", ""),
            # A daemon older than the state field only lists ready snapshots.
            state=d.get("state") or "ready",
            created=parse_time(d.get("created")),
            recipe=d.get("recipe", ""),
            image_digest=d.get("image_digest", ""),
            vmm=d.get("vmm", ""),
            vmm_version=d.get("vmm_version", ""),
            accel=d.get("accel", ""),
            memory_mib=int(d.get("memory_mib") or 0),
            vcpus=int(d.get("vcpus") or 0),
            python=bool(d.get("python")),
            size_bytes=int(d.get("size_bytes") or 0),
            disk_bytes=int(d.get("disk_bytes") or 0),
            create_ms=int(d.get("create_ms") or 0),
            pooled_vmms=int(d.get("pooled_vmms") or 0),
            depth=int(d.get("depth") or 0),
            parent=ParentRef(parent.get("tag", ""), parent.get("digest", "")) if parent else None,
            ancestors=list(d.get("ancestors") or []),
            dependents=list(d.get("dependents") or []),
            error=d.get("error") or None,
            files={
                k: SnapshotFile(int(v.get("size") or 0), v.get("sha256", "")) for k, v in (d.get("files") or {}).items()
            },
            raw=dict(d),
        )

    @property
    def ready(self) -> bool:
        """True when the snapshot can be forked."""
        return self.state == "ready"


@dataclass
class FileInfo:
    """A file or directory inside a sandbox."""

    name: str
    path: str
    size: int
    mode: int
    """Permission bits."""
    is_dir: bool
    is_link: bool
    mod_time: Optional[_dt.datetime]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "FileInfo":
        return cls(
            name=d.get("name", ""),
            path=d.get("path", ""),
            size=int(d.get("size") or 0),
            mode=int(d.get("mode") or 0),
            is_dir=bool(d.get("is_dir")),
            is_link=bool(d.get("is_link")),
            mod_time=parse_time(d.get("mod_time")),
            raw=dict(d),
        )

    @property
    def type(self) -> str:
        """``dir``, ``link`` or ``file`` (E2B's EntryInfo.type)."""
        return "dir" if self.is_dir else ("link" if self.is_link else "file")


@dataclass
class CommandResult:
    """What a finished command produced.

    ``stdout`` and ``stderr`` are decoded as UTF-8 (invalid bytes become
    U+FFFD); ``stdout_bytes`` and ``stderr_bytes`` hold the exact bytes.
    """

    stdout: str
    stderr: str
    exit_code: int
    signal: Optional[str] = None
    """The signal that ended the process (``SIGKILL``), if one did;
    exit_code is then 128 + its number, as shells report it."""
    timed_out: bool = False
    """True when the command's timeout killed it."""
    duration_ms: float = 0.0
    error: Optional[str] = None
    stdout_bytes: bytes = field(default=b"", repr=False)
    stderr_bytes: bytes = field(default=b"", repr=False)
    pid: Optional[int] = None
    """The process's pid in the sandbox (None from an older daemon)."""

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exit_code == 0


@dataclass
class ProcessInfo:
    """A command running in a sandbox (``sandbox.commands.list()``): every
    exec from its start until its process exits."""

    pid: int
    """The pid in the sandbox: what ``commands.kill``, ``send_stdin`` and
    ``close_stdin`` take."""
    argv: List[str]
    """As run: ``["/bin/sh", "-c", CMD]`` for a shell command."""
    cmd: str
    """The shell command line, or the argv joined with spaces."""
    cwd: str
    started: Optional[_dt.datetime]
    """When it started, by the sandbox's clock."""
    stdin_open: bool
    """``send_stdin`` accepts data: started with ``stdin=True`` and not
    closed yet."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ProcessInfo":
        argv = [str(a) for a in (d.get("argv") or [])]
        return cls(
            pid=int(d.get("pid") or 0),
            argv=argv,
            cmd=d.get("shell") or " ".join(argv),
            cwd=d.get("cwd", ""),
            started=parse_time(d.get("started")),
            stdin_open=bool(d.get("stdin_open")),
            raw=dict(d),
        )


_MIME_FIELDS = (
    ("text/plain", "text"),
    ("text/html", "html"),
    ("text/markdown", "markdown"),
    ("image/svg+xml", "svg"),
    ("image/png", "png"),
    ("image/jpeg", "jpeg"),
    ("application/pdf", "pdf"),
    ("text/latex", "latex"),
    ("application/json", "json"),
    ("application/javascript", "javascript"),
)
_FIELD_OF = dict(_MIME_FIELDS)


class Result:
    """One rich output of :meth:`Sandbox.run_code`, like E2B's ``Result``:
    the value of the last expression (``is_main_result``) or something the
    code displayed (a matplotlib figure, a ``display()`` call).

    Attributes:
        text: ``text/plain`` (the repr).
        html: ``text/html`` (DataFrames, objects with ``_repr_html_``).
        markdown, svg, latex, javascript: the matching MIME types.
        png, jpeg, pdf: base64-encoded data (see :meth:`png_bytes`).
        json: ``application/json``, parsed.
        extra: MIME types the fields above do not cover.
        is_main_result: True for the value of the last expression.
        raw: The MIME type -> string map as received.
    """

    __slots__ = (
        "text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript",
        "extra", "is_main_result", "raw",
    )

    def __init__(self, data: Mapping[str, str], is_main_result: bool = False) -> None:
        self.raw: Dict[str, str] = dict(data)
        self.is_main_result = is_main_result
        self.extra: Dict[str, str] = {}
        for _, name in _MIME_FIELDS:
            setattr(self, name, None)
        for mime, value in data.items():
            attr = _FIELD_OF.get(mime)
            if attr is None:
                self.extra[mime] = value
            elif attr == "json":
                try:
                    self.json = json.loads(value) if isinstance(value, str) else value
                except ValueError:
                    self.json = value
            else:
                setattr(self, attr, value)

    text: Optional[str]
    html: Optional[str]
    markdown: Optional[str]
    svg: Optional[str]
    png: Optional[str]
    jpeg: Optional[str]
    pdf: Optional[str]
    latex: Optional[str]
    json: Any
    javascript: Optional[str]

    def formats(self) -> List[str]:
        """The formats this result has: ``text``, ``html``, ``png``, ...
        then any extra MIME types."""
        out = [name for mime, name in _MIME_FIELDS if mime in self.raw]
        out.extend(self.extra)
        return out

    def png_bytes(self) -> Optional[bytes]:
        """The PNG image, decoded from base64."""
        return base64.b64decode(self.png) if self.png else None

    def jpeg_bytes(self) -> Optional[bytes]:
        """The JPEG image, decoded from base64."""
        return base64.b64decode(self.jpeg) if self.jpeg else None

    def __getitem__(self, mime: str) -> str:
        return self.raw[mime]

    def __str__(self) -> str:
        return self.text if self.text is not None else ""

    def __repr__(self) -> str:
        return "Result(%s%s)" % (
            ", ".join(self.formats()),
            ", main" if self.is_main_result else "",
        )

    # Jupyter display hooks, so a Result shows richly in a notebook.
    def _repr_html_(self) -> Optional[str]:
        return self.html

    def _repr_png_(self) -> Optional[bytes]:
        return self.png_bytes()

    def _repr_markdown_(self) -> Optional[str]:
        return self.markdown

    def _repr_svg_(self) -> Optional[str]:
        return self.svg


@dataclass
class Logs:
    """Output of a code run: the stdout and stderr chunks, in order."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)

    @property
    def stdout_text(self) -> str:
        """All of stdout as one string."""
        return "".join(self.stdout)

    @property
    def stderr_text(self) -> str:
        """All of stderr as one string."""
        return "".join(self.stderr)


@dataclass
class ExecutionError:
    """A Python exception raised by the code (``run_code`` returns it in
    ``Execution.error`` rather than raising)."""

    name: str
    value: str
    traceback: str


@dataclass
class Execution:
    """The outcome of :meth:`Sandbox.run_code` (E2B's ``Execution``)."""

    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    timed_out: bool = False
    duration_ms: float = 0.0

    @property
    def text(self) -> Optional[str]:
        """The ``text/plain`` of the main result (the last expression)."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @property
    def main_result(self) -> Optional[Result]:
        """The value of the last expression, if it had one."""
        for r in self.results:
            if r.is_main_result:
                return r
        return None

    def __iter__(self) -> Iterator[Result]:
        return iter(self.results)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], logs: Optional[Logs] = None) -> "Execution":
        if logs is None:
            logs = Logs()
            if d.get("stdout"):
                logs.stdout.append(d["stdout"])
            if d.get("stderr"):
                logs.stderr.append(d["stderr"])
        results = [Result(x) for x in (d.get("display") or []) if x]
        if d.get("result"):
            results.append(Result(d["result"], is_main_result=True))
        err = d.get("error")
        return cls(
            results=results,
            logs=logs,
            error=ExecutionError(err.get("name", ""), err.get("value", ""), err.get("traceback", "")) if err else None,
            timed_out=bool(d.get("timed_out")),
            duration_ms=float(d.get("duration_us") or 0) / 1000.0,
        )


@dataclass
class VersionInfo:
    """The daemon's versions (``GET /v1/version``)."""

    version: str
    go_version: str
    vmm: str
    vmm_version: str
    accel: str
    data_dir: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "VersionInfo":
        return cls(
            version=d.get("version", ""),
            go_version=d.get("go_version", ""),
            vmm=d.get("vmm", ""),
            vmm_version=d.get("vmm_version", ""),
            accel=d.get("accel", ""),
            data_dir=d.get("data_dir", ""),
            raw=dict(d),
        )


@dataclass
class OperationInfo:
    """A long operation the daemon owns (``GET /v1/operations/{id}``): an
    image build, a snapshot create or compact, a background branch.

    ``state`` is ``running``, ``succeeded`` (``result`` holds what it made),
    ``failed`` or ``cancelled`` (``error`` is the problem). The work goes on
    whatever the client does; ``client.operations.cancel(id)`` stops it.
    """

    id: str
    kind: str
    target: str
    state: str
    created: Optional[_dt.datetime]
    progress: List[str] = field(default_factory=list)
    cancel_requested: bool = False
    done_bytes: int = 0
    total_bytes: int = 0
    result: Optional[Dict[str, Any]] = None
    error: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def done(self) -> bool:
        """Whether the operation has ended (any state but running)."""
        return self.state not in ("running", "")

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "OperationInfo":
        return cls(
            id=d.get("id", ""),
            kind=d.get("kind", ""),
            target=d.get("target", ""),
            state=d.get("state", ""),
            created=parse_time(d.get("created")),
            progress=list(d.get("progress") or []),
            cancel_requested=bool(d.get("cancel_requested")),
            done_bytes=int(d.get("done_bytes") or 0),
            total_bytes=int(d.get("total_bytes") or 0),
            result=d.get("result"),
            error=d.get("error"),
            raw=dict(d),
        )
