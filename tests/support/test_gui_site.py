"""The GUI tasks' site and the scripted browser-use model, on their own."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.support.gui_site import (
    TASKS,
    browser_use_script,
    gui_site,
    page_elements,
    resolve_action,
)

# A step's message as browser-use 0.13.14 writes it (abridged).
STEP_TEXT = """<agent_state>
</agent_state>
<browser_state>
Interactive elements:
[Start of page]
Sign up
Name
|SHADOW(open)|[2]<input id=name name=name type=text placeholder=Your name />
[19]<button id=submit type=submit />
\tSubmit
[25]<a />
\tAbout us
[End of page]
</browser_state>
<step_info>Step2 maximum:6
Today:2026-12-07</step_info>
"""


def test_page_elements_reads_index_tag_and_label() -> None:
    assert page_elements(STEP_TEXT) == [
        (2, "input", "id=name name=name type=text placeholder=Your name"),
        (19, "button", "id=submit type=submit Submit"),
        (25, "a", "About us"),
    ]


def test_a_planned_action_gets_the_index_of_its_element() -> None:
    elements = page_elements(STEP_TEXT)
    assert resolve_action({"click": {"find": "button submit"}}, elements) == {
        "click": {"index": 19}
    }
    assert resolve_action({"input": {"find": "input name", "text": "Ada"}}, elements) == {
        "input": {"text": "Ada", "index": 2}
    }
    assert resolve_action({"done": {"text": "ok"}}, elements) == {"done": {"text": "ok"}}
    with pytest.raises(LookupError, match="no <a> with 'Pricing'"):
        resolve_action({"click": {"find": "a Pricing"}}, elements)


def test_the_script_answers_the_step_the_message_names() -> None:
    plan = [[{"click": {"find": "a About"}}], [{"done": {"text": "ok", "success": True}}]]

    class Conv:
        body = {"messages": [{"role": "system", "content": "x"},
                             {"role": "user", "content": [{"type": "text", "text": STEP_TEXT}]}]}  # fmt: skip

    reply = json.loads(browser_use_script(plan)(Conv())["text"])
    assert reply["action"] == [{"done": {"text": "ok", "success": True}}]
    assert set(reply) == {"thinking", "evaluation_previous_goal", "memory", "next_goal",
                          "current_plan_item", "plan_update", "action"}  # fmt: skip


def test_the_site_logs_what_it_served_and_the_verifiers_read_the_log() -> None:
    with gui_site() as site:
        for path in ("/form.html", "/thanks.html?name=Ada", "/about.html"):
            with urllib.request.urlopen(site.url(path), timeout=10) as r:
                assert r.status == 200
        assert site.paths() == ["/form.html", "/thanks.html?name=Ada", "/about.html"]
        assert site.verify(TASKS["sign-up"]) is True
        assert site.verify(TASKS["pricing"]) is False
