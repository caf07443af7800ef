"""Serve mode's addon options (``forge_mode=serve``, ``forge_policy``, ...) for a policy
server, as ``forge record``, ``forge rollout`` and ``forge loop`` pass them to the proxy."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path

from mitm_addon.launch.errors import ForgeError

__all__ = ["WAIT_S", "serve_options"]

log = logging.getLogger(__name__)

# How long a serve-mode command waits for a policy server that is still starting.
WAIT_S = 60.0


def _models(policy: str, wait_s: float = WAIT_S) -> bytes:
    """The body of the policy server's /v1/models; a server still starting (connection
    refused) is waited for up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            with urllib.request.urlopen(policy.rstrip("/") + "/v1/models", timeout=10) as r:
                return bytes(r.read())
        except urllib.error.URLError as e:
            refused = isinstance(e.reason, ConnectionRefusedError)
            if not refused or time.monotonic() > deadline:
                raise
            if not said:
                log.info("waiting for the policy server at %s", policy)
                said = True
            time.sleep(0.5)


def serve_options(
    policy: str | None,
    tokenizer: Path | None,
    models: str = "all",
    max_tokens: int = 0,
    policy_version: int | None = None,
) -> list[str]:
    """The addon options of serve mode; the tokenizer defaults to the policy's model folder.
    ``policy_version`` is recorded on calls where the server reports none (vLLM)."""
    if not policy:
        raise ForgeError("--mode serve needs --policy URL (e.g. http://127.0.0.1:8000)")
    if tokenizer is None:
        try:
            root = json.loads(_models(policy))["data"][0].get("root")
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            raise ForgeError(f"cannot ask the policy server at {policy} for its model: {e}") from e
        if not isinstance(root, str) or not Path(root).is_dir():
            raise ForgeError(
                "the policy server's model is not a local folder: pass --tokenizer DIR"
            )
        tokenizer = Path(root)
    return [
        "forge_mode=serve",
        f"forge_policy={policy}",
        f"forge_tokenizer={tokenizer.resolve()}",
        f"forge_serve_models={models}",
        f"forge_serve_max_tokens={max_tokens}",
        *([] if policy_version is None else [f"forge_policy_version={policy_version}"]),
    ]
