"""What ``busd web`` checks before a request reaches a route, without I/O.

``busd web`` listens on loopback, where every user's programs can reach it,
and the browser that has its page open also runs other sites' pages. So:

- **Host** (:func:`check_host`): only ``127.0.0.1``, ``localhost`` or
  ``[::1]`` with the port the connection came in on, or the address it came
  in on as written; a name that resolves here (DNS rebinding) is refused
  before anything else is looked at.
- **State changes** (:func:`check_state_change`, every method but GET and
  HEAD): an ``Origin`` that is this server's own, ``Sec-Fetch-Site`` (when
  the browser sends it) ``same-origin``, and ``Content-Type:
  application/json``, which no form and no no-cors fetch can send.
- **Who** (:class:`Access`): the token printed in the URL is worth one thing,
  the exchange of ``/?token=`` for a session cookie (HttpOnly,
  SameSite=Strict); from then on the cookie authorizes, or an
  ``X-Busd-Token`` header for scripts.

Every refusal is a :class:`Refused`: a status, a code and a message for the
JSON body.
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import parse_qs

__all__ = [
    "SECURITY_HEADERS",
    "Access",
    "Refused",
    "allowed_hosts",
    "check_fetch_site",
    "check_host",
    "check_state_change",
    "header_values",
]

COOKIE = "busd_web"
"""The session cookie's name, then ``_<port>``: cookies ignore ports, two bridges must not."""

SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        b"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
]
"""On every response: nothing from elsewhere, no framing, no sniffing, no caching."""

_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


class Refused(Exception):
    """A request answered with ``status`` and ``{"ok": false, "error": code, "message"}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def header_values(scope: dict[str, Any], name: bytes) -> list[str]:
    """Every value of header ``name`` (lowercase) in an ASGI scope."""
    return [value.decode("latin-1") for key, value in scope["headers"] if key == name]


def _one(scope: dict[str, Any], name: bytes) -> str | None:
    values = header_values(scope, name)
    return values[0] if len(values) == 1 else None


def allowed_hosts(server: tuple[str, int] | None) -> frozenset[str]:
    """The ``Host`` values a request on a connection to ``server`` may carry (lowercase).

    The loopback names with the server's port, and the address the
    connection came in on when it is another one (``127.0.0.2``, a LAN
    address): an address as written cannot be rebound to another host, a
    name can.
    """
    if server is None:
        return frozenset()
    address, port = server
    names = {*_LOOPBACK_NAMES, f"[{address}]" if ":" in address else address}
    hosts = {f"{name}:{port}".lower() for name in names}
    if port == 80:  # the default port may go unsaid
        hosts |= {name.lower() for name in names}
    return frozenset(hosts)


def check_host(scope: dict[str, Any]) -> str:
    """The request's ``Host`` (lowercase) if it names this server; :class:`Refused` (421) if not."""
    host = _one(scope, b"host")
    server = scope.get("server")
    if host is not None and host.lower() in allowed_hosts(server):
        return host.lower()
    port = server[1] if server else "PORT"
    raise Refused(
        421,
        "bad_host",
        f"Host {host!r} is not this server: use http://127.0.0.1:{port}/ "
        f"(or localhost:{port}, [::1]:{port})",
    )


def check_state_change(scope: dict[str, Any], host: str) -> None:
    """Refuse (403) a request that changes something unless this server's own page could send it.

    ``Origin`` must be ``http://`` and the request's own (checked) ``host``;
    ``Sec-Fetch-Site``, when present, ``same-origin``; the body
    ``application/json``: a type that needs a CORS preflight, which this
    server never grants, so no simple cross-site request gets this far.
    """
    origin = _one(scope, b"origin")
    if origin is None or origin.lower() != f"http://{host}":
        raise Refused(
            403,
            "bad_origin",
            f"Origin {origin!r} is not this server's (http://{host}): "
            "answer from the page busd web serves",
        )
    check_fetch_site(scope, "same-origin")
    content_type = _one(scope, b"content-type")
    media_type = (content_type or "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise Refused(
            403,
            "bad_content_type",
            f"Content-Type {content_type!r}: send application/json",
        )


def check_fetch_site(scope: dict[str, Any], *allowed: str) -> None:
    """Refuse (403) a request whose ``Sec-Fetch-Site`` is present and not one of ``allowed``."""
    values = header_values(scope, b"sec-fetch-site")
    if values and (len(values) > 1 or values[0].lower() not in allowed):
        raise Refused(
            403,
            "bad_origin",
            f"Sec-Fetch-Site {', '.join(values)!r}: only {' or '.join(allowed)} requests here",
        )


class Access:
    """The printed token, the session secret it is exchanged for, and who holds either.

    The session is random, not derived from the token: the URL's token only
    ever buys the cookie, and the cookie never appears in a URL.
    """

    def __init__(self, token: str, session: str | None = None) -> None:
        self.token = token
        self.session = session or secrets.token_urlsafe(32)

    @staticmethod
    def cookie_name(scope: dict[str, Any]) -> str:
        server = scope.get("server")
        return f"{COOKIE}_{server[1]}" if server else COOKIE

    def authorized(self, scope: dict[str, Any]) -> bool:
        """A valid session cookie or ``X-Busd-Token`` header (never a query parameter)."""
        for given in header_values(scope, b"x-busd-token"):
            if _same(given, self.token):
                return True
        name = self.cookie_name(scope)
        for header in header_values(scope, b"cookie"):
            for pair in header.split(";"):
                key, _, value = pair.strip().partition("=")
                if key == name and _same(value, self.session):
                    return True
        return False

    @staticmethod
    def query_token(scope: dict[str, Any]) -> str | None:
        query = parse_qs(scope["query_string"].decode("latin-1"))
        tokens: list[str] = query.get("token", [])
        return tokens[0] if tokens else None

    def exchanges(self, scope: dict[str, Any]) -> bool:
        """Whether the query carries the right token (raises if it carries a wrong one)."""
        given = self.query_token(scope)
        if given is None:
            return False
        if not _same(given, self.token):
            raise Refused(403, "unauthorized", "wrong token: open the URL busd web printed")
        return True

    def set_cookie(self, scope: dict[str, Any]) -> bytes:
        """The ``Set-Cookie`` value: for this server's pages only, never sent cross-site."""
        name = self.cookie_name(scope)
        return f"{name}={self.session}; HttpOnly; SameSite=Strict; Path=/".encode()


def _same(given: str, expected: str) -> bool:
    return secrets.compare_digest(given.encode(), expected.encode())
