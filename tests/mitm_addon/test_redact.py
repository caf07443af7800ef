"""Secrets never reach disk: headers, query strings, bodies."""

from __future__ import annotations

import base64

from mitm_addon.config import parse_redaction
from mitm_addon.redact import REDACTED, proxy_auth_user, redact_headers, redact_query, scrub_body

NONE = parse_redaction("")


def test_credential_headers_are_replaced_and_their_values_collected() -> None:
    headers = [
        ("Authorization", "Bearer sk-live-abcdef123456"),
        ("x-api-key", "sk-ant-0123456789"),
        ("Cookie", "session=cookievalue123456; theme=dark"),
        ("Content-Type", "application/json"),
    ]
    out, secrets = redact_headers(headers, NONE)
    assert out["authorization"] == out["x-api-key"] == out["cookie"] == REDACTED
    assert out["content-type"] == "application/json"
    assert {"sk-live-abcdef123456", "sk-ant-0123456789", "cookievalue123456"} <= set(secrets)


def test_extra_header_names_from_forge_redact_are_replaced() -> None:
    out, _ = redact_headers(
        [("X-Company-Token", "abcdefghijkl")], parse_redaction("x-company-token")
    )
    assert out["x-company-token"] == REDACTED


def test_key_like_query_parameters_are_replaced() -> None:
    path, secrets = redact_query("/v1/models?key=AIzaSyD-secret-value&alt=json", NONE)
    assert "AIzaSyD-secret-value" not in path and "alt=json" in path
    assert secrets == ["AIzaSyD-secret-value"]


def test_secret_values_and_patterns_are_scrubbed_from_bodies() -> None:
    body = b'{"content": "key sk-live-abcdef123456 and ghp_0123456789abcdef"}'
    out = scrub_body(body, ["sk-live-abcdef123456"], parse_redaction(r"re:ghp_[0-9a-f]{16}"))
    assert b"sk-live" not in out and b"ghp_" not in out and out.count(REDACTED.encode()) == 2


def test_non_utf8_bodies_survive_scrubbing_byte_for_byte() -> None:
    body = b"\xff\xfe\x00binary\x80"
    assert scrub_body(body, [], parse_redaction(r"re:zzz")) == body


def test_proxy_auth_user_is_the_rollout_id() -> None:
    token = base64.b64encode(b"r-17:x").decode()
    assert proxy_auth_user(f"Basic {token}") == "r-17"
    assert proxy_auth_user("Bearer abc") is None
    assert proxy_auth_user("Basic !!!notbase64") is None
