"""One served call, start to end: request body in, API-shaped reply and token record out.

``Server.answer`` is blocking (it waits for the policy); the addon runs it on a worker
thread. It never raises for bad input: a request it cannot serve gets the API's error
shape with a 4xx status, a failing policy server a 5xx (or 429 with ``Retry-After``).
``Server.answer_local`` answers the provider's other endpoints the harness uses (model
lists, token counting) without the policy.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mitm_addon.protocols import find_adapter
from mitm_addon.serve import completion as completion_mod
from mitm_addon.serve import replies
from mitm_addon.serve.conversation import Conversation, ConversionError, from_request
from mitm_addon.serve.policy import PolicyClient, PolicyError
from mitm_addon.serve.renderer import Renderer, TemplateError
from mitm_addon.serve.splice import ServedCall, SpliceStore, plan_prompt

log = logging.getLogger(__name__)

# Completion length when the request sets none (Chat and Responses may omit it).
DEFAULT_MAX_TOKENS = 4096


@dataclass(frozen=True)
class TokenRecord:
    """The calls-row token columns of one served call."""

    policy_version: int | None
    drift: str
    prompt_ids: list[int]  # as stored: a delta for CLEAN calls with a parent
    prompt_parent_call_id: str | None
    completion_ids: list[int]
    completion_logprobs: list[float] | None
    finish_reason: str
    prompt_tokens: int  # the whole prompt's length


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    tokens: TokenRecord | None = None

    @property
    def stream(self) -> bool:
        return self.content_type == "text/event-stream"


def error_answer(api: str, status: int, message: str, retry_after: str | None = None) -> Answer:
    """An error in the shape the API's SDK reads."""
    kinds = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error"}
    kind = kinds.get(status, "api_error")
    if api == "anthropic_messages":
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    headers = {"retry-after": retry_after} if retry_after else {}
    return Answer(status, "application/json", json.dumps(body).encode(), headers)


def parse_models(value: str) -> tuple[str, ...]:
    """``forge_serve_models``: ``all`` (empty tuple) or comma-separated names / globs."""
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    return () if names in ((), ("all",)) else names


def serves_model(models: tuple[str, ...], model: str | None) -> bool:
    """Does the policy answer calls naming ``model``, given ``forge_serve_models`` (parsed
    by ``parse_models``: empty for all)?"""
    if not models:
        return True
    return model is not None and any(fnmatch.fnmatchcase(model, p) for p in models)


def answers_locally(method: str, path: str) -> bool:
    """The provider endpoints serve mode answers itself: model lists, token counting."""
    route = path.split("?", 1)[0].rstrip("/")
    return (method == "GET" and route.endswith("/v1/models")) or (
        method == "POST" and route.endswith("/v1/messages/count_tokens")
    )


def _json(value: Any) -> Answer:
    return Answer(200, "application/json", json.dumps(value).encode())


class Server:
    """Serve mode's state: the tokenizer, the policy client, the splice store."""

    def __init__(
        self,
        policy_url: str,
        tokenizer_dir: Path,
        models: tuple[str, ...] = (),
        policy_version: int | None = None,
        max_tokens_cap: int | None = None,
    ) -> None:
        self.renderer = Renderer(tokenizer_dir)
        self.parser = completion_mod.PARSERS[
            completion_mod.parser_for_template(self.renderer.template)
        ]
        self.client = PolicyClient(policy_url, policy_version=policy_version)
        self.store = SpliceStore()
        self.models = models
        self.max_tokens_cap = max_tokens_cap

    def serves(self, model: str | None) -> bool:
        """Does the policy answer calls naming this model (``forge_serve_models``)?"""
        return serves_model(self.models, model)

    # -- model calls ---------------------------------------------------------------------

    def answer(self, call_id: str, method: str, path: str, raw: bytes) -> Answer:
        adapter = find_adapter(method, path)
        api = adapter.api if adapter is not None else "openai_chat"
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ConversionError("the request body is not a JSON object")
            previous = body.get("previous_response_id")
            history = self.store.history(previous) if isinstance(previous, str) else None
            conversation = from_request(method, path, body, history)
            return self._answer(call_id, api, body, conversation)
        except (ConversionError, TemplateError, ValueError) as e:
            return error_answer(api, 400, str(e))
        except PolicyError as e:
            log.warning("forge: policy call failed: %s", e)
            return error_answer(api, e.status, str(e), e.retry_after)

    def _answer(self, call_id: str, api: str, body: dict[str, Any], conv: Conversation) -> Answer:
        plan = plan_prompt(self.store, self.renderer, conv.messages, conv.tools)
        _, max_model_len = self.client.model()
        max_tokens = conv.max_tokens or DEFAULT_MAX_TOKENS
        if self.max_tokens_cap is not None:
            max_tokens = min(max_tokens, self.max_tokens_cap)
        if max_model_len is not None:
            room = max_model_len - len(plan.prompt_ids)
            if room < 1:
                return error_answer(
                    api,
                    400,
                    f"prompt is too long: {len(plan.prompt_ids)} tokens > {max_model_len} maximum",
                )
            max_tokens = min(max_tokens, room)
        out = self.client.complete(plan.prompt_ids, max_tokens, conv.temperature, conv.top_p)
        finish = "length" if out.finish_reason == "length" else "stop"
        parsed = self.parser(self.renderer.decode(out.token_ids), finish)
        reply = replies.Reply(
            call_id=call_id,
            model=conv.model or self.client.model()[0],
            completion=parsed,
            input_tokens=len(plan.prompt_ids),
            output_tokens=len(out.token_ids),
            created=int(time.time()),
        )
        content_type, data = replies.build(api, reply, conv.stream, body)
        response_id = f"resp_{call_id}" if api == "openai_responses" else None
        self.store.add(
            [*conv.messages, replies.reply_message(reply, api)],
            conv.tools,
            ServedCall(call_id, array("i", plan.prompt_ids), array("i", out.token_ids)),
            response_id,
            plan.keys,
        )
        tokens = TokenRecord(
            policy_version=out.policy_version,
            drift=plan.drift,
            prompt_ids=plan.stored_ids,
            prompt_parent_call_id=plan.parent_call_id,
            completion_ids=out.token_ids,
            completion_logprobs=out.logprobs,
            finish_reason=out.finish_reason,
            prompt_tokens=len(plan.prompt_ids),
        )
        return Answer(200, content_type, data, tokens=tokens)

    # -- the provider's other endpoints -----------------------------------------------------

    def answer_local(self, host: str, method: str, path: str, raw: bytes) -> Answer:
        """Model lists and token counts, answered from the policy; 404 for other paths."""
        route = path.split("?", 1)[0].rstrip("/")
        anthropic = "anthropic" in host
        if not answers_locally(method, path):
            return error_answer(
                "anthropic_messages" if anthropic else "openai_chat",
                404,
                f"{method} {route} is not answered in serve mode",
            )
        if method == "GET" and route.endswith("/v1/models"):
            try:
                names = [m for m in self.models if "*" not in m] or [self.client.model()[0]]
            except PolicyError as e:
                return error_answer(
                    "anthropic_messages" if anthropic else "openai_chat", 503, str(e)
                )
            if anthropic:
                data = [
                    {
                        "type": "model",
                        "id": n,
                        "display_name": n,
                        "created_at": "2025-01-01T00:00:00Z",
                    }
                    for n in names
                ]
                return _json(
                    {"data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]}
                )
            created = int(time.time())
            return _json(
                {
                    "object": "list",
                    "data": [
                        {"id": n, "object": "model", "created": created, "owned_by": "forge"}
                        for n in names
                    ],
                }
            )
        try:  # POST .../v1/messages/count_tokens
            body = json.loads(raw)
            conv = from_request("POST", "/v1/messages", dict(body, max_tokens=1))
            count = self.renderer.count(conv.messages, conv.tools)
        except (ConversionError, TemplateError, ValueError, TypeError) as e:
            return error_answer("anthropic_messages", 400, str(e))
        return _json({"input_tokens": count})
