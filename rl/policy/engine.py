"""Token-in, token-out generation with transformers, one request at a time.

``Engine.generate`` samples a completion for a prompt given as token ids (``Engine.stream``
yields it token by token) and records,
for each sampled token, its logprob under the model's raw distribution
(``log_softmax(logits)``, before temperature and top-p: the quantity a trainer
recomputes, and what vLLM returns by default). ``logprobs_of`` is that recomputation:
one forward pass over prompt + completion.

A vision-language model (a folder with ``preprocessor_config.json``: Qwen3-VL) takes the
prompt's images with it: their pixels enter the prefill, each over its run of image
pads, with the model's 3-D rotary positions; decoding goes on from the prompt's position
offset. It never samples a vision token (the image pads and their delimiters), whose
place in a later prompt would stand for an image that does not exist; their logprobs
stay those of the raw distribution.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mitm_addon.serve.vision import VisionTokens
from rl.window import attention_reach, visible_suffix


class EngineError(ValueError):
    """A request the engine cannot run; the message says why (HTTP 400)."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    top_logprobs: int = 0


@dataclass(frozen=True)
class Step:
    """One sampled token; ``finish_reason`` is set on the last."""

    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]]
    finish_reason: str | None = None
    stop_reason: int | None = None


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # stop (end of turn or a stop token) or length
    stop_reason: int | None  # the stop token that ended it, when not an end-of-turn token
    policy_version: int
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)


def logprobs_of(model: Any, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    """Logprobs of ``completion_ids`` after ``prompt_ids``, by one forward pass.

    Returns a float32 tensor of shape (len(completion_ids),).
    """
    # A sliding-window model's logits do not depend on what lies beyond its reach.
    prompt_ids = visible_suffix(prompt_ids, attention_reach(getattr(model, "config", None)))
    ids = torch.tensor([prompt_ids + completion_ids], dtype=torch.long)  # (1, T)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()  # (T, V)
    start = len(prompt_ids) - 1
    scores = torch.log_softmax(logits[start : start + len(completion_ids)], dim=-1)  # (C, V)
    return scores.gather(1, torch.tensor(completion_ids).unsqueeze(1)).squeeze(1)  # (C,)


def _filter(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p applied to one row of logits (V,)."""
    scaled = logits / params.temperature
    if params.top_k > 0:
        kth = torch.topk(scaled, min(params.top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(scaled, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        drop = cumulative - torch.softmax(ordered, dim=-1) > params.top_p  # keep the first over
        scaled = scaled.scatter(0, order, ordered.masked_fill(drop, float("-inf")))
    return scaled


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token drawn from ``probs`` (V,) by inverting its cumulative sum.

    ``torch.multinomial`` took 20 ms per token over Qwen3's 152k vocabulary on CPU; this
    takes well under one. A token of probability 0 is never drawn.
    """
    cdf = probs.cumsum(dim=0)
    u = torch.rand((), generator=generator, dtype=cdf.dtype) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u, right=True)), probs.numel() - 1)


class Engine:
    """A causal LM on CPU (or one GPU) in float32, with a version number for its weights."""

    def __init__(self, model_dir: Path, device: str = "cpu", version: int = 0) -> None:
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, GenerationConfig

        from rl.tiny_vl_model import is_vision_model
        from rl.vision_inputs import Pixels, vision_tokens_of

        self.model_dir = model_dir
        self.device = torch.device(device)
        self.pixels: Pixels | None = None
        self.vision_tokens: VisionTokens | None = None
        self.suppressed: torch.Tensor | None = None  # vision token ids never sampled
        if is_vision_model(model_dir):
            self.model = AutoModelForImageTextToText.from_pretrained(
                str(model_dir), dtype=torch.float32
            )
            self.pixels = Pixels(model_dir)
            c = self.model.config
            self.vision_tokens = vision_tokens_of(c)
            ids = {c.vision_start_token_id, c.vision_end_token_id, c.image_token_id}
            if getattr(c, "video_token_id", None) is not None:
                ids.add(c.video_token_id)
            self.suppressed = torch.tensor(sorted(ids))
        else:
            self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        # transformers wraps PreTrainedModel.to in functools.wraps, whose stub loses ``self``.
        self.model.to(self.device).eval()  # type: ignore[arg-type]
        eos: Any = None
        try:
            eos = GenerationConfig.from_pretrained(str(model_dir)).eos_token_id
        except OSError:
            eos = self.model.config.eos_token_id
        self.eos_ids = frozenset(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        text = self.model.config.get_text_config()
        self.max_model_len = int(getattr(text, "max_position_embeddings", 4096))
        self.vocab_size = int(text.vocab_size)
        # A sliding-window model runs only the prompt tokens its next logits depend on.
        self.reach = attention_reach(text)
        self.version = version
        self._lock = threading.Lock()  # one generation or weight swap at a time

    def generate(
        self, prompt_ids: list[int], params: SamplingParams, images: list[bytes] | None = None
    ) -> Generation:
        tokens: list[int] = []
        logprobs: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        last: Step | None = None
        for last in self.stream(prompt_ids, params, images):
            tokens.append(last.token_id)
            logprobs.append(last.logprob)
            if params.top_logprobs > 0:
                tops.append(last.top_logprobs)
        assert last is not None and last.finish_reason is not None
        return Generation(
            tokens, logprobs, last.finish_reason, last.stop_reason, self.version, tops
        )

    def stream(
        self, prompt_ids: list[int], params: SamplingParams, images: list[bytes] | None = None
    ) -> Iterator[Step]:
        """The completion token by token (at least one; the last has its finish reason).
        ``images``: a vision model's, one per run of image pads in the prompt, in order.
        The checks run at the call; the engine is held until the iterator is exhausted
        or closed."""
        if not prompt_ids:
            raise EngineError("the prompt is empty")
        if any(not 0 <= t < self.vocab_size for t in prompt_ids):
            raise EngineError(f"prompt token ids must lie in [0, {self.vocab_size})")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise EngineError(
                f"This model's maximum context length is {self.max_model_len} tokens; the "
                f"prompt has {len(prompt_ids)} and max_tokens asks for {params.max_tokens}"
            )
        vision = self._vision_inputs(prompt_ids, images or [])
        return self._locked(prompt_ids, params, vision)

    def _vision_inputs(self, prompt_ids: list[int], images: list[bytes]) -> dict[str, Any]:
        """The prefill's pixel inputs (empty for a text model); checked against the prompt."""
        from rl.vision_inputs import VisionInputError, check_runs

        if self.pixels is None or self.vision_tokens is None:
            if images:
                raise EngineError(f"{self.model_dir} is a text model: it takes no images")
            return {}
        try:
            if not images:
                check_runs(prompt_ids, self.vision_tokens, [])
                return {}
            pixel_values, grid = self.pixels.batch(images)
            check_runs(prompt_ids, self.vision_tokens, [self.pixels.tokens(g) for g in grid])
        except VisionInputError as e:
            raise EngineError(str(e)) from None
        return {"pixel_values": pixel_values.to(self.device), "image_grid_thw": grid}

    def _locked(
        self, prompt_ids: list[int], params: SamplingParams, vision: dict[str, Any]
    ) -> Iterator[Step]:
        with self._lock, torch.no_grad():
            yield from self._sample(prompt_ids, params, vision)

    def _prefill(self, ids: torch.Tensor, vision: dict[str, Any]) -> tuple[Any, Any]:
        """(output, rope deltas) of the prompt's forward pass; deltas None for a text model.
        Logits of the last position only: a harness prompt of 20k tokens would otherwise
        materialise 20k x vocabulary floats (12 GB for Qwen3)."""
        if self.vision_tokens is None:
            return self.model(input_ids=ids, use_cache=True, logits_to_keep=1), None
        from rl.vision_inputs import rope_positions, token_types

        pad = self.vision_tokens.pad
        positions, deltas = rope_positions(self.model, ids, pad, vision.get("image_grid_thw"))
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            mm_token_type_ids=token_types(ids, pad) if vision else None,
            use_cache=True,
            logits_to_keep=1,
            **vision,
        )
        return out, deltas

    def _sample(
        self, prompt_ids: list[int], params: SamplingParams, vision: dict[str, Any]
    ) -> Iterator[Step]:
        generator = torch.Generator(device="cpu")
        if params.seed is not None:
            generator.manual_seed(params.seed)
        else:
            generator.seed()
        visible = visible_suffix(prompt_ids, self.reach)
        ids = torch.tensor([visible], dtype=torch.long, device=self.device)  # (1, T)
        out, deltas = self._prefill(ids, vision)
        past = out.past_key_values
        logits = out.logits[0, -1].float().cpu()  # (V,)
        for n in range(params.max_tokens):
            scores = torch.log_softmax(logits, dim=-1)  # (V,) raw distribution
            if self.suppressed is not None:
                logits = logits.index_fill(0, self.suppressed, float("-inf"))
            if params.temperature <= 0:
                token = int(torch.argmax(logits))
            else:
                token = sample(torch.softmax(_filter(logits, params), dim=-1), generator)
            top: list[tuple[int, float]] = []
            if params.top_logprobs > 0:
                best = torch.topk(scores, params.top_logprobs)
                top = list(zip(best.indices.tolist(), best.values.tolist(), strict=True))
            finish, stop_reason = None, None
            if token in self.eos_ids and not params.ignore_eos:
                finish = "stop"
            elif token in params.stop_token_ids:
                finish, stop_reason = "stop", token
            elif n == params.max_tokens - 1:
                finish = "length"
            yield Step(token, float(scores[token]), top, finish, stop_reason)
            if finish is not None:
                return
            step = torch.tensor([[token]], dtype=torch.long, device=self.device)
            if deltas is None:
                out = self.model(input_ids=step, past_key_values=past, use_cache=True)
            else:  # the next position, offset as the prompt's images left it
                at = (past.get_seq_length() + deltas).view(1, 1, 1).expand(3, 1, 1)
                out = self.model(
                    input_ids=step, position_ids=at.to(self.device), past_key_values=past,
                    use_cache=True,
                )  # fmt: skip
            past = out.past_key_values
            logits = out.logits[0, -1].float().cpu()

    def load_weights(self, path: Path, version: int) -> None:
        """Replace the weights with those saved in ``path`` (same architecture), after the
        generation in progress; raises EngineError when they do not fit."""
        from safetensors.torch import load_file

        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if not files or not all(f.is_file() for f in files):
            raise EngineError(f"no .safetensors weights at {path}")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        with self._lock:
            own = self.model.state_dict()
            missing = [k for k in own if k not in state and not _tied(self.model, k)]
            unknown = [k for k in state if k not in own]
            if missing or unknown:
                raise EngineError(
                    f"weights at {path} do not fit this model (missing {missing[:3]}, "
                    f"unknown {unknown[:3]})"
                )
            for name, tensor in state.items():
                if own[name].shape != tensor.shape:
                    raise EngineError(
                        f"{name}: shape {tuple(tensor.shape)} != {tuple(own[name].shape)}"
                    )
            self.model.load_state_dict(state, strict=False)
            if getattr(self.model.config, "tie_word_embeddings", False):
                self.model.tie_weights()
            self.version = version


def _tied(model: Any, key: str) -> bool:
    return bool(getattr(model.config, "tie_word_embeddings", False)) and key == "lm_head.weight"
