"""Option values: parsed once, bad ones explained."""

from __future__ import annotations

import pytest

from mitm_addon.config import (
    ConfigError,
    host_matches,
    parse_hosts,
    parse_redaction,
    parse_upstreams,
)


def test_upstreams_parse_into_base_urls() -> None:
    ups = parse_upstreams(
        "api.openai.com=http://127.0.0.1:9000, api.anthropic.com=https://gw.example/anthropic/"
    )
    assert ups["api.openai.com"].base_url == "http://127.0.0.1:9000"
    assert ups["api.anthropic.com"].base_url == "https://gw.example:443/anthropic"


@pytest.mark.parametrize(
    "value", ["api.openai.com", "=http://x", "h=ftp://x", "h=http://x:99999", "h=http://x/?q=1"]
)
def test_bad_upstreams_say_what_is_expected(value: str) -> None:
    with pytest.raises(ConfigError, match="forge_upstream"):
        parse_upstreams(value)


def test_host_wildcards_match_subdomains_only() -> None:
    hosts = parse_hosts("api.openai.com,*.example.com")
    assert host_matches("API.OpenAI.com.", hosts)
    assert host_matches("a.example.com", hosts) and not host_matches("example.com", hosts)
    assert not host_matches("evil-api.openai.com", hosts)


def test_redaction_kinds() -> None:
    r = parse_redaction("x-token, param:sig2, re:abc[0-9]+, header:X-Other")
    assert r.headers == {"x-token", "x-other"} and r.params == {"sig2"} and len(r.patterns) == 1
    with pytest.raises(ConfigError):
        parse_redaction("cookie:thing")
