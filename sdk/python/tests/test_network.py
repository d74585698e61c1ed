"""Sandbox networking and ports: policies on fork, snapshot create and
set_network, get_network, get_port and get_host.

The offline tests (a fake daemon in this process) check what the SDK
sends and how it reads the answers. The live ones (``live`` in their
names, skipped without FORKD_TEST_TAG) run against the test daemon, which
gives sandboxes no network (FORKD_NETWORK=none): they round-trip policies
and reach a server inside a sandbox through the daemon's port proxy; no
sandbox sends traffic anywhere.

Giving a live sandbox an allow-list links it to the daemon's host
namespace (an uplink, nftables rules, IPv4 forwarding turned on there),
so that test runs only with FORKD_TEST_NETWORK_UPLINK=1, against a daemon
whose --network-host-netns is a namespace made for it.
"""

from __future__ import annotations

import http.server
import json
import os
import socketserver
import tempfile
import threading
import time
import urllib.parse
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

import forkd
from forkd import Client, NetworkPolicy, NetworkStats, PortInfo, Sandbox, SandboxNetwork

SB = {
    "id": "sb-net1",
    "tag": "base",
    "state": "running",
    "created": "2026-01-02T03:04:05Z",
    "ready_ms": 1.5,
    "pooled": False,
    "network": {"policy": {"mode": "none"}},
}

NET = {
    "policy": {"mode": "allow", "allow": ["198.51.100.0/24", "*.example.com"]},
    "stats": {
        "tx_bytes": 10,
        "rx_bytes": 20,
        "tx_packets": 1,
        "rx_packets": 2,
        "denied_packets": 3,
        "spoofed_packets": 4,
    },
}


# -- a fake daemon -------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a: Any) -> None:
        pass

    def address_string(self) -> str:
        return "fake"

    def _route(self) -> None:
        srv: Any = self.server
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        path = self.path.split("?")[0]
        srv.requests.append((self.command, path, json.loads(body) if body else None, dict(self.headers)))
        fn = srv.routes.get((self.command, path))
        if fn is None:
            self.send_json(404, {"title": "Not Found", "status": 404, "detail": "no route %s" % path, "code": "not_found"})
            return
        fn(self)

    do_GET = do_POST = do_PUT = do_DELETE = _route

    def send_json(self, status: int, obj: Any, ctype: str = "") -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype or ("application/problem+json" if status >= 400 else "application/json"))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _TCPServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


Routes = Dict[Tuple[str, str], Callable[[_Handler], None]]


def _serve(srv: Any, routes: Routes) -> Any:
    srv.routes = routes
    srv.requests = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _json_route(obj: Any, status: int = 200) -> Callable[[_Handler], None]:
    return lambda h: h.send_json(status, obj)


def _fork_route(h: _Handler) -> None:
    req = h.server.requests[-1][2]  # type: ignore[attr-defined]
    out = []
    for i in range(req.get("count", 1)):
        sb = dict(SB, id="sb-net%d" % (i + 1))
        if req.get("network"):
            sb["network"] = {"policy": req["network"]}
        out.append(sb)
    h.send_json(200, {"sandboxes": out, "total_ms": 3.0})


def _snapshot_route(h: _Handler) -> None:
    lines = [{"message": "booting"}, {"snapshot": {"tag": "t1", "id": "s1", "state": "ready"}}]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    h.send_response(200)
    h.send_header("Content-Type", "application/x-ndjson")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def _put_network_route(h: _Handler) -> None:
    req = h.server.requests[-1][2]  # type: ignore[attr-defined]
    h.send_json(200, {"policy": req, "stats": NET["stats"]})


def _routes(port_host: str = "") -> Routes:
    port: Dict[str, Any] = {"port": 8080, "path": "/v1/sandboxes/sb-net1/ports/8080/"}
    if port_host:
        port["host"] = port_host
    return {
        ("POST", "/v1/sandboxes"): _fork_route,
        ("POST", "/v1/snapshots"): _snapshot_route,
        ("GET", "/v1/sandboxes/sb-net1"): _json_route(SB),
        ("GET", "/v1/sandboxes/sb-net1/network"): _json_route(NET),
        ("PUT", "/v1/sandboxes/sb-net1/network"): _put_network_route,
        ("GET", "/v1/sandboxes/sb-net1/ports/8080"): _json_route(port),
    }


@pytest.fixture
def unix_daemon() -> Iterator[Tuple[Any, Client]]:
    d = tempfile.mkdtemp(prefix="forkd-net-")
    path = os.path.join(d, "forkd.sock")
    srv = _serve(_UnixServer(path, _Handler), _routes())
    c = Client(socket=path, retries=0)
    yield srv, c
    c.close()
    srv.shutdown()
    srv.server_close()
    os.unlink(path)
    os.rmdir(d)


def _tcp_daemon(port_host: str = "") -> Tuple[Any, Client]:
    srv = _serve(_TCPServer(("127.0.0.1", 0), _Handler), _routes(port_host))
    return srv, Client("http://127.0.0.1:%d" % srv.server_address[1], token="tok", retries=0)


# -- policies, offline -----------------------------------------------------------


@pytest.mark.parametrize(
    "value, want",
    [
        ("none", {"mode": "none"}),
        ("public", {"mode": "public"}),
        (" allow: 198.51.100.0/24 , *.example.com ,", {"mode": "allow", "allow": ["198.51.100.0/24", "*.example.com"]}),
        ("allow", {"mode": "allow"}),
        (True, {"mode": "public"}),
        (False, {"mode": "none"}),
        ({"mode": "none"}, {"mode": "none"}),
        ({"mode": "allow", "allow": ["203.0.113.7:443/tcp"]}, {"mode": "allow", "allow": ["203.0.113.7:443/tcp"]}),
        ({"allow": ["example.com"]}, {"mode": "allow", "allow": ["example.com"]}),
        (["198.51.100.0/24"], {"mode": "allow", "allow": ["198.51.100.0/24"]}),
        (("example.com",), {"mode": "allow", "allow": ["example.com"]}),
        (NetworkPolicy.none(), {"mode": "none"}),
        (NetworkPolicy.public(), {"mode": "public"}),
        (NetworkPolicy.allow_only(iter(["a.example"])), {"mode": "allow", "allow": ["a.example"]}),
        (NetworkPolicy("allow", ["x.example"]), {"mode": "allow", "allow": ["x.example"]}),
        ({"mode": "public", "max_connections": 100, "rate_mbit": 50}, {"mode": "public", "max_connections": 100, "rate_mbit": 50}),
        (NetworkPolicy("public", max_connections=3), {"mode": "public", "max_connections": 3}),
    ],
)
def test_policy_forms(value: Any, want: Dict[str, Any]) -> None:
    p = NetworkPolicy.parse(value)
    assert p.to_json() == want
    assert NetworkPolicy.parse(p) == p
    if not (p.max_connections or p.rate_mbit):  # the CLI's string form carries no caps
        assert NetworkPolicy.parse(str(p)) == p


@pytest.mark.parametrize(
    "value, msg",
    [
        ("open", "want 'none', 'public' or 'allow:"),
        ("", "want 'none'"),
        ({"mode": "internet"}, "network mode 'internet'"),
        ({"mode": "none", "allow": ["198.51.100.0/24"]}, "takes no allow list"),
        ({"mode": "allow", "allow": "198.51.100.0/24"}, "not a string"),
        ({"mode": "allow", "deny": ["x"]}, "unknown keys ['deny']"),
        ({}, "network mode ''"),
        (NetworkPolicy("public", ["x"]), "takes no allow list"),
        (["ok.example", ""], "non-empty string"),
        (42, "want a NetworkPolicy"),
        ({"mode": "public", "rate_mbit": -1}, "rate_mbit -1"),
        ({"mode": "public", "max_connections": "10"}, "max_connections '10'"),
    ],
)
def test_policy_errors(value: Any, msg: str) -> None:
    with pytest.raises(forkd.InvalidArgument) as ei:
        NetworkPolicy.parse(value)
    assert msg in str(ei.value)


def test_models_from_json() -> None:
    n = SandboxNetwork.from_json(NET)
    assert n.policy == NetworkPolicy("allow", ["198.51.100.0/24", "*.example.com"])
    assert n.mode == "allow" and n.allow == ["198.51.100.0/24", "*.example.com"]
    assert n.stats == NetworkStats(10, 20, 1, 2, 3, 4)
    assert SandboxNetwork.from_json({"policy": {"mode": "none"}}).stats is None
    assert SandboxNetwork.from_json(None).policy.mode == ""  # an answer of null
    info = forkd.SandboxInfo.from_json(SB)
    assert info.network is not None and info.network.policy == NetworkPolicy.none()
    assert forkd.SandboxInfo.from_json(dict(SB, network=None)).network is None
    p = PortInfo.from_json({"port": 80, "path": "/v1/sandboxes/x/ports/80/"})
    assert (p.port, p.path, p.host) == (80, "/v1/sandboxes/x/ports/80/", None)


# -- requests, offline -------------------------------------------------------------


def test_fork_and_create_send_network(unix_daemon: Tuple[Any, Client]) -> None:
    srv, c = unix_daemon
    sb = Sandbox.create("base", client=c, network="none")
    assert srv.requests[-1][2] == {"tag": "base", "count": 1, "timeout_s": 300, "network": {"mode": "none"}}
    assert sb._info is not None and sb._info.network is not None and sb._info.network.policy.mode == "none"

    sbs = Sandbox.fork("base", 2, client=c, network={"mode": "allow", "allow": ["198.51.100.0/24"]})
    assert len(sbs) == 2
    assert srv.requests[-1][2]["network"] == {"mode": "allow", "allow": ["198.51.100.0/24"]}

    c.sandboxes.create("base", network=NetworkPolicy.public())
    assert srv.requests[-1][2]["network"] == {"mode": "public"}

    c.sandboxes.fork("base", 1)
    assert "network" not in srv.requests[-1][2]  # inherit: the snapshot's, else the daemon's

    n = len(srv.requests)
    with pytest.raises(forkd.InvalidArgument):
        Sandbox.create("base", client=c, network="internet")
    with pytest.raises(forkd.InvalidArgument):
        c.sandboxes.fork("base", 3, network={"mode": "none", "allow": ["x"]})
    assert len(srv.requests) == n, "a bad policy reached the daemon"


def test_snapshot_create_sends_network(unix_daemon: Tuple[Any, Client]) -> None:
    srv, c = unix_daemon
    progress: List[str] = []
    snap = c.snapshots.create("t1", recipe="minimal", network="allow:203.0.113.0/24", on_progress=progress.append)
    assert snap.tag == "t1" and progress == ["booting"]
    assert srv.requests[-1][2] == {"tag": "t1", "recipe": "minimal", "network": {"mode": "allow", "allow": ["203.0.113.0/24"]}}
    c.snapshots.create("t1", recipe="minimal")
    assert "network" not in srv.requests[-1][2]
    n = len(srv.requests)
    with pytest.raises(forkd.InvalidArgument):
        c.snapshots.create("t1", recipe="minimal", network=7)  # type: ignore[arg-type]
    assert len(srv.requests) == n


def test_get_and_set_network(unix_daemon: Tuple[Any, Client]) -> None:
    srv, c = unix_daemon
    sb = Sandbox("sb-net1", client=c)
    n = sb.get_network()
    assert n.policy.mode == "allow" and n.stats is not None and n.stats.denied_packets == 3
    assert sb.network.policy == n.policy
    assert srv.requests[-1][:2] == ("GET", "/v1/sandboxes/sb-net1/network")

    got = sb.set_network(["198.51.100.0/24"])
    assert srv.requests[-1][:3] == ("PUT", "/v1/sandboxes/sb-net1/network", {"mode": "allow", "allow": ["198.51.100.0/24"]})
    assert got.policy == NetworkPolicy.allow_only(["198.51.100.0/24"])
    got = sb.set_network("none")
    assert srv.requests[-1][2] == {"mode": "none"} and got.policy.mode == "none"

    n0 = len(srv.requests)
    with pytest.raises(forkd.InvalidArgument):
        sb.set_network({"mode": "public", "allow": ["x"]})
    assert len(srv.requests) == n0


def test_get_host_unix(unix_daemon: Tuple[Any, Client]) -> None:
    srv, c = unix_daemon
    sb = Sandbox("sb-net1", client=c)
    p = sb.get_port(8080)
    assert (p.port, p.path, p.host) == (8080, "/v1/sandboxes/sb-net1/ports/8080/", None)
    # Only reachable through the socket: the Go client's and the CLI's form.
    assert sb.get_host(8080) == "http://forkd/v1/sandboxes/sb-net1/ports/8080/"
    n = len(srv.requests)
    for bad in (0, 65536, -1, "8080", 80.0, True, None):
        with pytest.raises(forkd.InvalidArgument):
            sb.get_host(bad)  # type: ignore[arg-type]
    assert len(srv.requests) == n
    with pytest.raises(forkd.NotFound):
        sb.get_host(9090)  # the fake knows no such port: its 404 is raised


def test_get_host_tcp() -> None:
    srv, c = _tcp_daemon()
    try:
        sb = Sandbox("sb-net1", client=c)
        assert sb.get_host(8080) == "http://127.0.0.1:%d/v1/sandboxes/sb-net1/ports/8080/" % srv.server_address[1]
        assert srv.requests[-1][3].get("Authorization") == "Bearer tok"
    finally:
        c.close()
        srv.shutdown()
        srv.server_close()


def test_get_host_domain() -> None:
    srv, c = _tcp_daemon(port_host="8080-sb-net1.sandbox.example")
    try:
        sb = Sandbox("sb-net1", client=c)
        # As E2B's getHost: the host alone, no scheme.
        assert sb.get_host(8080) == "8080-sb-net1.sandbox.example"
        assert sb.get_port(8080).host == "8080-sb-net1.sandbox.example"
    finally:
        c.close()
        srv.shutdown()
        srv.server_close()


# -- live ----------------------------------------------------------------------------


def test_live_fork_with_network_none(client: Client, test_tag: str) -> None:
    sbs = Sandbox.fork(test_tag, 2, client=client, network=NetworkPolicy.none(), metadata={"suite": "sdk-python"})
    try:
        for sb in sbs:
            n = sb.get_network()
            assert n.policy == NetworkPolicy.none(), n
            assert n.stats is not None and n.stats.tx_packets == 0
            info = sb.info()
            assert info.network is not None and info.network.policy.mode == "none"
    finally:
        client.sandboxes.kill([sb.id for sb in sbs])


def test_live_set_network_round_trip(client: Client, test_tag: str) -> None:
    with Sandbox.create(test_tag, client=client, network="none", metadata={"suite": "sdk-python"}) as sb:
        assert sb.network.policy.mode == "none"
        # none again changes nothing (and links nothing).
        assert sb.set_network({"mode": "none"}).policy == NetworkPolicy.none()
        # The daemon checks an allow-list before it changes anything: a
        # private range needs --network-allow-reserved.
        with pytest.raises(forkd.InvalidArgument) as ei:
            sb.set_network("allow:10.0.0.0/8")
        assert "reserved" in str(ei.value)
        with pytest.raises(forkd.InvalidArgument):
            sb.set_network({"mode": "allow", "allow": ["not an address"]})
        assert sb.get_network().policy.mode == "none"
    with pytest.raises(forkd.NotFound):
        sb.get_network()


@pytest.mark.skipif(
    os.environ.get("FORKD_TEST_NETWORK_UPLINK") != "1",
    reason="FORKD_TEST_NETWORK_UPLINK=1 is unset: an allow-list links the sandbox to the daemon's host namespace "
    "(uplink, nftables rules, IPv4 forwarding); run it against a daemon with its own --network-host-netns",
)
def test_live_set_network_allow_list(client: Client, test_tag: str) -> None:
    with Sandbox.create(test_tag, client=client, network="none", metadata={"suite": "sdk-python"}) as sb:
        allow = ["198.51.100.0/24", "203.0.113.7:443/tcp"]
        got = sb.set_network({"mode": "allow", "allow": allow})
        assert got.policy == NetworkPolicy("allow", allow)
        assert sb.get_network().policy == NetworkPolicy("allow", allow)
        assert sb.info().network is not None and sb.info().network.policy.allow == allow  # type: ignore[union-attr]
        assert sb.set_network("none").policy.mode == "none"
        assert sb.get_network().policy == NetworkPolicy.none()


def test_live_get_host_and_proxy(client: Client, py_tag: str) -> None:
    with Sandbox.create(py_tag, client=client, network="none", metadata={"suite": "sdk-python"}) as sb:
        sb.files.make_dir("/tmp/www")
        sb.files.write("/tmp/www/hello.txt", "hello through the proxy\n")
        srv = sb.commands.run(
            ["python3", "-m", "http.server", "8765", "--bind", "0.0.0.0", "--directory", "/tmp/www"],
            background=True,
            check=False,
        )
        try:
            host = sb.get_host(8765)
            info = sb.get_port(8765)
            assert info.port == 8765 and info.path == "/v1/sandboxes/%s/ports/8765/" % sb.id
            if info.host:
                assert host == info.host
            else:
                assert host == "http://forkd" + info.path  # the test daemon is on its socket
            path = urllib.parse.urlsplit("http://forkd" + info.path).path + "hello.txt"
            # The server may not listen yet: the proxy answers 503 until it does.
            deadline = time.monotonic() + 60
            while True:
                try:
                    body = client._transport.request("GET", path, what="GET %s" % path).read()
                    break
                except forkd.Unavailable:
                    if time.monotonic() > deadline or not srv.is_running():
                        raise
                    time.sleep(0.1)
            assert body == b"hello through the proxy\n"
            with pytest.raises(forkd.Unavailable):
                client._transport.request("GET", "/v1/sandboxes/%s/ports/8766/" % sb.id).read()
        finally:
            srv.kill()
