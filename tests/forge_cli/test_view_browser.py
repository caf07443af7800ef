"""``forge view`` pages opened in a real headless Chromium: every call is shown, search
finds and filters, recorded markup stays text, and the page has no script errors."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from forge_cli.main import main
from pipeline.store import connect
from tests.forge_cli.view_runs import HOSTILE, write_view_run
from tests.support.chromium import Browser, Page, chromium, find_chromium

# Screenshots land here (git-ignored); CI keeps the folder as its artifacts.
ARTIFACTS = Path(os.environ.get("FORGE_TEST_ARTIFACTS", "test-artifacts")) / "viewer"

# ~25 s on 2 shared cores: a browser start, nine page loads and five screenshots.
pytestmark = pytest.mark.slow

if find_chromium() is None and not os.environ.get("CI"):
    pytest.skip(
        "Debian's chromium is not installed (apt-get install chromium; .ci/run installs it "
        "and CI never skips this)",
        allow_module_level=True,
    )

# What the page reports about itself: every call element, whether its head is laid out
# (no closed ancestor hides it), and traces that recorded markup ran or became elements.
_STATE = """(() => {
  const calls = Array.from(document.querySelectorAll("details.call"));
  return JSON.stringify({
    ready: document.documentElement.dataset.viewer || null,
    declared: Number(document.getElementById("tree").dataset.calls),
    calls: calls.map((c) => c.dataset.callId),
    shown: calls.filter((c) => c.querySelector(":scope > summary").getClientRects().length > 0)
                .map((c) => c.dataset.callId),
    pwned: window.__forgePwned === undefined ? null : window.__forgePwned,
    scripts: document.scripts.length,
    images: document.images.length,
    text: document.body.textContent,
  });
})()"""
_VISIBLE = """JSON.stringify(Array.from(document.querySelectorAll("details.call"))
  .filter((c) => c.querySelector(":scope > summary").getClientRects().length > 0)
  .map((c) => c.dataset.callId))"""
_MATCHES = """JSON.stringify(Array.from(document.querySelectorAll("details.call.match"))
  .map((c) => c.dataset.callId))"""


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = write_view_run(tmp_path_factory.mktemp("view-run"))
    assert main(["view", "--data", str(run)]) == 0
    return run


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    with chromium(tmp_path_factory.mktemp("chromium")) as b:
        yield b


def open_page(browser: Browser, path: Path) -> Page:
    page = browser.new_page()
    page.navigate(path.resolve().as_uri())
    page.wait_until("document.documentElement.dataset.viewer === 'ready'", "the page's script")
    return page


def type_query(page: Page, text: str) -> None:
    page.evaluate(
        "(() => { const box = document.getElementById('search'); "
        f"box.value = {json.dumps(text)}; "
        "box.dispatchEvent(new Event('input', {bubbles: true})); })()"
    )
    page.wait_until("document.getElementById('match-count').textContent !== ''", "the search")


@pytest.mark.parametrize("rollout", ["claude-r", "codex-r", "chat-r", "gui-r"])
def test_every_call_of_the_rollout_is_shown_without_script_errors(
    pages: Path, browser: Browser, rollout: str
) -> None:
    page = open_page(browser, pages / "view" / f"{rollout}.html")
    state = json.loads(page.evaluate(_STATE))
    recorded = [
        r[0]
        for r in connect(pages)
        .execute("SELECT call_id FROM calls WHERE rollout_id = ? ORDER BY call_id", [rollout])
        .fetchall()
    ]
    assert recorded, "the fixture recorded no calls"
    assert sorted(state["calls"]) == recorded  # each call exactly once
    assert sorted(state["shown"]) == recorded  # and laid out, not folded away
    assert state["declared"] == len(recorded)
    # "open all" unfolds every message for the screenshot
    page.evaluate("document.getElementById('open-all').click()")
    assert page.evaluate("Array.from(document.querySelectorAll('details')).every((d) => d.open)")
    assert page.script_errors() == []
    page.screenshot(ARTIFACTS / f"{rollout}.png")
    page.close()


def test_recorded_markup_is_shown_as_text_and_never_runs(pages: Path, browser: Browser) -> None:
    page = open_page(browser, pages / "view" / "claude-r.html")
    state = json.loads(page.evaluate(_STATE))
    assert HOSTILE in state["text"]  # the tool result, character for character
    assert state["pwned"] is None
    assert state["scripts"] == 1 and state["images"] == 0  # only the viewer's own script
    type_query(page, "forgePwned")
    # The hit is highlighted inside the tool result, whose folds were opened for it.
    shown = page.evaluate(
        "Array.from(document.querySelectorAll('mark.hit')).filter("
        "(m) => m.getClientRects().length > 0 && m.closest('.tool-result')).length"
    )
    assert shown >= 1
    assert json.loads(page.evaluate(_STATE))["pwned"] is None
    assert page.script_errors() == []
    page.screenshot(ARTIFACTS / "claude-r-search.png")
    page.close()


def test_search_marks_matching_calls_and_can_hide_the_rest(pages: Path, browser: Browser) -> None:
    page = open_page(browser, pages / "view" / "claude-r.html")
    type_query(page, "AGENT-7")  # the sub-agent's key, in another case
    assert sorted(json.loads(page.evaluate(_MATCHES))) == ["claude-r-s000", "claude-r-s001"]
    assert page.evaluate("document.getElementById('match-count').textContent") == (
        "2 of 6 calls match"
    )
    page.evaluate("document.getElementById('only-matches').click()")
    # the sub-agent's calls, and the call they hang from
    assert sorted(json.loads(page.evaluate(_VISIBLE))) == [
        "claude-r-m000",
        "claude-r-s000",
        "claude-r-s001",
    ]
    type_query(page, "")
    page.wait_until("document.getElementById('match-count').textContent === ''", "clearing")
    assert len(json.loads(page.evaluate(_VISIBLE))) == 6
    assert page.evaluate("document.querySelectorAll('mark.hit').length") == 0
    assert page.script_errors() == []
    page.close()


def test_the_index_links_every_rollout_page(pages: Path, browser: Browser) -> None:
    page = open_page(browser, pages / "view" / "index.html")
    links = json.loads(
        page.evaluate(
            "JSON.stringify(Array.from(document.querySelectorAll('#rollouts a'))"
            ".map((a) => [a.textContent, a.href]))"
        )
    )
    assert sorted(text for text, _ in links) == ["chat-r", "claude-r", "codex-r", "gui-r"]
    assert page.script_errors() == []
    page.screenshot(ARTIFACTS / "index.png")
    for text, href in links:
        page.navigate(href)
        assert page.evaluate("document.title") == f"Forge rollout {text}"
    page.close()


def test_screenshots_are_decoded_and_laid_out_at_their_calls(pages: Path, browser: Browser) -> None:
    """The computer-use rollout's 4 distinct screenshots are images the browser decoded
    (320 x 240, the recorded size) and lays out once the calls are opened."""
    page = open_page(browser, pages / "view" / "gui-r.html")
    page.evaluate("document.getElementById('open-all').click()")
    page.wait_until(
        "Array.from(document.images).every((i) => i.complete)", "the screenshots to decode"
    )
    shots = json.loads(
        page.evaluate(
            "JSON.stringify(Array.from(document.images).map((i) => [i.dataset.ref, "
            "i.naturalWidth, i.naturalHeight, i.getClientRects().length > 0, "
            "i.closest('details.call').dataset.callId]))"
        )
    )
    stored = dict(
        connect(pages).execute("SELECT hash, first_call_id FROM images").fetchall()
    )
    assert len(shots) == len(stored) == 4
    assert all((w, h, laid_out) == (320, 240, True) for _, w, h, laid_out, _ in shots)
    # Each is shown at the call that first sent it.
    assert {ref: call for ref, *_, call in shots} == stored
    assert page.script_errors() == []
    page.screenshot(ARTIFACTS / "gui-r.png")
    page.close()
