"""Request bodies, paths and answers the sync and asyncio clients share:
each API call is built and parsed here once. No I/O here.

Internal module.
"""

from __future__ import annotations

import json
import re
import secrets
import urllib.parse
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

from .errors import ForkdError, InvalidArgument
from .models import NetworkPolicyLike, PortInfo, _network_body

#: A new sandbox's lifetime in seconds when the caller names none: five
#: minutes, as E2B. Pass ``timeout=0`` for no limit, ``timeout=None`` for
#: the daemon's default, or extend a running one with ``set_timeout``.
DEFAULT_SANDBOX_TIMEOUT = 300.0

#: List endpoints answer a page at a time: the SDK asks for pages this
#: big (the daemon's maximum) and follows at most this many.
LIST_PAGE = 1000
LIST_MAX_PAGES = 10000

BRANCH_MODES = ("diff", "full", "live")

_TAG_UNSAFE = re.compile(r"[^a-z0-9._-]+")


def whole_seconds(v: float, what: str) -> int:
    """A lifetime for the wire: whole seconds, a part of one counting as
    one (0.5 is not "never")."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
        raise InvalidArgument("%s must be a number of seconds >= 0 (0: no limit), not %r" % (what, v))
    if v == float("inf"):
        raise InvalidArgument("%s must be finite; use 0 for no limit" % what)
    n = int(v)
    return n + 1 if n < v else n


def q(segment: str, what: str) -> str:
    """A path segment, refusing empty ones (the daemon would redirect)."""
    if not segment or not isinstance(segment, str):
        raise InvalidArgument("%s must be a non-empty string, not %r" % (what, segment))
    return urllib.parse.quote(segment, safe="")


def sandbox_path(sandbox_id: str) -> str:
    return "/v1/sandboxes/" + q(sandbox_id, "sandbox id")


# When a fork by registry reference pulls (the daemon's default first):
# "if_not_present" forks the copy an earlier fork pulled; "always" pulls
# when the registry's digest for the reference moved.
PULL_POLICIES = ("if_not_present", "always")


def is_reference(tag: str) -> bool:
    """Whether a fork's tag is a registry reference (host[:port]/repository:tag
    or @sha256:...) rather than a local tag: the daemon's rule, a "/"."""
    return "/" in tag


def registry_credentials(username: Optional[str], password: Optional[str]) -> Dict[str, str]:
    """The registry_username/registry_password of a request body, each only
    when given (an empty string is not given). A message never shows the
    password."""
    out: Dict[str, str] = {}
    for key, v in (("registry_username", username), ("registry_password", password)):
        if v is None:
            continue
        if not isinstance(v, str):
            raise InvalidArgument("%s must be a str, not %s" % (key, type(v).__name__))
        if v:
            out[key] = v
    return out


def fork_body(
    tag: str,
    n: int,
    timeout: Optional[float],
    idle_timeout: Optional[float],
    metadata: Optional[Mapping[str, str]],
    network: Optional[NetworkPolicyLike],
    cpus: Optional[float],
    pull_policy: Optional[str] = None,
    registry_username: Optional[str] = None,
    registry_password: Optional[str] = None,
) -> Dict[str, Any]:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InvalidArgument("n must be an int >= 1, not %r" % (n,))
    if pull_policy is not None and pull_policy not in PULL_POLICIES:
        raise InvalidArgument("pull_policy must be one of %s, not %r" % (", ".join(PULL_POLICIES), pull_policy))
    creds = registry_credentials(registry_username, registry_password)
    if creds and not (isinstance(tag, str) and is_reference(tag)):
        raise InvalidArgument(
            "registry_username and registry_password authenticate a fork by registry reference "
            "(host[:port]/repository:tag), and %r is a local tag: drop them, or fork the reference" % (tag,)
        )
    net = _network_body(network)
    body: Dict[str, Any] = {"tag": tag, "count": n}
    if timeout is not None:
        body["timeout_s"] = whole_seconds(timeout, "timeout")
    if idle_timeout:
        body["idle_timeout_s"] = max(1, int(round(idle_timeout)))
    if metadata:
        body["metadata"] = {str(k): str(v) for k, v in metadata.items()}
    if net is not None:
        body["network"] = net
    if cpus is not None:
        body["cpus"] = float(cpus)
    if pull_policy is not None:
        body["pull_policy"] = pull_policy
    body.update(creds)
    return body


def list_query(tag: Optional[str], state: Optional[str], labels: Optional[Mapping[str, str]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    if tag:
        out["tag"] = tag
    if state:
        out["state"] = state
    if labels:
        out["label"] = ["%s=%s" % (k, v) for k, v in labels.items()]
    return out


def set_timeout_body(timeout: float, idle_timeout: Optional[float]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"timeout_s": whole_seconds(timeout, "timeout")}
    if idle_timeout is not None:
        body["idle_timeout_s"] = whole_seconds(idle_timeout, "idle_timeout")
    return body


def kill_ids(sandbox_ids: Iterable[Union[str, Iterable[str]]]) -> List[str]:
    ids: List[str] = []
    for s in sandbox_ids:
        if isinstance(s, str):
            ids.append(s)
        else:
            ids.extend(s)
    return ids


def check_branch_mode(mode: str) -> None:
    if mode not in BRANCH_MODES:
        raise InvalidArgument("branch mode %r: use diff, full or live" % (mode,))


def branch_body(tag: Optional[str], mode: str, wait: bool, source_tag: str) -> Dict[str, Any]:
    """The branch request; a tag of None becomes ``<source>-br-<random>``."""
    check_branch_mode(mode)
    if tag is None:
        base = _TAG_UNSAFE.sub("-", source_tag.lower()).strip("-._")[:40] or "sandbox"
        tag = "%s-br-%s" % (base, secrets.token_hex(4))
    body: Dict[str, Any] = {"tag": tag, "mode": mode}
    if not wait:
        body["no_wait"] = True
    return body


def port_path(sandbox_path: str, port: int) -> str:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidArgument("port %r: want an int from 1 to 65535" % (port,))
    return "%s/ports/%d" % (sandbox_path, port)


def host_for(info: PortInfo, endpoint_kind: str, endpoint_url: str) -> str:
    """E2B's get_host: the routed host, else the proxy URL on the daemon."""
    if info.host:
        return info.host
    base = "http://forkd" if endpoint_kind == "unix" else endpoint_url
    return base + info.path


def snapshot_delete_query(cascade: bool, force: bool) -> Dict[str, str]:
    out: Dict[str, str] = {}
    if cascade:
        out["cascade"] = "true"
    if force:
        out["force"] = "true"
    return out


def file_query(path: str, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    out = dict(extra or {})
    out["path"] = path
    return out


def read_format(fmt: str) -> None:
    if fmt not in ("text", "bytes", "stream"):
        raise InvalidArgument("format %r: use 'text', 'bytes' or 'stream'" % (fmt,))


def decode_text(data: bytes, path: str, sandbox_id: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgument(
            "%s in sandbox %s is not UTF-8 text (%s); read it with format='bytes'" % (path, sandbox_id, e)
        ) from e


class Pager:
    """Follows a list endpoint's ``next_cursor`` page by page (a daemon
    from before paging answers one bare array)::

        p = Pager(path, query)
        while p.query is not None:
            p.feed(get(path, p.query))
        items = p.items
    """

    def __init__(self, path: str, query: Optional[Mapping[str, Any]] = None) -> None:
        self.path = path
        self.query: Optional[Dict[str, Any]] = dict(query or {})
        self.query["limit"] = LIST_PAGE
        self.items: List[Any] = []
        self._cursor = ""
        self._pages = 0

    def feed(self, page: Any) -> None:
        self._pages += 1
        if page is None or isinstance(page, list):
            self.items.extend(page or [])
            self.query = None
            return
        self.items.extend(page.get("items") or [])
        nxt = page.get("next_cursor") or ""
        if not nxt:
            self.query = None
            return
        if nxt == self._cursor:
            raise ForkdError("GET %s: the daemon answered the same next_cursor twice; its paging is broken" % self.path)
        if self._pages >= LIST_MAX_PAGES:
            raise ForkdError("GET %s: more than %d pages; list with filters" % (self.path, LIST_MAX_PAGES))
        assert self.query is not None
        self._cursor = self.query["cursor"] = nxt


def removed_tags(body: bytes, tag: str) -> List[str]:
    """What a snapshot delete removed (a daemon from before the list
    answers 204, with no body)."""
    removed = json.loads(body).get("removed") if body else None
    return list(removed) if removed else [tag]
