"""Forge's mitmproxy addons: ``mitmdump -s mitm_addon/forge_addon.py --set forge_dir=DIR``.

Only composition lives here. Each job is an addon of its own, as mitmproxy composes its
built-ins, and mitmproxy calls them in this order on every event:

- ``Settings`` (``addons/settings.py``): the ``forge_*`` options, parsed once per change;
- ``Routing`` (``addons/routing.py``): which hosts are intercepted, what each request to
  an LLM host is (a model call, a served one, another endpoint, a WebSocket), reroutes
  to ``forge_upstream``, rollout ids from proxy credentials;
- ``Recording`` (``addons/recording.py``): every routed call teed and written to the
  write-ahead log, whence ``mitm_addon.builder`` makes Parquet shards;
- ``Serving`` (``addons/serving.py``): serve mode's answers from the policy server.

They share one ``Shared`` (``addons/state.py``); a flow carries one ``FlowState``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # loaded by path through ``mitmdump -s``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mitm_addon.addons.recording import Recording
from mitm_addon.addons.routing import Routing
from mitm_addon.addons.serving import Serving
from mitm_addon.addons.settings import Settings
from mitm_addon.addons.state import Shared


def make_addons() -> list[Settings | Routing | Recording | Serving]:
    """A new set of Forge's addons, in the order mitmproxy must call them."""
    shared = Shared()
    return [Settings(shared), Routing(shared), Recording(shared), Serving(shared)]


addons = make_addons()
