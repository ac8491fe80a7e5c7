"""Browser-facing guards: who may call the API from a web page, and the headers every response carries.

A server on 127.0.0.1 without an API key is still reachable from any web page the user opens:
the browser sends ``fetch("http://127.0.0.1:8000/v1/completions", {method: "POST", mode: "no-cors",
body: ...})`` without asking (a "simple" request: ``text/plain`` body, no preflight). Three checks
close that, as local development servers such as Jupyter do:

- **Host** (DNS rebinding: ``evil.example`` re-resolved to 127.0.0.1 makes the attacker's page
  same-origin with us): the ``Host`` header must name a loopback address or one of
  ``allowed_hosts``. ``suffixspec serve --host 0.0.0.0`` allows any Host unless ``--allowed-hosts``.
- **Origin** on POST/PUT/PATCH/DELETE: a browser names the page that sent the request; it must be
  this server's own page (same host and port as ``Host``) or one of ``allowed_origins``. Clients
  outside a browser (curl, the openai package) send no Origin and pass.
- **Content-Type**: a request body must be ``application/json``, which a page on another origin
  cannot send without a CORS preflight (that this server never grants).

Worked example: a page on ``http://evil.example`` posting ``text/plain`` to ``127.0.0.1:8000`` gets
403 (its Origin is not ours) before anything runs; the same request from ``curl`` without
``Content-Type: application/json`` gets 415 with the header to add.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from flask import Flask, Response, request

from suffixspec.server.config import ServerConfig
from suffixspec.server.errors import APIError

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})

# The web page is static files from this server: scripts and styles from files only (no inline code),
# connections only back to this server, never framed (clickjacking).
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": CSP,
                    "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"}


def split_host(value: str) -> tuple[str, str]:
    """``"127.0.0.1:8000"`` -> ``("127.0.0.1", "8000")``; ``"[::1]:80"`` -> ``("::1", "80")``; lowercased."""
    value = value.strip().lower()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        return host, rest.removeprefix(":")
    host, sep, port = value.rpartition(":")
    if not sep or ":" in host:  # no port, or a bare IPv6 address
        return value, ""
    return host, port


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_allowed(host_header: str, allowed: list[str] | None) -> bool:
    """Whether a ``Host`` header names this server: loopback, or in ``allowed`` (``"*"`` = any)."""
    host, _ = split_host(host_header)
    if allowed and "*" in allowed:
        return True
    if is_loopback(host):
        return True
    return bool(allowed) and host in {split_host(a)[0] for a in allowed}


def origin_allowed(origin: str, host_header: str, allowed: list[str] | None) -> bool:
    """Whether a browser ``Origin`` may send unsafe requests: the page's own origin, or listed."""
    if allowed and ("*" in allowed or origin.rstrip("/") in {a.rstrip("/") for a in allowed}):
        return True
    if origin == "null":  # sandboxed frames, file:// pages
        return False
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    port = str(parts.port or (443 if parts.scheme == "https" else 80))
    host, host_port = split_host(host_header)
    return parts.hostname == host and port == (host_port or "80")


def install(app: Flask, cfg: ServerConfig) -> None:
    """Register the Host/Origin checks (before auth) and the response headers."""

    @app.before_request
    def check_host_and_origin() -> Response | None:
        host = request.headers.get("Host", "")
        if not host_allowed(host, cfg.allowed_hosts):
            return APIError(f"the Host header {host!r} does not name this server; if it is reached under this "
                            "name on purpose (a proxy, a LAN name), start it with --allowed-hosts "
                            f"{split_host(host)[0] or 'NAME'}", 403, code="host_not_allowed").response()
        origin = request.headers.get("Origin")
        if request.method in UNSAFE_METHODS and origin is not None \
                and not origin_allowed(origin, host, cfg.allowed_origins):
            return APIError(f"requests from the web page at {origin!r} are not allowed (cross-site request); "
                            f"to allow that page, start the server with --allowed-origins {origin}", 403,
                            code="origin_not_allowed").response()
        return None

    @app.after_request
    def security_headers(resp: Response) -> Response:
        for k, v in SECURITY_HEADERS.items():
            resp.headers.setdefault(k, v)
        return resp


def require_json_body() -> None:
    """A request body must be sent as ``application/json`` (a cross-site page cannot send that)."""
    if request.method not in UNSAFE_METHODS or request.url_rule is None:
        return
    if not request.content_length and "chunked" not in request.headers.get("Transfer-Encoding", "").lower():
        return
    if request.mimetype != "application/json":
        given = request.headers.get("Content-Type") or "no Content-Type"
        raise APIError(f"the request body must be JSON sent with 'Content-Type: application/json' (got {given}); "
                       "with curl add -H 'Content-Type: application/json'", 415, code="unsupported_media_type")
