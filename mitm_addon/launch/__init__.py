"""Running Forge's proxy: start and stop ``mitmdump -s mitm_addon/forge_addon.py``, give a
harness the proxy and CA-trust variables, capture one transparently, and pass serve mode's
options. The libraries above (``k8s_jobs``, ``rl``) and the ``forge`` command use it;
nothing here imports mitmproxy."""

from __future__ import annotations

from mitm_addon.launch.errors import ForgeError
from mitm_addon.launch.proxy import (
    ADDON,
    DEFAULT_CONFDIR,
    ProxySettings,
    RunningProxy,
    free_port,
    harness_env,
    mitmdump_path,
    start_proxy,
    stop_proxy_process,
)
from mitm_addon.launch.trust import system_ca_file, trust_env

__all__ = [
    "ADDON",
    "DEFAULT_CONFDIR",
    "ForgeError",
    "ProxySettings",
    "RunningProxy",
    "free_port",
    "harness_env",
    "mitmdump_path",
    "start_proxy",
    "stop_proxy_process",
    "system_ca_file",
    "trust_env",
]
