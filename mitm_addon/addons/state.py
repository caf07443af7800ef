"""What Forge's addons share: one ``Shared`` per proxy (the parsed options, the writer,
the rollout ids that proxy credentials name), and one ``FlowState`` per flow, the typed
record each hook leaves for the next (``flow.metadata["forge"]``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from mitmproxy import http

from mitm_addon.capture import Capture
from mitm_addon.config import Config
from mitm_addon.ids import new_id
from mitm_addon.tee import Tee
from mitm_addon.writer import Writer

NO_FORGE_DIR = "forge_dir is not set: add --set forge_dir=DIR"


class Shared:
    """The state the addons of one proxy share; each field has one writer."""

    def __init__(self) -> None:
        self.config: Config | None = None  # Settings, from the forge_* options
        self.config_error: str | None = NO_FORGE_DIR  # Settings
        self.writer: Writer | None = None  # Recording, while it records
        self.run_id = new_id("run-")
        # Routing: connection id -> the rollout its proxy credentials name.
        self.conn_rollout: dict[str, str] = {}
        # Routing: connections whose proxy credentials held forge_proxy_password.
        self.authorized: set[str] = set()

    def not_recording(self) -> str | None:
        """Why no call can be recorded now (None: calls are recorded)."""
        if self.config_error:
            return self.config_error
        return "not started" if self.writer is None else None


class Route(enum.Enum):
    """What Forge does with a request to an LLM host (decided by Routing)."""

    MODEL = "model"  # a model call: recorded, passed to its provider
    SERVED = "served"  # serve mode: a model call the policy answers, recorded
    LOCAL = "local"  # serve mode: a provider endpoint answered here (models, token counts)
    ENDPOINT = "endpoint"  # any other endpoint of an LLM host: passed on and counted
    WEBSOCKET = "websocket"  # the Responses API over a WebSocket: each call recorded


@dataclass(slots=True)
class WsCall:
    """The Responses call in progress on one WebSocket."""

    capture: Capture
    messages: list[str] = field(default_factory=list)


@dataclass(slots=True)
class FlowState:
    """What the hooks know of one flow to an LLM host."""

    host: str  # the host the client asked for, lower-cased
    route: Route
    client_path: str  # the path the client sent (before a reroute adds a prefix)
    client_fields: tuple[tuple[bytes, bytes], ...]  # its headers as sent, proxy auth removed
    streamed: bool = False  # a model call whose body is teed upstream as it arrives
    upstream_url: str | None = None  # the base URL it was rerouted to (forge_upstream)
    # Recording: the redacted path and the query's secret values (worked out once).
    path: str | None = None
    query_secrets: list[str] = field(default_factory=list)
    # Recording: (the request headers as stored, the secrets to scrub from the bodies).
    headers: tuple[dict[str, str], list[str]] | None = None
    capture: Capture | None = None  # the call being recorded (its BEGIN frame written)
    request_tee: Tee | None = None
    response_tee: Tee | None = None
    ws_call: WsCall | None = None

    KEY = "forge"

    @classmethod
    def of(cls, flow: http.HTTPFlow) -> FlowState | None:
        """The flow's state, if Routing took it (an LLM host's flow)."""
        state: FlowState | None = flow.metadata.get(cls.KEY)
        return state

    def attach(self, flow: http.HTTPFlow) -> FlowState:
        flow.metadata[self.KEY] = self
        return self
