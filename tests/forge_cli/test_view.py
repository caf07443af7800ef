"""``forge view`` without a browser: the page from data (escaping, tree layout, what each
call shows), conversations split against the parent, and the command's files and errors."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from forge_cli.main import main
from forge_cli.view.conversation import new_items, split_conversation
from forge_cli.view.load import load_rollouts, load_summaries
from forge_cli.view.model import CallView, RolloutView
from forge_cli.view.page import page_file_name, render_index, render_rollout_page
from pipeline.shards import write_shard
from pipeline.store import connect
from tests.forge_cli.view_runs import HOSTILE, write_view_run
from tests.pipeline.runs import call_row, reward_row, rollout_row

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def call(call_id: str, parent: str | None = None, kind: str | None = None, **kw: Any) -> CallView:
    values: dict[str, Any] = dict(
        call_id=call_id, parent_call_id=parent, edge_kind=kind, evidence="hash_chain" if kind else None,
        depth=None, agent_key="main", is_side_call=False, is_prewarm=False, model="m",
        api="openai_chat", status="complete", error=None, started_at=T0, duration_ms=1500.0,
        ttfb_ms=20.0, input_tokens=1200, output_tokens=34, cache_read_tokens=None,
        cache_write_tokens=None, usage_estimated=False, drift=None, policy_version=None,
        stop_reason="stop", tools=["shell"], tool_calls=None, actions=None,
    )  # fmt: skip
    values.update(kw)
    return CallView(**values)


class Elements(HTMLParser):
    """Tags and attributes of a page, as a browser's parser sees them."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def calls(self) -> list[str | None]:
        return [
            a.get("data-call-id") for t, a in self.tags if "call" in (a.get("class") or "").split()
        ]


# --------------------------------------------------------------------------- the page


def test_recorded_markup_in_every_field_becomes_text() -> None:
    hostile_id = 'x"><script>alert(1)</script>'
    c = call(
        hostile_id,
        model=HOSTILE,
        error=HOSTILE,
        tool_calls=[HOSTILE],
        request=[
            {"role": HOSTILE, "content": HOSTILE, "name": HOSTILE, "tool_call_id": HOSTILE},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": HOSTILE,
                "tool_calls": [
                    {"id": HOSTILE, "function": {"name": HOSTILE, "arguments": HOSTILE}}
                ],
            },
        ],  # fmt: skip
        raw_request=[{"content": HOSTILE}],
        note=HOSTILE,
    )
    page = render_rollout_page(RolloutView(rollout_id=HOSTILE, task_id=HOSTILE, calls=[c]))
    tags = Elements(page).tags
    assert [t for t, _ in tags if t in ("script", "img")] == ["script"]  # the viewer's own
    assert Elements(page).calls() == [hostile_id]
    assert not any(k.startswith("on") for _, attrs in tags for k in attrs)
    assert page.count("&lt;script&gt;window.__forgePwned") >= 8


def test_the_page_allows_only_its_own_script_and_no_network() -> None:
    page = render_rollout_page(RolloutView(rollout_id="r", calls=[call("a")]))
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert csp is not None
    assert "default-src 'none'" in csp.group(1)
    assert re.search(r"script-src 'sha256-[A-Za-z0-9+/=]+'$", csp.group(1))
    assert "unsafe-inline" not in csp.group(1).split("script-src")[1]
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing remote


def test_a_long_conversation_is_one_lane_not_a_deep_nest() -> None:
    n = 1500  # past Python's recursion limit
    calls = [call("c0")] + [call(f"c{i}", f"c{i - 1}", "continues") for i in range(1, n)]
    page = render_rollout_page(RolloutView(rollout_id="r", calls=calls))
    assert Elements(page).calls() == [f"c{i}" for i in range(n)]
    assert page.count('class="lane root"') == 1 and 'class="branches"' not in page


def test_sub_agents_side_calls_and_compactions_open_labelled_lanes_inside_their_parent() -> None:
    calls = [
        call("a"),
        call("side", "a", "spawns", is_side_call=True, agent_key="side:side"),
        call("s1", "a", "spawns", agent_key="ag1"),
        call("s2", "s1", "continues", agent_key="ag1"),
        call("b", "a", "continues"),
        call("c", "b", "compacts"),
    ]
    page = render_rollout_page(RolloutView(rollout_id="r", calls=calls))
    assert Elements(page).calls() == ["a", "side", "s1", "s2", "b", "c"]
    a = page.index('data-call-id="a"')
    branches = page.index('class="branches"', a)
    # s2 continues s1 inside the sub-agent's lane; b comes after a closes, in a's lane
    assert branches < page.index('data-call-id="s2"') < page.index('data-call-id="b"')
    assert page.count('class="lane branch kind-spawns"') == 2
    assert page.count('class="lane branch kind-compacts"') == 1
    assert ">side call<" in page and ">compaction<" in page


def test_each_call_shows_model_tokens_latency_drift_and_advantage() -> None:
    c = call("a", drift="REALIGN", api="anthropic_messages", cache_read_tokens=800)
    page = render_rollout_page(RolloutView(rollout_id="r", advantage=-0.5, calls=[c]))
    head = page[page.index('<summary class="head">') : page.index("</summary>")]
    assert '<span class="model">m</span>' in head
    assert "in 2,000 · out 34" in head  # Anthropic's cached prompt tokens counted in
    assert "1.5 s" in head and "REALIGN" in head and "adv -0.500" in head
    assert "<th>drift</th><td>REALIGN</td>" in page
    assert "<th>advantage</th><td>-0.500</td>" in page


def test_without_a_reward_the_advantage_and_drift_are_blank() -> None:
    page = render_rollout_page(RolloutView(rollout_id="r", calls=[call("a")]))
    assert 'class="adv"' not in page and 'class="drift' not in page
    assert "<th>advantage</th><td></td>" in page and "<th>drift</th><td></td>" in page


def test_messages_tool_calls_and_results_are_shown() -> None:
    c = call(
        "a",
        earlier_messages=3,
        request=[{"role": "tool", "tool_call_id": "call_1", "name": "shell", "content": "hi\n"}],
        response=[{"role": "assistant", "content": "ok", "tool_calls": [
            {"id": "call_2", "function": {"name": "shell", "arguments": '{"command": "ls"}'}}]}],
    )  # fmt: skip
    page = render_rollout_page(RolloutView(rollout_id="r", calls=[c]))
    assert "1 new message(s), 1 in the response; 3 earlier in the parent call" in page
    assert '<div class="tool-result role-tool">' in page and '<pre class="text">hi\n</pre>' in page
    assert '<span class="tname">shell</span>' in page
    # JSON arguments indented (and escaped, quotes too)
    assert '<pre class="args">{\n &quot;command&quot;: &quot;ls&quot;\n}</pre>' in page


def test_page_file_names_are_safe_and_distinct() -> None:
    assert page_file_name("hello-0") == "hello-0.html"
    odd = ["../../etc/passwd", "a/b", "a_b", "a b", "", "ü"]
    names = [page_file_name(r) for r in odd]
    assert len(set(names)) == len(odd)
    assert all(re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*\.html", n) for n in names)


def test_the_index_links_each_rollout_page() -> None:
    page = render_index(
        [RolloutView(rollout_id="a b", reward=1.0), RolloutView(rollout_id="c")], "run"
    )
    hrefs = [a["href"] for t, a in Elements(page).tags if t == "a"]
    assert hrefs == [page_file_name("a b"), page_file_name("c")]


# --------------------------------------------------------------------------- conversations


def test_a_call_shows_only_what_follows_its_parents_conversation() -> None:
    params = {"model": "m"}
    first = [{"role": "user", "content": "go"}]
    answer = [{"role": "assistant", "content": "step"}]
    parent = split_conversation("openai_chat", params, first, answer, None)
    assert parent.earlier == 0 and len(parent.request) == 1 and len(parent.response) == 1
    more = [*first, *answer, {"role": "user", "content": "again"}]
    child = split_conversation("openai_chat", params, more, [], parent.full)
    assert child.earlier == 2 and child.request == [{"role": "user", "content": "again"}]
    # a rewritten history (a compaction) is shown whole
    other = split_conversation(
        "openai_chat", params, [{"role": "user", "content": "x"}], [], parent.full
    )
    assert other.earlier == 0 and len(other.request) == 1


def test_items_no_converter_reads_are_shown_as_recorded_with_a_note() -> None:
    split = split_conversation("some_new_api", {}, [{"kind": "strange"}], [], None)
    assert split.note is not None and "some_new_api" in split.note
    assert split.request[0]["raw"] and '"kind": "strange"' in split.request[0]["content"]


def test_new_items_cut_at_the_parents_last_item() -> None:
    chain = [("h1", 1), ("h2", 2), ("h3", 3)]
    assert new_items(chain, "h2") == [3]
    assert new_items(chain, "nope") == [1, 2, 3]
    assert new_items(chain, "nope", parent_items=2) == [3]


# --------------------------------------------------------------------------- from the store


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_view_run(tmp_path_factory.mktemp("view-run"))


def test_rollouts_load_with_their_tree_advantage_and_new_messages(run: Path) -> None:
    claude, chat = load_rollouts(connect(run), ["claude-r", "chat-r"])
    assert claude.reward == 1.0 and claude.advantage == pytest.approx(0.7071, abs=1e-3)
    by_id = {c.call_id: c for c in claude.calls}
    assert len(by_id) == 6
    assert by_id["claude-r-t000"].is_side_call and by_id["claude-r-t000"].edge_kind == "spawns"
    assert by_id["claude-r-s000"].parent_call_id == "claude-r-m000"
    last = by_id["claude-r-m002"]
    assert last.earlier_messages == 5  # system, user, assistant, tool result, assistant
    assert [m["role"] for m in last.request] == ["tool"]
    assert last.request[0]["content"] == HOSTILE
    assert last.response == [{"role": "assistant", "content": "Fixed the test."}]
    # Claude Code moved its cache mark, so re-sent items hashed anew: the raw items are
    # still cut after the parent's conversation.
    assert last.raw_request == [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_m1_0",
                                      "content": HOSTILE, "cache_control": {"type": "ephemeral"}}]}
    ]  # fmt: skip
    assert chat.advantage is None and chat.drop_reason == "no_reward"


def test_one_rollouts_advantage_is_computed_from_its_whole_groups_calls(tmp_path: Path) -> None:
    # load_summaries narrows `calls` to the rollouts of the same task. A peer's calls
    # decide its part in the group: claude-r2 left a call incomplete, so it is partial
    # and dropped; were its calls left out, it would look complete and join the group.
    run = write_view_run(tmp_path)
    write_shard(tmp_path, "calls", "calls-r2", [call_row("r2-c0", rollout_id="claude-r2",
                                                         status="incomplete")])  # fmt: skip
    write_shard(tmp_path, "rollouts", "rollouts-r2", [rollout_row("claude-r2", "fix-test")])
    write_shard(tmp_path, "rewards", "rewards-r2", [reward_row("claude-r2", 1.0)])
    want = (
        connect(run)
        .execute("SELECT advantage, group_size FROM groups WHERE rollout_id = 'claude-r'")
        .fetchall()
    )
    assert want == [(pytest.approx(0.7071, abs=1e-3), 2)]
    summary = load_summaries(connect(run), ["claude-r"])["claude-r"]
    assert (summary.advantage, summary.group_size) == want[0]


def test_forge_view_writes_every_page_and_an_index_and_says_where(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pages"
    assert main(["view", "--data", str(run), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "chat-r.html", "claude-r.html", "codex-r.html", "gui-r.html", "index.html",
    ]  # fmt: skip
    printed = capsys.readouterr().out
    assert f"open {out / 'index.html'}" in printed
    assert Elements((out / "codex-r.html").read_text()).calls() == [
        "codex-r-c000", "codex-r-c001",
    ]  # fmt: skip


def test_forge_view_of_one_rollout_writes_one_file(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "one.html"
    assert main(["view", "--data", str(run), "--rollout", "chat-r", "--out", str(target)]) == 0
    assert f"to {target}" in capsys.readouterr().out
    assert sorted(Elements(target.read_text()).calls()) == ["chat-r-h000", "chat-r-h001"]
    assert [p.name for p in tmp_path.iterdir()] == ["one.html"]  # no temporary file left


def test_forge_view_names_the_rollouts_when_one_is_wrong(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["view", "--data", str(run), "--rollout", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no rollout 'nope'" in err and "claude-r" in err and "chat-r" in err


def test_forge_view_refuses_a_run_without_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["view", "--data", str(tmp_path)]) == 2
    assert "no calls recorded under" in capsys.readouterr().err


def test_a_gui_rollout_page_embeds_each_screenshot_once_and_shows_the_actions(
    tmp_path: Path,
) -> None:
    """4 computer-use calls re-sending their last 2 screenshots carry 7, of which 4 are
    distinct: the page embeds those 4 once each, at the call that first sends them."""
    import base64

    from pipeline.images import image_hash
    from tests.forge_cli.view_runs import write_gui_rollout

    carried = write_gui_rollout(tmp_path)
    assert [len(c) for c in carried] == [1, 2, 2, 2]
    assert main(["view", "--data", str(tmp_path), "--rollout", "gui-r", "--out", str(tmp_path / "p.html")]) == 0
    html = (tmp_path / "p.html").read_text()
    distinct = list(dict.fromkeys(p for c in carried for p in c))
    assert len(distinct) == 4
    for png in distinct:
        src = "data:image/png;base64," + base64.b64encode(png).decode()
        assert html.count(src) == 1
    assert html.count('<figure class="shot">') == 4
    # Call 1 extends call 0, so it shows only its new items; calls 2 and 3 trim an older
    # screenshot (the history is rewritten, so the whole request is shown) and name the
    # one screenshot they re-send.
    assert html.count('class="shot-ref"') == 2
    assert html.count(f'data-ref="{image_hash(distinct[0])}"') == 1
    assert "320×240" in html
    for kind in ("click", "type", "scroll", "key"):
        assert f'<span class="actions">GUI: {kind}</span>' in html
