"""``forge serve-policy``: the embedded policy server (transformers, CPU or one GPU)."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

from forge_cli.args import port
from mitm_addon.launch import ForgeError

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve-policy",
        help="serve a model token-in/token-out (the subset of vLLM's API Forge uses)",
        description="Serve a Hugging Face model folder over HTTP: /v1/completions with prompts "
        "as token ids, returning token ids and logprobs as vLLM does; /v1/models; /health; and "
        "for the training loop /pause, /resume and /load_weights (new weights with a version "
        "number). Requests run one at a time, in arrival order. A vision-language model "
        "(Qwen3-VL: a folder with preprocessor_config.json) takes a prompt's images as "
        "forge_images, which serve mode sends.",
    )
    p.add_argument("--model", type=Path, required=True, help="model folder")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8000, help="listen port (default 8000)")
    p.add_argument("--served-model-name", default=None, help="model id (default: the folder)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--policy-version", type=int, default=0, help="version of these weights")
    p.add_argument(
        "--pause-wait",
        type=float,
        default=30.0,
        help="seconds a completion waits while paused before a 429 (default 30)",
    )
    p.set_defaults(func=run)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    from rl.policy.server import PolicyServer, ServerSettings

    if not (args.model / "config.json").is_file():
        raise ForgeError(f"{args.model} is not a model folder (no config.json)")
    settings = ServerSettings(
        model_dir=args.model.resolve(),
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        device=args.device,
        policy_version=args.policy_version,
        pause_wait_s=args.pause_wait,
    )
    try:
        server = PolicyServer(settings)
    except OSError as e:
        raise ForgeError(f"cannot listen on {args.host}:{args.port}: {e}") from e
    # SIGTERM ends serve_forever as Ctrl-C does. (httpd.shutdown() cannot be called here:
    # the handler runs on the thread serving, and shutdown waits for that loop to end.)
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"forge: serving {server.service.model_name} on {server.base_url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
        server.service.worker.stop()
    return 0
