"""What ``busd web`` refuses, over real HTTP to a real bridge in front of a real daemon.

The threats are other programs on the machine and other pages in the
user's browser: a name rebound to 127.0.0.1 (the Host check), a page on
another origin posting an answer with the cookie the browser attaches (the
Origin, Sec-Fetch-Site and Content-Type checks), and the printed URL's
token lying around in history (it buys the cookie once it is opened, and
nothing else). Every refused answer is checked against the daemon: the
permission is still pending there, and the right answer still wins
afterwards. The same attacks from a real page on another origin, in
Chromium, are in ``test_web_browser.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import trio

from busd.daemon.hub import DaemonConfig
from busd.wire import Snapshot, Status
from busd.wire.roles import narrow

from .test_web import (
    DEADLINE,
    Headers,
    Web,
    by_web,
    event_stream,
    pending_permission,
    start_replay,
    web_server,
)
from .test_web import (
    sock_path as sock_path,  # the fixture
)


async def login(web: Web) -> Headers:
    """Open the printed URL as a browser would: the cookie it is given, as a request header."""
    reply = await web.http.get("/", params=web.token)
    assert reply.status == 303, reply.text
    return {"cookie": reply.headers["set-cookie"].partition(";")[0]}


async def waiting_permission(web: Web) -> tuple[str, dict[str, Any]]:
    """Start a replayed run and return its session and the request it waits on."""
    async with event_stream(web) as stream:
        run = await start_replay(web)
        request = await stream.wait_for("the permission request", pending_permission)
    return run["session_id"], request


async def pending_in_daemon(web: Web, session_id: str) -> list[str]:
    """The permission requests the daemon itself holds open in ``session_id``."""
    snapshot = await web.client.request(Snapshot(session_id=session_id))
    return [permission["event"]["request_id"] for permission in snapshot.get("permissions", [])]


def answer(request: dict[str, Any]) -> dict[str, str]:
    allow = next(o for o in request["options"] if o["kind"].startswith("allow"))
    return {"request_id": request["request_id"], "option_id": allow["id"]}


# -- Host ----------------------------------------------------------------------------


async def test_a_host_that_is_not_this_server_is_refused_before_anything_else(
    sock_path: Path,
) -> None:
    async with web_server(sock_path) as web:
        port = web.bridge.port
        cookie = await login(web)
        hosts = [
            f"evil.example:{port}",  # DNS rebinding: the attacker's name, our address
            f"127.0.0.1.nip.io:{port}",
            f"localhost.evil.example:{port}",
            f"127.0.0.1:{port + 1}",
            "127.0.0.1",
            f"127.0.0.1:{port}@evil.example",
            "",
        ]
        for host in hosts:
            requests: list[tuple[str, str, Headers]] = [
                ("GET", f"/?token={web.bridge.token}", {}),
                ("GET", "/", cookie),
                ("GET", "/api/sessions", web.auth),
                ("GET", "/static/app.js", {}),
                ("POST", "/api/cancel", web.page(origin=f"http://{host}")),
            ]
            for method, target, headers in requests:
                reply = await web.http.request(method, target, headers={**headers, "host": host})
                assert reply.status == 421, (host, target, reply.text)
                assert reply.json()["error"] == "bad_host"
                assert "set-cookie" not in reply.headers
        # HTTP/1.0 may leave the Host out: refused too.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(f"GET /?token={web.bridge.token} HTTP/1.0\r\n\r\n".encode())
            head = await stream.receive_some(4096)
        assert head.startswith(b"HTTP/1.1 421 "), head
        # The names of loopback, with the port, in any case.
        for host in (f"localhost:{port}", f"[::1]:{port}", f"LOCALHOST:{port}"):
            reply = await web.http.get("/api/sessions", headers={**web.auth, "host": host})
            assert reply.status == 200, (host, reply.text)


async def test_the_address_it_is_bound_to_is_a_host_too(sock_path: Path) -> None:
    async with web_server(sock_path, host="127.0.0.2") as web:
        assert web.bridge.url.startswith(f"http://127.0.0.2:{web.bridge.port}/?token=")
        cookie = await login(web)  # Host: 127.0.0.2:port
        assert (await web.http.get("/", headers=cookie)).status == 200
        reply = await web.post("/api/cancel", {"run_id": "nope"})  # Origin: its own
        assert (reply.status, reply.json()["error"]) == (404, "unknown_run")


# -- state changes -------------------------------------------------------------------


async def test_an_answer_not_from_the_page_itself_is_refused_and_decides_nothing(
    sock_path: Path,
) -> None:
    async with web_server(sock_path) as web:
        session, request = await waiting_permission(web)
        port = web.bridge.port
        cookie = await login(web)
        # What the browser attaches by itself to a request from another page: the
        # cookie (SameSite=Strict still sends it from 127.0.0.1:other, the same site).
        browser: Headers = {**cookie, "x-busd-token": None}
        refused: list[tuple[Headers, str]] = [
            ({"origin": None}, "bad_origin"),
            ({"origin": "http://evil.example"}, "bad_origin"),
            ({"origin": "null"}, "bad_origin"),
            ({"origin": f"http://127.0.0.1:{port + 1}"}, "bad_origin"),
            ({"origin": f"http://localhost:{port}"}, "bad_origin"),  # not the Host's origin
            ({"origin": f"https://127.0.0.1:{port}"}, "bad_origin"),
            ({"sec-fetch-site": "cross-site"}, "bad_origin"),
            ({"sec-fetch-site": "same-site"}, "bad_origin"),
            ({"content-type": "text/plain"}, "bad_content_type"),
            ({"content-type": "text/plain;charset=UTF-8"}, "bad_content_type"),
            ({"content-type": "application/x-www-form-urlencoded"}, "bad_content_type"),
            ({"content-type": "multipart/form-data; boundary=x"}, "bad_content_type"),
            ({"content-type": None}, "bad_content_type"),
        ]
        for auth in (browser, web.auth):
            for changes, code in refused:
                for path, body in (
                    ("/api/permission", answer(request)),
                    ("/api/cancel", {"run_id": request["run_id"]}),
                ):
                    reply = await web.post(path, body, **auth, **changes)
                    assert (reply.status, reply.json()["error"]) == (403, code), (changes, reply)
        assert await pending_in_daemon(web, session) == [request["request_id"]]
        # The page's own request, with the same cookie, is the one that decides.
        reply = await web.post("/api/permission", answer(request), **browser)
        assert reply.status == 200, reply.text
        assert by_web(reply.json()["decision"]["by"])
        assert await pending_in_daemon(web, session) == []


async def test_a_method_that_is_not_get_needs_the_same_checks(sock_path: Path) -> None:
    async with web_server(sock_path) as web:
        # A CORS preflight never gets a yes: no Access-Control-Allow-* on any answer.
        preflight = await web.http.request(
            "OPTIONS",
            "/api/permission",
            headers={
                "origin": "http://evil.example",
                "access-control-request-method": "POST",
                "access-control-request-headers": "content-type, x-busd-token",
            },
        )
        assert preflight.status == 403
        assert not any(name.startswith("access-control-") for name in preflight.headers)
        for method in ("PUT", "DELETE", "PATCH"):
            reply = await web.http.request(method, "/api/cancel", headers=web.page(origin=None))
            assert (reply.status, reply.json()["error"]) == (403, "bad_origin")
            reply = await web.http.request(method, "/api/cancel", headers=web.page())
            assert reply.status == 405


# -- the token and the cookie --------------------------------------------------------


async def test_the_url_token_is_exchanged_for_a_strict_http_only_cookie(sock_path: Path) -> None:
    async with web_server(sock_path) as web:
        exchange = await web.http.get("/", params=web.token)
        assert exchange.status == 303
        assert exchange.headers["location"] == "/"  # the token leaves the address bar
        assert exchange.headers["cache-control"] == "no-store"
        assert exchange.headers["referrer-policy"] == "no-referrer"
        name, _, rest = exchange.headers["set-cookie"].partition("=")
        value, *attributes = (part.strip() for part in rest.split(";"))
        assert name == f"busd_web_{web.bridge.port}"
        assert value == web.bridge.access.session
        assert value != web.bridge.token  # a session of its own: the token buys it, is not it
        assert sorted(attributes) == ["HttpOnly", "Path=/", "SameSite=Strict"]  # no Expires
        again = await web.http.get("/index.html", params=web.token)
        assert again.headers["set-cookie"] == exchange.headers["set-cookie"]
        cookie: Headers = {"cookie": f"other=1; {name}={value}; theme=dark"}
        page = await web.http.get("/", headers=cookie)
        assert (page.status, page.headers["content-type"]) == (200, "text/html; charset=utf-8")
        sessions = await web.http.get("/api/sessions", headers=cookie)
        assert sessions.json()["read_only"] is False
        async with event_stream(web, headers=cookie) as stream:
            name_, data = await stream.next()
            assert name_ == "snapshot"
            assert data["read_only"] is False
        # A wrong token buys nothing.
        wrong = await web.http.get("/", params={"token": web.bridge.token + "x"})
        assert (wrong.status, wrong.json()["error"]) == (403, "unauthorized")
        assert "set-cookie" not in wrong.headers


async def test_the_url_token_authorizes_nothing_but_the_exchange(sock_path: Path) -> None:
    async with web_server(sock_path) as web:
        session, request = await waiting_permission(web)
        port = web.bridge.port
        await login(web)  # the exchange changes nothing for what comes after
        for path in ("/events", "/api/sessions", "/nope", "/static/../api/sessions"):
            reply = await web.http.get(path, params=web.token)
            assert (reply.status, reply.json()["error"]) == (403, "unauthorized"), path
        reply = await web.http.post(
            f"/api/permission?token={web.bridge.token}",
            body=b'{"request_id": "%s", "allow": true}' % request["request_id"].encode(),
            headers=web.page(x_busd_token=None),
        )
        assert (reply.status, reply.json()["error"]) == (403, "unauthorized")
        # Nor is a cookie anything but the session: not the token, not another port's name.
        for cookie in (
            f"busd_web_{port}={web.bridge.token}",
            f"busd_web_{port + 1}={web.bridge.access.session}",
            f"busd_web={web.bridge.access.session}",
            f"busd_web_{port}={web.bridge.access.session[:-1]}",
        ):
            reply = await web.http.get("/api/sessions", headers={"cookie": cookie})
            assert reply.status == 403, cookie
        assert await pending_in_daemon(web, session) == [request["request_id"]]
        await web.client.cancel_run(request["run_id"])


async def test_data_is_for_this_origin_only(sock_path: Path) -> None:
    async with web_server(sock_path) as web:
        cookie = await login(web)
        for site in ("cross-site", "same-site"):
            for path in ("/events", "/api/sessions"):
                headers = {**cookie, "sec-fetch-site": site}
                reply = await web.http.get(path, headers=headers)
                assert (reply.status, reply.json()["error"]) == (403, "bad_origin"), path
        # The page itself (same-origin) and a typed address (none) get it.
        for site in ("same-origin", "none"):
            reply = await web.http.get("/api/sessions", headers={**cookie, "sec-fetch-site": site})
            assert reply.status == 200
        # A link from anywhere may open the page (the cookie is not sent cross-site anyway).
        link = await web.http.get("/", params=web.token, headers={"sec-fetch-site": "cross-site"})
        assert link.status == 303


# -- what every answer carries -------------------------------------------------------


async def test_every_answer_carries_the_content_security_policy(sock_path: Path) -> None:
    async with web_server(sock_path) as web:
        cookie = await login(web)
        replies = [
            await web.http.get("/", headers=cookie),
            await web.http.get("/", params=web.token),
            await web.http.get("/static/app.js"),
            await web.http.get("/static/app.css"),
            await web.http.get("/api/sessions", headers=cookie),
            await web.http.get("/api/sessions"),
            await web.http.get("/", headers={"host": "evil.example"}),
            await web.post("/api/cancel", {"run_id": "nope"}),
        ]
        for reply in replies:
            csp = dict(
                part.strip().partition(" ")[::2]
                for part in reply.headers["content-security-policy"].split(";")
            )
            assert csp["default-src"] == "'none'"
            assert csp["script-src"] == "'self'"
            assert csp["style-src"] == "'self'"
            assert csp["connect-src"] == "'self'"
            assert csp["frame-ancestors"] == "'none'"
            assert csp["base-uri"] == "'none'"
            assert csp["form-action"] == "'none'"
            assert reply.headers["x-frame-options"] == "DENY"
            assert reply.headers["x-content-type-options"] == "nosniff"
            assert reply.headers["cache-control"] == "no-store"
            assert reply.headers["referrer-policy"] == "no-referrer"
        # The page needs nothing the policy forbids: no inline script, style or handler.
        page = replies[0].text
        assert re.findall(r"<script\b[^>]*>", page) == ['<script src="/static/app.js">']
        assert "<style" not in page
        assert not re.search(r"\s(on\w+|style)=", page)
        script = replies[2].text
        assert 'setAttribute("style"' not in script
        assert "eval(" not in script
        assert "new Function" not in script


# -- read-only and the daemon's own refusals -----------------------------------------


async def test_a_read_only_bridge_refuses_every_answer_itself(sock_path: Path) -> None:
    async with web_server(sock_path, read_only=True) as web:
        session, request = await waiting_permission(web)
        status = await web.client.request(Status())
        assert status["clients_by_role"].get("observer") == 1  # the bridge
        cookie = await login(web)
        sessions = await web.http.get("/api/sessions", headers=cookie)
        assert sessions.json()["read_only"] is True
        for path, body in (
            ("/api/permission", answer(request)),
            ("/api/cancel", {"run_id": request["run_id"]}),
        ):
            reply = await web.post(path, body)
            assert (reply.status, reply.json()["error"]) == (403, "read_only")
        assert await pending_in_daemon(web, session) == [request["request_id"]]
        await web.client.cancel_run(request["run_id"])


async def test_a_refusal_by_the_daemon_reaches_the_page_as_403(sock_path: Path) -> None:
    # Frontends may start and cancel, not answer: the bridge asks, the daemon says no.
    grants = narrow({"frontend": ["start_run", "cancel_run"]})
    async with web_server(sock_path, config=DaemonConfig(grants=grants)) as web:
        session, request = await waiting_permission(web)
        with trio.fail_after(DEADLINE):
            reply = await web.post("/api/permission", answer(request))
        assert (reply.status, reply.json()["error"]) == (403, "forbidden")
        assert reply.json()["message"]
        assert await pending_in_daemon(web, session) == [request["request_id"]]
        reply = await web.post("/api/cancel", {"run_id": request["run_id"]})
        assert reply.status == 200, reply.text
