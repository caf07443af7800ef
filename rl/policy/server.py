"""``forge serve-policy``: the subset of vLLM's HTTP API that Forge uses, on transformers.

Routes (vLLM's shapes where vLLM has the route):

* ``GET /health``: 200, empty body.
* ``GET /v1/models``: the served model, with ``max_model_len`` and Forge's
  ``policy_version``.
* ``POST /v1/completions``: ``prompt`` as a list of token ids (or a text);
  ``return_token_ids`` adds ``prompt_token_ids`` and ``token_ids`` to the choice,
  ``logprobs: N`` the OpenAI legacy logprobs object (``tokens`` as ``token_id:ID`` with
  ``return_tokens_as_token_ids``). The response also carries ``policy_version``, the
  version of the weights that produced it. With ``stream: true`` the answer is vLLM's
  event stream, one ``data:`` chunk per sampled token as it is sampled (its
  ``token_ids``, ``logprobs`` and text; ``prompt_token_ids`` on the first, the finish
  reason on the last, ``usage`` after it when ``stream_options.include_usage``), then
  ``data: [DONE]``. A vision policy's prompt comes with ``forge_images`` (Forge's own
  field): ``[{"hash": "i1:...", "data": BASE64}, ...]``, one per run of image pads in
  the prompt, in order.
* Forge's own, for the training loop: ``POST /pause``, ``POST /resume``,
  ``GET /is_paused``, ``POST /load_weights`` (``{"path": DIR, "version": N}``).

Requests are queued and run one at a time, in arrival order: nothing interleaves. While
paused, a new completion waits up to ``pause_wait_s`` for ``/resume`` and is then
answered 429 with ``Retry-After``; completions admitted before the pause finish.
A weight load waits for the queue ahead of it.
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import contextlib
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

from rl.policy.engine import Engine, EngineError, Generation, SamplingParams, Step

log = logging.getLogger(__name__)

_MAX_BODY_BYTES = 64 * 1024 * 1024


def _images(value: Any) -> list[bytes]:
    """The raw images of ``forge_images``, each checked against its hash."""
    from pipeline.images import image_hash

    if value is None:
        return []
    if not isinstance(value, list):
        raise HttpError(400, "forge_images must be a list")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("data"), str):
            raise HttpError(400, f'forge_images[{i}] must be {{"hash": ..., "data": BASE64}}')
        try:
            data = base64.b64decode(item["data"], validate=True)
        except (binascii.Error, ValueError) as e:
            raise HttpError(400, f"forge_images[{i}]: data is not base64 ({e})") from None
        if item.get("hash") is not None and item["hash"] != image_hash(data):
            raise HttpError(400, f"forge_images[{i}]: its data does not have hash {item['hash']}")
        out.append(data)
    return out


class HttpError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


@dataclass
class ServerSettings:
    model_dir: Path
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    device: str = "cpu"
    policy_version: int = 0
    pause_wait_s: float = 30.0  # how long a completion waits for /resume before a 429


class Gate:
    """Pause / resume: admission waits while paused, bounded."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    def pause(self) -> None:
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    def admit(self, wait_s: float) -> bool:
        return self._open.wait(wait_s)


class Worker:
    """One thread runs queued jobs in order (generation, weight loads)."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None]
        self._jobs = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="forge-policy", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((job, future))
        return future

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as e:  # handed to the waiting request thread
                future.set_exception(e)

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(10)


class PolicyService:
    """The routes' logic, apart from HTTP."""

    def __init__(self, settings: ServerSettings) -> None:
        from transformers import AutoTokenizer

        self.settings = settings
        self.engine = Engine(settings.model_dir, settings.device, settings.policy_version)
        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(settings.model_dir))
        self.model_name = settings.served_model_name or str(settings.model_dir)
        self.gate = Gate()
        self.worker = Worker()
        self.created = int(time.time())

    # -- routes ----------------------------------------------------------------------------

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "forge",
                    "root": str(self.settings.model_dir),
                    "parent": None,
                    "max_model_len": self.engine.max_model_len,
                    "policy_version": self.engine.version,
                }
            ],
        }

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt_ids, params, options = self._parse_completion(body)
        self._admit()
        images = options["images"]
        generation = self._run(lambda: self.engine.generate(prompt_ids, params, images))
        return self._completion_body(prompt_ids, generation, options)

    def stream_completions(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The chunks of a streamed completion, each as its token is sampled. Checks run
        before the first is returned (an HttpError then is the whole answer); closing the
        iterator early stops the sampling after the token in progress."""
        prompt_ids, params, options = self._parse_completion(body)
        self._admit()
        images = options["images"]
        steps: queue.Queue[Step | BaseException | None] = queue.Queue()
        stopped = threading.Event()
        version: list[int] = []  # the weights' version, read where loads run (the worker)

        def job() -> None:
            version.append(self.engine.version)
            try:
                for step in self.engine.stream(prompt_ids, params, images):
                    steps.put(step)
                    if stopped.is_set():
                        break
            except BaseException as e:  # handed to the request thread
                steps.put(e)
            steps.put(None)

        self.worker.submit(job)
        first = steps.get()
        if isinstance(first, EngineError):
            raise HttpError(400, str(first))
        return self._chunks(prompt_ids, version[0], first, steps, stopped, options, body)

    def _chunks(
        self,
        prompt_ids: list[int],
        version: int,
        first: Step | BaseException | None,
        steps: queue.Queue[Step | BaseException | None],
        stopped: threading.Event,
        options: dict[str, Any],
        body: dict[str, Any],
    ) -> Iterator[dict[str, Any]]:
        chunk_id, created, version = (
            f"cmpl-{uuid.uuid4().hex}",
            int(time.time()),
            self.engine.version,
        )
        sampled = 0
        item = first
        try:
            while item is not None:
                if isinstance(item, BaseException):
                    raise item
                g = Generation(
                    [item.token_id],
                    [item.logprob],
                    item.finish_reason or "",
                    item.stop_reason,
                    version,
                    [item.top_logprobs] if item.top_logprobs else [],
                )
                choice = self._choice(g, options, prompt_ids if sampled == 0 else None)
                choice["finish_reason"] = item.finish_reason
                sampled += 1
                yield {
                    "id": chunk_id,
                    "object": "text_completion",
                    "created": created,
                    "model": self.model_name,
                    "choices": [choice],
                    "policy_version": version,
                }
                item = steps.get()
        finally:
            stopped.set()
        usage = body.get("stream_options")
        if isinstance(usage, dict) and usage.get("include_usage") is True:
            yield {
                "id": chunk_id,
                "object": "text_completion",
                "created": created,
                "model": self.model_name,
                "choices": [],
                "usage": {
                    "prompt_tokens": len(prompt_ids),
                    "completion_tokens": sampled,
                    "total_tokens": len(prompt_ids) + sampled,
                },
                "policy_version": version,
            }

    def _admit(self) -> None:
        if not self.gate.admit(self.settings.pause_wait_s):
            raise HttpError(
                HTTPStatus.TOO_MANY_REQUESTS,
                "the policy server is paused for a weight update; retry later",
                {"Retry-After": "1"},
            )

    def load_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        path, version = body.get("path"), body.get("version")
        if not isinstance(path, str) or not isinstance(version, int) or isinstance(version, bool):
            raise HttpError(400, 'load_weights takes {"path": DIR, "version": INT}')
        self._run(lambda: self.engine.load_weights(Path(path), version))
        log.info("policy: weights from %s loaded as version %d", path, version)
        return {"policy_version": self.engine.version}

    def pause(self) -> dict[str, Any]:
        self.gate.pause()
        return {"paused": True}

    def resume(self) -> dict[str, Any]:
        self.gate.resume()
        return {"paused": False}

    # -- helpers ---------------------------------------------------------------------------

    def _run(self, job: Callable[[], Any]) -> Any:
        try:
            return self.worker.submit(job).result()
        except EngineError as e:
            raise HttpError(400, str(e)) from e

    def _parse_completion(
        self, body: dict[str, Any]
    ) -> tuple[list[int], SamplingParams, dict[str, Any]]:
        if body.get("n", 1) != 1 or body.get("echo"):
            raise HttpError(400, "only n=1 without echo is supported")
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise HttpError(404, f"The model `{model}` does not exist.")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt = self.tokenizer.encode(prompt, add_special_tokens=False)
        if (
            not isinstance(prompt, list)
            or not prompt
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            raise HttpError(400, "prompt must be a text or a non-empty list of token ids")

        def number(key: str, default: float) -> float:
            value = body.get(key)
            if value is None:
                return default
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise HttpError(400, f"{key} must be a number")
            return float(value)

        max_tokens = body.get("max_tokens")
        max_tokens = 16 if max_tokens is None else max_tokens  # vLLM's default
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise HttpError(400, "max_tokens must be a positive integer")
        logprobs = body.get("logprobs")
        if logprobs is not None and (not isinstance(logprobs, int) or logprobs < 0):
            raise HttpError(400, "logprobs must be a non-negative integer")
        stop_ids = body.get("stop_token_ids") or []
        if not isinstance(stop_ids, list) or not all(isinstance(t, int) for t in stop_ids):
            raise HttpError(400, "stop_token_ids must be a list of token ids")
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise HttpError(400, "seed must be an integer")
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=number("temperature", 1.0),
            top_p=number("top_p", 1.0),
            top_k=int(number("top_k", 0)),
            seed=seed,
            stop_token_ids=tuple(stop_ids),
            ignore_eos=body.get("ignore_eos") is True,
            top_logprobs=logprobs or 0,
        )
        options = {
            "images": _images(body.get("forge_images")),
            "logprobs": logprobs,
            "return_token_ids": body.get("return_token_ids") is True,
            "as_ids": body.get("return_tokens_as_token_ids") is True,
            "skip_special_tokens": body.get("skip_special_tokens", True) is not False,
        }
        return prompt, params, options

    def _token_text(self, token_id: int, as_ids: bool) -> str:
        if as_ids:
            return f"token_id:{token_id}"
        return str(self.tokenizer.decode([token_id], skip_special_tokens=False))

    def _choice(
        self, g: Generation, options: dict[str, Any], prompt_ids: list[int] | None
    ) -> dict[str, Any]:
        """One choice in vLLM's shape; ``prompt_ids`` where the prompt is echoed."""
        text = self.tokenizer.decode(
            g.token_ids, skip_special_tokens=options["skip_special_tokens"]
        )
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": g.finish_reason,
            "stop_reason": g.stop_reason,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if options["return_token_ids"] else None,
            "token_ids": g.token_ids if options["return_token_ids"] else None,
        }
        if options["logprobs"] is not None:
            tokens = [self._token_text(t, options["as_ids"]) for t in g.token_ids]
            offsets, at = [], 0
            for token in tokens:
                offsets.append(at)
                at += 0 if options["as_ids"] else len(token)
            top = [
                {self._token_text(t, options["as_ids"]): lp for t, lp in [*pairs, (tok, lp_tok)]}
                for pairs, tok, lp_tok in zip(
                    g.top_logprobs or [[] for _ in g.token_ids],
                    g.token_ids,
                    g.logprobs,
                    strict=True,
                )
            ]
            choice["logprobs"] = {
                "text_offset": offsets,
                "token_logprobs": g.logprobs,
                "tokens": tokens,
                "top_logprobs": top,
            }
        return choice

    def _completion_body(
        self, prompt_ids: list[int], g: Generation, options: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [self._choice(g, options, prompt_ids)],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(g.token_ids),
                "total_tokens": len(prompt_ids) + len(g.token_ids),
            },
            "policy_version": g.policy_version,
        }


def _handler(service: PolicyService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "forge-policy"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("policy: " + format, *args)

        def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _error(self, e: HttpError) -> None:
            kind = "BadRequestError" if e.status == 400 else HTTPStatus(e.status).phrase
            body = {"error": {"message": str(e), "type": kind, "param": None, "code": e.status}}
            self._send(e.status, body, e.headers)

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("content-length") or 0)
            if length > _MAX_BODY_BYTES:
                raise HttpError(413, "request body too large")
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError as e:
                raise HttpError(400, f"body is not JSON: {e}") from e
            if not isinstance(body, dict):
                raise HttpError(400, "body is not a JSON object")
            return body

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self._send(200, None)
            elif path == "/v1/models":
                self._send(200, service.models())
            elif path == "/is_paused":
                self._send(200, {"paused": service.gate.paused})
            else:
                self._error(HttpError(404, f"no route GET {path}"))

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            routes: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
                "/v1/completions": service.completions,
                "/load_weights": service.load_weights,
                "/pause": lambda _: service.pause(),
                "/resume": lambda _: service.resume(),
            }
            try:
                route = routes.get(path)
                if route is None:
                    raise HttpError(404, f"no route POST {path}")
                body = self._body()
                if path == "/v1/completions" and body.get("stream") is True:
                    self._stream(service.stream_completions(body))
                else:
                    self._send(200, route(body))
            except HttpError as e:
                self._error(e)

        def _stream(self, chunks: Iterator[dict[str, Any]]) -> None:
            """Server-sent events, one HTTP chunk each, written as they come."""
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()

            def write(data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            try:
                for chunk in chunks:
                    write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                write(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client left: sampling stops (close)
            except Exception as e:  # the stream has begun: say so in it, then end it
                log.exception("policy: a streamed completion failed")
                error = {"error": {"message": str(e), "type": type(e).__name__, "code": 500}}
                with contextlib.suppress(OSError):
                    write(b"data: " + json.dumps(error).encode() + b"\n\n")
                    self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()

    return Handler


class PolicyServer:
    """The HTTP server on its own threads; ``start`` returns once it listens."""

    def __init__(self, settings: ServerSettings) -> None:
        self.service = PolicyService(settings)
        self.httpd = ThreadingHTTPServer((settings.host, settings.port), _handler(self.service))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def base_url(self) -> str:
        host = cast(str, self.httpd.server_address[0])  # an AF_INET server's host is a str
        return f"http://{host}:{self.port}"

    def start(self) -> PolicyServer:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="forge-policy-http", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.service.worker.stop()
