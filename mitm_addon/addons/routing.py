"""Where each flow goes: which hosts are intercepted, what a request to an LLM host is
(``Route``), the reroute of a provider to another base URL (``forge_upstream``), and the
rollout id that proxy credentials name.

Hosts outside ``forge_hosts`` are tunnelled untouched (no forged certificate) or answered
404 (``forge_other_hosts``). A request to an LLM host gets a ``FlowState`` here, before the
other addons see it: the recorder opens its record from it, serve mode answers from it.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Any

from mitmproxy import connection, http, tls

from mitm_addon import config as cfg
from mitm_addon.addons.state import FlowState, Route, Shared
from mitm_addon.bodies import BodyError, decode_body
from mitm_addon.protocols import find_adapter, openai_responses
from mitm_addon.protocols.base import Adapter
from mitm_addon.redact import proxy_auth_user, proxy_credentials
from mitm_addon.serve.handler import answers_locally, serves_model

log = logging.getLogger(__name__)

# Distinct Host headers whose parsed host (and forge_hosts verdict) is kept, and likewise
# (method, path) pairs whose adapter is: a proxy sees a handful; the bound only stops a
# client that sends a new one per request from growing them.
_CACHE_SIZE = 1024


class Routing:
    """Decides each flow's ``Route`` and reroutes it to its upstream."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self._hosts: dict[str, tuple[str, bool]] = {}  # Host header -> (host, in forge_hosts)
        self._adapters: dict[tuple[str, str], Adapter | None] = {}  # (method, path) -> adapter

    def configure(self, updated: set[str]) -> None:
        if "forge_hosts" in updated:
            self._hosts.clear()  # verdicts of the old forge_hosts

    # -- connections ---------------------------------------------------------------------

    def http_connect(self, flow: http.HTTPFlow) -> None:
        if not self._authorized(flow):
            return
        user = proxy_auth_user(flow.request.headers.get("proxy-authorization"))
        if user:
            self.shared.conn_rollout[flow.client_conn.id] = user

    def client_disconnected(self, client: connection.Client) -> None:
        self.shared.conn_rollout.pop(client.id, None)
        self.shared.authorized.discard(client.id)

    def _authorized(self, flow: http.HTTPFlow) -> bool:
        """With ``forge_proxy_password``, a connection's first request (its CONNECT, or a
        plain proxy request) must carry proxy credentials with that password, whatever the
        user name (the rollout id); else it is answered 407."""
        config = self.shared.config
        if config is None or config.proxy_password is None:
            return True
        if flow.client_conn.id in self.shared.authorized:
            return True
        credentials = proxy_credentials(flow.request.headers.get("proxy-authorization"))
        if credentials is not None and hmac.compare_digest(
            credentials[1].encode(), config.proxy_password.encode()
        ):
            self.shared.authorized.add(flow.client_conn.id)
            return True
        flow.response = http.Response.make(
            407,
            b"Forge: this proxy needs credentials (http://ROLLOUT:PASSWORD@host:port, the "
            b"password of forge_proxy_password)\n",
            {"proxy-authenticate": 'Basic realm="forge"', "content-type": "text/plain"},
        )
        return False

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        config = self.shared.config
        if config is None:
            return
        # The SNI as mitmproxy already read it from the ClientHello (reading
        # ``data.client_hello.sni`` walks the parsed extensions again).
        host = data.context.client.sni or (data.context.server.address or ("",))[0]
        if not cfg.host_matches(str(host), config.hosts) and config.other_hosts == "pass":
            data.ignore_connection = True

    # -- requests ------------------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        """Route a model call of a known API at its headers, so that its body can be teed
        upstream as it arrives (``FlowState.streamed``).

        Only in record mode, for a body of known size within ``forge_max_body_bytes``; a
        call that needs its body before it is sent (serve mode, an unknown path that may
        be a model call, a chunked or oversized body, a WebSocket) is routed by ``request``.
        """
        if not self._authorized(flow):
            return
        config, request = self.shared.config, flow.request
        if config is None or config.mode != "record" or self.shared.not_recording():
            return
        # What decides it, from mitmproxy's header tuple in one pass: each mitmproxy header
        # lookup decodes and lower-cases every header again.
        length = upgrade = host_header = None
        proxy_auth = False
        for name, value in request.headers.fields:
            key = name.lower()
            if key == b"content-length":
                length = value if length is None else b"x"  # repeated: not a size
            elif key == b"host":
                host_header = value if host_header is None else b""  # repeated: parse it
            elif key == b"upgrade":
                upgrade = value
            elif key == b"proxy-authorization":
                proxy_auth = True
        try:
            size = int(length or b"")
        except ValueError:
            return
        if not 0 < size <= config.max_body_bytes or upgrade is not None:
            return
        host, llm = self._host_of(request, host_header.decode("latin-1") if host_header else None)
        if not llm or not self._adapter(request.method, request.path):
            return
        if proxy_auth:
            self._take_proxy_auth(flow)  # never sent on, never stored
        self._take(flow, host, Route.MODEL, streamed=True)

    def request(self, flow: http.HTTPFlow) -> None:
        if FlowState.of(flow) is not None or not self._authorized(flow):
            return  # routed at its headers, or refused (407)
        config = self.shared.config
        self._take_proxy_auth(flow)
        if config is None:
            return
        host, llm = self._host_of(flow.request, flow.request.host_header)
        if not llm:
            if config.other_hosts == "404":
                flow.response = json_response(
                    404, {"error": f"{host} is not served here (forge_other_hosts=404)"}
                )
            return
        if reason := self.shared.not_recording():
            flow.response = json_response(503, {"error": f"Forge is not recording: {reason}"})
            return
        route = self._route(flow, config)
        if route is not None:
            self._take(flow, host, route)

    def _route(self, flow: http.HTTPFlow, config: cfg.Config) -> Route | None:
        """The route of a request to an LLM host; None when it is refused here."""
        method, path = flow.request.method, flow.request.path
        upgrade = flow.request.headers.get("upgrade", "").lower() == "websocket"
        adapter = self._adapter(method, path)
        if config.mode == "serve":
            if upgrade and (
                config.refuse_websocket
                or config.serve_models
                or not openai_responses.matches_websocket(path)
            ):
                # Codex falls back to HTTP + SSE on a 426. A socket carries many calls,
                # each naming its model: with forge_serve_models set, HTTP routes each.
                flow.response = json_response(
                    426, {"error": "Forge serve mode answers this over HTTP; use SSE"}
                )
                return None
            if upgrade:
                return Route.WEBSOCKET  # answered by serve mode's endpoint (Serving)
            if adapter is not None:
                model = requested_model(flow, config.max_body_bytes)
                if serves_model(config.serve_models, model):
                    return Route.SERVED
                # another model's call: to its provider, recorded
            elif not config.serve_models or answers_locally(method, path):
                return Route.LOCAL
            # else some models still use the provider: so do its other endpoints
        if upgrade and openai_responses.matches_websocket(path):
            if config.refuse_websocket:
                flow.response = json_response(
                    426, {"error": "WebSocket refused by Forge (forge_refuse_websocket); use HTTP"}
                )
                return None
            return Route.WEBSOCKET
        if adapter is not None or looks_like_model_call(flow, config.max_body_bytes):
            return Route.MODEL
        return Route.ENDPOINT

    def _take(self, flow: http.HTTPFlow, host: str, route: Route, streamed: bool = False) -> None:
        """The flow's ``FlowState``, taken before a reroute rewrites its path and Host; then
        the reroute of a call that goes to its provider."""
        state = FlowState(
            host, route, flow.request.path, flow.request.headers.fields, streamed
        ).attach(flow)
        if route in (Route.MODEL, Route.ENDPOINT, Route.WEBSOCKET):
            self._reroute(flow, state)

    def _reroute(self, flow: http.HTTPFlow, state: FlowState) -> None:
        assert self.shared.config is not None
        upstream = self.shared.config.upstreams.get(state.host)
        if upstream is None:
            return
        request = flow.request
        request.scheme = upstream.scheme
        request.host = upstream.host
        request.port = upstream.port
        if upstream.path_prefix:
            request.path = upstream.path_prefix + request.path
        request.headers["host"] = f"{upstream.host}:{upstream.port}"
        state.upstream_url = upstream.base_url

    def _take_proxy_auth(self, flow: http.HTTPFlow) -> None:
        """Remove ``Proxy-Authorization`` (never sent on); its user names the rollout."""
        auth = flow.request.headers.pop("proxy-authorization", None)
        if auth and (user := proxy_auth_user(auth)):
            self.shared.conn_rollout[flow.client_conn.id] = user

    def _host_of(self, request: http.Request, host_header: str | None) -> tuple[str, bool]:
        """(``request.pretty_host`` lower-cased, whether it is one of ``forge_hosts``), by
        Host header: mitmproxy parses and validates the authority on every call otherwise.

        ``host_header`` is the request's Host header as the hooks read it; HTTP/2 and 3 name
        the authority instead, which ``request.host_header`` gives."""
        config = self.shared.config
        assert config is not None
        if request.is_http2 or request.is_http3:
            host_header = request.host_header
        if not host_header or not host_header.isascii():  # the rare case: parse every time
            host = request.pretty_host.lower()
            return host, cfg.host_matches(host, config.hosts)
        known = self._hosts.get(host_header)
        if known is None:
            if len(self._hosts) >= _CACHE_SIZE:
                self._hosts.clear()
            host = request.pretty_host.lower()
            known = self._hosts[host_header] = (host, cfg.host_matches(host, config.hosts))
        return known

    def _adapter(self, method: str, path: str) -> Adapter | None:
        """``find_adapter``, kept by (method, path): a harness calls one or two endpoints."""
        key = (method, path)
        if key not in self._adapters:
            if len(self._adapters) >= _CACHE_SIZE:
                self._adapters.clear()
            self._adapters[key] = find_adapter(method, path)
        return self._adapters[key]


def requested_model(flow: http.HTTPFlow, limit: int) -> str | None:
    """The model a model call names in its JSON body (None when it names none)."""
    body = _json_body(flow, limit)
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


def looks_like_model_call(flow: http.HTTPFlow, limit: int) -> bool:
    """A POST no adapter owns whose JSON body names a model: recorded with a parse_error."""
    if flow.request.method != "POST" or "json" not in flow.request.headers.get("content-type", ""):
        return False
    body = _json_body(flow, limit)
    return (
        isinstance(body, dict)
        and "model" in body
        and any(k in body for k in ("messages", "input", "prompt"))
    )


def _json_body(flow: http.HTTPFlow, limit: int) -> Any:
    """The request's body as JSON (decoded per its content-encoding); None when it is not."""
    try:
        raw = decode_body(
            flow.request.raw_content or b"", flow.request.headers.get("content-encoding"), limit
        )
        return json.loads(raw)
    except (BodyError, ValueError, RecursionError):
        return None


def json_response(status: int, body: dict[str, Any]) -> http.Response:
    return http.Response.make(
        status, json.dumps(body).encode(), {"content-type": "application/json"}
    )
