"""Client of the policy server: vLLM's ``/v1/completions`` with a prompt of token ids.

The same client talks to ``vllm serve`` and to ``forge serve-policy``: it asks for the
sampled token ids (``return_token_ids``) and their logprobs (``logprobs``, tokens as
``token_id:ID``), and reads the policy version where the server reports one (Forge's
server does; for vLLM it is the version set with ``forge_policy_version``). ``stream``
asks for the same completion as server-sent events (``stream: true``, which vLLM and
``forge serve-policy`` both answer) and yields it as it is sampled. Blocking:
the addon calls it from a worker thread, never on mitmproxy's event loop.

A vision policy's prompt comes with its images (``images``: hash and raw bytes, in the
order of their tokens in the prompt), sent as ``forge_images``, which ``forge
serve-policy`` reads; vLLM's completions take no images with a token prompt.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


class PolicyError(RuntimeError):
    """The policy server failed or answered out of shape; ``status`` is what the harness
    is told (429 keeps its ``retry_after``, so SDKs back off and retry)."""

    def __init__(self, message: str, status: int = 502, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


@dataclass(frozen=True)
class PolicyOutput:
    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str
    policy_version: int | None
    prompt_ids: list[int] | None  # as the server echoed them


def parse_completion(body: Any) -> PolicyOutput:
    """A ``/v1/completions`` response (vLLM's shape) as token ids and logprobs."""
    try:
        choice = body["choices"][0]
        ids = choice["token_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise TypeError("token_ids is not a list of ints")
        logprobs = None
        if isinstance(choice.get("logprobs"), dict):
            values = choice["logprobs"].get("token_logprobs")
            if isinstance(values, list) and len(values) == len(ids):
                logprobs = [float(v) for v in values]
        finish = choice.get("finish_reason")
        version = body.get("policy_version")
        prompt = choice.get("prompt_token_ids")
        return PolicyOutput(
            token_ids=ids,
            logprobs=logprobs,
            finish_reason=finish if isinstance(finish, str) else "stop",
            policy_version=version if isinstance(version, int) else None,
            prompt_ids=prompt if isinstance(prompt, list) else None,
        )
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise PolicyError(f"the policy server's completion is out of shape: {e}") from e


class PolicyClient:
    def __init__(
        self, base_url: str, timeout_s: float = 600.0, policy_version: int | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.policy_version = policy_version
        self._model: str | None = None
        self._max_model_len: int | None = None
        self._lock = threading.Lock()

    def _open(
        self, method: str, path: str, body: dict[str, Any] | None, accept: str = "application/json"
    ) -> Any:
        """The policy server's response to one request (an open HTTP response); its
        errors as PolicyError."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"content-type": "application/json", "accept": accept},
        )
        try:
            return urllib.request.urlopen(request, timeout=self.timeout_s)
        except urllib.error.HTTPError as e:
            detail = e.read()[:2000].decode("utf-8", "replace")
            status = 429 if e.code == 429 else (400 if e.code == 400 else 502)
            raise PolicyError(
                f"the policy server answered {e.code} to {path}: {detail}",
                status,
                e.headers.get("retry-after"),
            ) from e
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise PolicyError(f"the policy server at {self.base_url} failed: {e}", 503) from e

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        with self._open(method, path, body) as response:
            try:
                return json.loads(response.read() or b"null")
            except (OSError, ValueError) as e:
                raise PolicyError(f"the policy server at {self.base_url} failed: {e}", 503) from e

    def model(self) -> tuple[str, int | None]:
        """(served model id, max_model_len) from ``/v1/models``, asked once."""
        with self._lock:
            if self._model is None:
                data = self._call("GET", "/v1/models")
                try:
                    card = data["data"][0]
                    self._model = str(card["id"])
                except (KeyError, IndexError, TypeError) as e:
                    raise PolicyError("the policy server's /v1/models lists no model") from e
                limit = card.get("max_model_len")
                self._max_model_len = limit if isinstance(limit, int) else None
            return self._model, self._max_model_len

    def _request(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        temperature: float | None,
        top_p: float | None,
        images: list[tuple[str, bytes]] | None = None,
    ) -> dict[str, Any]:
        model, _ = self.model()
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if temperature is not None:
            body["temperature"] = temperature
        if top_p is not None:
            body["top_p"] = top_p
        if images:
            body["forge_images"] = [
                {"hash": h, "data": base64.b64encode(data).decode("ascii")} for h, data in images
            ]
        return body

    def complete(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        temperature: float | None,
        top_p: float | None,
        images: list[tuple[str, bytes]] | None = None,
    ) -> PolicyOutput:
        body = self._request(prompt_ids, max_tokens, temperature, top_p, images)
        out = parse_completion(self._call("POST", "/v1/completions", body))
        if out.policy_version is None and self.policy_version is not None:
            out = PolicyOutput(
                out.token_ids, out.logprobs, out.finish_reason, self.policy_version, out.prompt_ids
            )
        return out

    def stream(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        temperature: float | None,
        top_p: float | None,
        images: list[tuple[str, bytes]] | None = None,
    ) -> Iterator[PolicyOutput]:
        """The completion as it is sampled: one ``PolicyOutput`` per event, holding the
        new token ids (and their logprobs); the last has the finish reason. Raises
        PolicyError before the first when the server refuses, and mid-stream when the
        stream breaks or ends before its finish reason."""
        body = self._request(prompt_ids, max_tokens, temperature, top_p, images)
        body["stream"] = True
        response = self._open("POST", "/v1/completions", body, accept="text/event-stream")
        return self._events(response)

    def _events(self, response: Any) -> Iterator[PolicyOutput]:
        finished = False
        try:
            for line in response:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                try:
                    event = json.loads(data)
                except ValueError as e:
                    raise PolicyError(f"the policy server's stream is not JSON: {e}") from e
                if not isinstance(event, dict):
                    raise PolicyError("the policy server's stream holds a non-object event")
                if "error" in event:
                    raise PolicyError(f"the policy server's stream failed: {event['error']}")
                if not event.get("choices"):
                    continue  # the usage chunk
                out = parse_completion(event)
                finished = event["choices"][0].get("finish_reason") is not None
                if out.policy_version is None and self.policy_version is not None:
                    out = PolicyOutput(
                        out.token_ids,
                        out.logprobs,
                        out.finish_reason,
                        self.policy_version,
                        out.prompt_ids,
                    )
                yield out
        except OSError as e:
            raise PolicyError(f"the policy server's stream broke: {e}", 503) from e
        finally:
            response.close()
        if not finished:
            raise PolicyError("the policy server's stream ended before its finish reason")
