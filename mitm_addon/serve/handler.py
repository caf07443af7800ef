"""One served call, start to end: request body in, API-shaped reply and token record out.

``Server.answer`` is blocking (it waits for the policy) and gives the reply whole;
``Server.answer_stream`` streams it as the policy samples it (``Streamed``: batches of
API events, and the call's ``TokenRecord`` just before the last). The serve endpoint
runs both on worker threads. Neither raises for bad input: a request it cannot serve
gets the API's error shape with a 4xx status, a failing policy server a 5xx (or 429
with ``Retry-After``); a stream the policy breaks ends with the API's error event.
``Server.answer_local`` answers the provider's other endpoints the harness uses (model
lists, token counting) without the policy.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mitm_addon.protocols import find_adapter
from mitm_addon.serve import completion as completion_mod
from mitm_addon.serve import replies
from mitm_addon.serve.completion import ParsedCompletion
from mitm_addon.serve.conversation import Conversation, ConversionError, from_request
from mitm_addon.serve.policy import PolicyClient, PolicyError, PolicyOutput
from mitm_addon.serve.renderer import Renderer, TemplateError
from mitm_addon.serve.splice import Plan, ServedCall, SpliceStore, plan_prompt
from mitm_addon.serve.vision import image_hashes, image_runs

log = logging.getLogger(__name__)

# Completion length when the request sets none (Chat and Responses may omit it).
DEFAULT_MAX_TOKENS = 4096
# Images a vision policy's server remembers for later calls that name them (by the
# history a Responses call continues): a GUI agent's recent screenshots.
_MAX_IMAGES = 256


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content) if content else ""


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


@dataclass(frozen=True)
class Streamed:
    """A reply streamed as sampled: ``events`` yields lists of (event name, data) as the
    API sends them, and the call's ``TokenRecord`` before the last list. It raises
    PolicyError if the policy's stream breaks (``error_event`` says so to the harness)."""

    api: str
    events: Iterator[list[replies.Event] | TokenRecord]


@dataclass(frozen=True)
class _Call:
    """A call ready for the policy."""

    call_id: str
    api: str
    body: dict[str, Any]
    conv: Conversation
    plan: Plan
    max_tokens: int
    images: list[tuple[str, bytes]] = field(default_factory=list)  # (hash, bytes) in prompt order


def error_event(api: str, message: str) -> replies.Event:
    """The event that ends a stream the policy broke, in the API's shape."""
    if api == "anthropic_messages":
        return ("error", {"type": "error", "error": {"type": "api_error", "message": message}})
    if api == "openai_responses":
        return (
            "error",
            {"type": "error", "code": "server_error", "message": message, "param": None},
        )
    return (
        None,
        {"error": {"message": message, "type": "server_error", "param": None, "code": None}},
    )


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


def _refused(api: str, e: PolicyError) -> Answer:
    """The harness told, in its API's error shape, that the policy server failed."""
    log.warning("forge: policy call failed: %s", e)
    return error_answer(api, e.status, str(e), e.retry_after)


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
        self.parser_name = completion_mod.parser_for_template(self.renderer.template)
        self.parser = completion_mod.PARSERS[self.parser_name]
        self.opened = self.renderer.opens_reasoning
        self.client = PolicyClient(policy_url, policy_version=policy_version)
        self.store = SpliceStore()
        self.models = models
        self.max_tokens_cap = max_tokens_cap
        # A vision policy's images by hash, for calls that show them again (bounded).
        self._images: OrderedDict[str, bytes] = OrderedDict()
        self._images_lock = threading.Lock()

    def serves(self, model: str | None) -> bool:
        """Does the policy answer calls naming this model (``forge_serve_models``)?"""
        return serves_model(self.models, model)

    # -- model calls ---------------------------------------------------------------------

    def answer(self, call_id: str, method: str, path: str, raw: bytes) -> Answer:
        """The reply whole (a stream's events all at once)."""
        call = self._prepare(call_id, method, path, raw)
        return call if isinstance(call, Answer) else self._whole(call)

    def answer_stream(self, call_id: str, method: str, path: str, raw: bytes) -> Answer | Streamed:
        """The reply as the policy samples it, where the harness asked for a stream;
        else (and for a request it cannot serve, or a policy that refuses) an Answer."""
        call = self._prepare(call_id, method, path, raw)
        if isinstance(call, Answer):
            return call
        if self._is_prewarm(call):
            return Streamed(call.api, iter([self._prewarm(call)]))
        if not call.conv.stream:
            return self._whole(call)
        try:
            outs = self.client.stream(
                call.plan.prompt_ids,
                call.max_tokens,
                call.conv.temperature,
                call.conv.top_p,
                images=call.images,
            )
        except PolicyError as e:
            return _refused(call.api, e)
        return Streamed(call.api, self._stream(call, outs))

    @staticmethod
    def _is_prewarm(call: _Call) -> bool:
        return call.api == "openai_responses" and call.body.get("generate") is False

    def _prewarm(self, call: _Call) -> list[replies.Event]:
        """Codex's ``generate: false`` warm-up: answered without sampling, its input kept
        for a later ``previous_response_id``."""
        head = self._reply(call, ParsedCompletion("", None), 0)
        self.store.add_history(f"resp_{call.call_id}", call.conv.messages[call.conv.instructions :])
        return replies.prewarm_events(head, call.body)

    def _whole(self, call: _Call) -> Answer:
        if self._is_prewarm(call):
            events = self._prewarm(call)
            if call.conv.stream:
                return Answer(200, "text/event-stream", replies.encode_sse(events))
            return Answer(200, "application/json", json.dumps(events[-1][1]["response"]).encode())
        try:
            return self._complete(call)
        except PolicyError as e:
            return _refused(call.api, e)

    def _prepare(self, call_id: str, method: str, path: str, raw: bytes) -> _Call | Answer:
        adapter = find_adapter(method, path)
        api = adapter.api if adapter is not None else "openai_chat"
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ConversionError("the request body is not a JSON object")
            previous = body.get("previous_response_id")
            history = self.store.history(previous) if isinstance(previous, str) else None
            conv = from_request(
                method, path, body, history, images=self.renderer.vision is not None
            )
            plan = plan_prompt(self.store, self.renderer, conv.messages, conv.tools)
            images = self._prompt_images(conv, plan)
            _, max_model_len = self.client.model()
        except (ConversionError, TemplateError, ValueError) as e:
            return error_answer(api, 400, str(e))
        except PolicyError as e:
            return _refused(api, e)
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
        return _Call(call_id, api, body, conv, plan, max_tokens, images)

    def _prompt_images(self, conv: Conversation, plan: Plan) -> list[tuple[str, bytes]]:
        """A vision policy's images, in the order their tokens stand in the prompt: the
        order of their sentinels in the messages (completions hold no image). Raises
        ValueError when the prompt's runs of image pads do not match them one to one."""
        tokens = self.renderer.vision_tokens
        if tokens is None:
            return []
        hashes = [h for m in conv.messages for h in image_hashes(_text(m.get("content")))]
        runs = image_runs(plan.prompt_ids, tokens)
        if len(runs) != len(hashes):
            raise ValueError(
                f"the prompt holds {len(runs)} images' tokens for the {len(hashes)} images "
                "its messages show (a completion holding image tokens?)"
            )
        out = []
        with self._images_lock:
            for h, data in conv.images.items():
                self._images[h] = data
                self._images.move_to_end(h)
            while len(self._images) > _MAX_IMAGES:
                self._images.popitem(last=False)
            for h in hashes:
                found = conv.images.get(h) or self._images.get(h)
                if found is None:
                    raise ValueError(f"image {h} is no longer held by this proxy: send it again")
                out.append((h, found))
        return out

    def _reply(
        self, call: _Call, completion: ParsedCompletion, output_tokens: int
    ) -> replies.Reply:
        return replies.Reply(
            call_id=call.call_id,
            model=call.conv.model or self.client.model()[0],
            completion=completion,
            input_tokens=len(call.plan.prompt_ids),
            output_tokens=output_tokens,
            created=int(time.time()),
            tool_kinds=(
                replies.responses_tool_kinds(call.body.get("tools"))
                if call.api == "openai_responses"
                else {}
            ),
        )

    def _complete(self, call: _Call) -> Answer:
        out = self.client.complete(
            call.plan.prompt_ids,
            call.max_tokens,
            call.conv.temperature,
            call.conv.top_p,
            images=call.images,
        )
        finish = "length" if out.finish_reason == "length" else "stop"
        parsed = self.parser(self.renderer.decode(out.token_ids), finish, self.opened)
        reply = self._reply(call, parsed, len(out.token_ids))
        content_type, data = replies.build(call.api, reply, call.conv.stream, call.body)
        tokens = self._remember(
            call, reply, out.token_ids, out.logprobs, out.finish_reason, out.policy_version
        )
        return Answer(200, content_type, data, tokens=tokens)

    def _stream(
        self, call: _Call, outs: Iterator[PolicyOutput]
    ) -> Iterator[list[replies.Event] | TokenRecord]:
        head = self._reply(call, ParsedCompletion("", None), 0)
        encoder = replies.encoder(call.api, head, call.body)
        reader = completion_mod.STREAMS[self.parser_name](self.opened)
        decoder = self.renderer.decoder()
        logprobs: list[float] | None = []
        finish_reason, version = "stop", None
        yield encoder.start()
        for out in outs:
            if logprobs is not None and out.logprobs is not None:
                logprobs += out.logprobs
            else:
                logprobs = None
            finish_reason, version = out.finish_reason, out.policy_version
            events: list[replies.Event] = []
            for piece in reader.feed(decoder.feed(out.token_ids)):
                events += encoder.piece(piece)
            if events:
                yield events
        finish = "length" if finish_reason == "length" else "stop"
        rest = reader.feed(decoder.finish())
        last, parsed = reader.finish(finish)
        events = []
        for piece in rest + last:
            events += encoder.piece(piece)
        reply = self._reply(call, parsed, len(decoder.ids))
        yield self._remember(call, reply, decoder.ids, logprobs, finish_reason, version)
        yield events + encoder.end(reply)

    def _remember(
        self,
        call: _Call,
        reply: replies.Reply,
        completion_ids: list[int],
        logprobs: list[float] | None,
        finish_reason: str,
        version: int | None,
    ) -> TokenRecord:
        """Keep the served call for the splices of later calls; its token record."""
        plan = call.plan
        self.store.add(
            [*call.conv.messages, replies.reply_message(reply, call.api)],
            call.conv.tools,
            ServedCall(call.call_id, array("i", plan.prompt_ids), array("i", completion_ids)),
            f"resp_{call.call_id}" if call.api == "openai_responses" else None,
            plan.keys,
            call.conv.instructions,
        )
        return TokenRecord(
            policy_version=version,
            drift=plan.drift,
            prompt_ids=plan.stored_ids,
            prompt_parent_call_id=plan.parent_call_id,
            completion_ids=list(completion_ids),
            completion_logprobs=logprobs,
            finish_reason=finish_reason,
            prompt_tokens=len(plan.prompt_ids),
        )

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
            conv = from_request(
                "POST",
                "/v1/messages",
                dict(body, max_tokens=1),
                images=self.renderer.vision is not None,
            )
            count = self.renderer.count(conv.messages, conv.tools)
        except (ConversionError, TemplateError, ValueError, TypeError) as e:
            return error_answer("anthropic_messages", 400, str(e))
        return _json({"input_tokens": count})
