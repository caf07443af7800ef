"""A vision policy served and trained: screenshots reach the tiny Qwen3-VL as pixels over
their own image tokens, turn after turn token-exact, and the trainer sees exactly what
the policy saw (its logprobs are the sampling logprobs) and moves the vision tower."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from mitm_addon.serve.handler import Server, TokenRecord
from mitm_addon.serve.vision import image_runs
from pipeline.images import image_hash
from rl.batches import Sample, collate
from rl.trainer import TrainSettings, is_vision, load_policy, token_logprobs, train
from rl.vision_inputs import Pixels, SampleImages, VisionInputError, vision_tokens_of
from tests.support.policy import policy_server


def png(width: int, height: int, color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    image = Image.new("RGB", (width, height), color)
    for x in range(0, width, 97):  # something for the vision tower to see
        image.putpixel((x, (x * 7) % height), (255, 255, 255))
    image.save(buf, "PNG")
    return buf.getvalue()


SHOTS = [png(1920, 1080, (20 * k, 90, 200 - 20 * k)) for k in range(4)]


def _image_part(data: bytes) -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def chat_call(
    server: Server, call_id: str, messages: list[Any]
) -> tuple[dict[str, Any], TokenRecord]:
    body = {"model": "gui", "max_tokens": 12, "messages": messages, "temperature": 1.0}
    answer = server.answer(call_id, "POST", "/v1/chat/completions", json.dumps(body).encode())
    assert answer.status == 200, answer.body
    assert answer.tokens is not None
    return json.loads(answer.body), answer.tokens


@pytest.fixture(scope="module")
def served_gui_turns(tiny_vl_model: Path) -> dict[str, Any]:
    """Four turns of a GUI agent's conversation (a screenshot after each action), served
    by the tiny VL policy; what the engine was given on each call."""
    given: list[tuple[list[int], list[bytes]]] = []
    with policy_server(tiny_vl_model) as policy:
        engine = policy.service.engine  # type: ignore[attr-defined]
        generate = engine.generate

        def recording(prompt_ids: list[int], params: Any, images: Any = None) -> Any:
            given.append((list(prompt_ids), list(images or [])))
            return generate(prompt_ids, params, images)

        engine.generate = recording
        server = Server(policy.base_url, tiny_vl_model)  # type: ignore[attr-defined]
        messages: list[Any] = [
            {"role": "system", "content": "You operate a browser."},
            {"role": "user", "content": [{"type": "text", "text": "Sign up."},
                                         _image_part(SHOTS[0])]},
        ]  # fmt: skip
        records = []
        for k in range(4):
            reply, tokens = chat_call(server, f"c{k}", messages)
            records.append(tokens)
            messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
            if k < 3:
                messages.append({"role": "user", "content": [
                    {"type": "text", "text": f"Step {k + 1}."}, _image_part(SHOTS[k + 1])]})  # fmt: skip
    return {"records": records, "given": given, "tokens": server.renderer.vision_tokens}


def test_gui_turns_are_one_clean_chain_with_each_screenshot_as_its_tokens(
    served_gui_turns: dict[str, Any],
) -> None:
    records: list[TokenRecord] = served_gui_turns["records"]
    given = served_gui_turns["given"]
    tokens = served_gui_turns["tokens"]
    assert [r.drift for r in records] == ["CLEAN"] * 4
    assert [r.prompt_parent_call_id for r in records] == [None, "c0", "c1", "c2"]
    # Each prompt is the last one's prompt + completion + the new turn, token for token,
    # and shows every screenshot so far: 60 pads each, the engine given their bytes.
    whole: list[int] = []
    for k, (r, (prompt, images)) in enumerate(zip(records, given, strict=True)):
        whole = whole + r.prompt_ids if k else list(r.prompt_ids)
        assert prompt == whole
        assert image_runs(prompt, tokens) == [60] * (k + 1)
        assert images == SHOTS[: k + 1]
        assert not set(r.completion_ids) & {tokens.start, tokens.end, tokens.pad}
        whole = whole + r.completion_ids


def _sample(records: list[TokenRecord], advantage: float, sample_id: str = "s") -> Sample:
    """The chain as the pipeline merges it: prompt, completion, delta, completion, ..."""
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for r in records:
        ids += r.prompt_ids + r.completion_ids
        mask += [0] * len(r.prompt_ids) + [1] * len(r.completion_ids)
        assert r.completion_logprobs is not None
        logprobs += [0.0] * len(r.prompt_ids) + r.completion_logprobs
    return Sample(
        sample_id, "g", tuple(ids), tuple(mask), tuple(logprobs), advantage, 0,
        images=tuple(image_hash(s) for s in SHOTS[: len(records)]),
    )  # fmt: skip


def _images(model_dir: Path, model: Any) -> SampleImages:
    return SampleImages(
        Pixels(model_dir), {image_hash(s): s for s in SHOTS}, vision_tokens_of(model.config)
    )


def test_each_image_is_processed_once_however_often_it_is_shown(tiny_vl_model: Path) -> None:
    pixels = Pixels(tiny_vl_model)
    first, grid = pixels.one(SHOTS[0])
    again, _ = pixels.one(bytes(bytearray(SHOTS[0])))  # the same content, a new object
    assert again is first and grid.tolist() == [1, 12, 20]
    assert pixels.one(SHOTS[1])[0] is not first


def test_the_trainer_sees_what_the_policy_saw(
    served_gui_turns: dict[str, Any], tiny_vl_model: Path
) -> None:
    model = load_policy(tiny_vl_model).eval()
    assert is_vision(model)
    sample = _sample(served_gui_turns["records"], 1.0)
    batch = collate([sample], 0, _images(tiny_vl_model, model))
    assert batch.vision is not None and batch.vision["image_grid_thw"].tolist() == [[1, 12, 20]] * 4
    with torch.no_grad():
        recomputed = token_logprobs(model, batch)[0]
    mask = batch.loss_mask[0] > 0
    served = torch.tensor(sample.old_logprobs)[mask]
    assert int(mask.sum()) == sum(len(r.completion_ids) for r in served_gui_turns["records"])
    assert torch.allclose(recomputed[mask], served, atol=1e-4)
    # Without its images (or with another screenshot) the sample's logprobs differ.
    swapped = _images(tiny_vl_model, model)
    swapped.images = {h: SHOTS[(i + 1) % 4] for i, h in enumerate(sample.images)}
    with torch.no_grad():
        other = token_logprobs(model, collate([sample], 0, swapped))[0]
    assert not torch.allclose(other[mask], served, atol=1e-4)
    with pytest.raises(VisionInputError, match="holds 4 runs of image pads for 3 images"):
        collate([Sample(**{**sample.__dict__, "images": sample.images[:3]})], 0, swapped)


@pytest.mark.parametrize("sft", [False, True], ids=["grpo", "sft"])
def test_one_step_on_image_samples_moves_the_vision_tower(
    served_gui_turns: dict[str, Any], tiny_vl_model: Path, sft: bool
) -> None:
    model = load_policy(tiny_vl_model)
    records = served_gui_turns["records"]
    # A group of two: the same turns rewarded once well, once badly.
    samples = [_sample(records, 1.0, "up"), _sample(records[:2], -1.0, "down")]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    settings = TrainSettings(lr=1e-2, sft=sft, epochs=1, micro_batch_size=2)
    (metrics,) = train(model, samples, settings, images=_images(tiny_vl_model, model))
    key = "loss/sft" if sft else "loss/pg"
    assert metrics[key] != 0.0 and metrics["grad/norm"] > 0
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert any(n.startswith("model.visual.") for n in moved), sorted(moved)[:5]
    assert any(n.startswith("model.language_model.") for n in moved)
    if not sft:  # GRPO's first step: the old logprobs are the served ones
        assert metrics["loss/ppo_kl"] == pytest.approx(0.0, abs=1e-5)
