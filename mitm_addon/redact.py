"""Secrets never reach disk: header, query-string and body scrubbing (pure)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode

from mitm_addon.config import Redaction

REDACTED = "[REDACTED]"

# Headers whose values are credentials. Lower-case.
SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "set-cookie",
        "x-auth-token",
        "x-amz-security-token",
        "chatgpt-account-id",
    }
)
# Query parameters that carry credentials. Lower-case.
SECRET_PARAMS = frozenset(
    {"key", "api_key", "apikey", "api-key", "access_token", "token", "sig", "signature", "code"}
)


def redact_headers(
    headers: Iterable[tuple[str, str]] | Iterable[tuple[bytes, bytes]], redaction: Redaction
) -> tuple[dict[str, str], list[str]]:
    """(headers to store, secret values seen): names lower-cased, repeats joined with ', '.

    Takes mitmproxy's decoded pairs (``headers.items(multi=True)``) or its raw byte pairs
    (``headers.fields``), which the hooks pass: one pass, without mitmproxy decoding each."""
    out: dict[str, str] = {}
    secrets: list[str] = []
    for raw_name, raw_value in headers:
        # Stored as valid UTF-8: undecodable bytes become U+FFFD (mitmproxy's strings hold
        # them as surrogate escapes). Inline: this runs for every header of every call.
        if isinstance(raw_name, bytes) and isinstance(raw_value, bytes):
            key = raw_name.decode("utf-8", "replace").lower()
            value = raw_value.decode("utf-8", "replace")
        else:
            key, value = _printable(str(raw_name)).lower(), _printable(str(raw_value))
        if key in SECRET_HEADERS or key in redaction.headers:
            secrets.extend(_secret_parts(value))
            value = REDACTED
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out, secrets


def _printable(value: str) -> str:
    """A header or path string as valid UTF-8 (undecodable bytes become U+FFFD)."""
    if value.isascii():
        return value
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _secret_parts(value: str) -> list[str]:
    """The value and the token inside it (``Bearer sk-...`` -> ``sk-...``), long enough to matter."""
    parts = [value]
    scheme, _, token = value.partition(" ")
    if token:
        parts.append(token.strip())
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(token).decode("utf-8").partition(":")
                parts += [password]
            except (binascii.Error, UnicodeDecodeError):
                pass
    # Cookies: each value on its own.
    for cookie in value.split(";"):
        _, eq, v = cookie.partition("=")
        if eq:
            parts.append(v.strip())
    return [p for p in parts if len(p) >= 8]


def redact_query(path: str, redaction: Redaction) -> tuple[str, list[str]]:
    """(path with secret query values replaced, the values)."""
    base, sep, query = _printable(path).partition("?")
    if not sep:
        return path, []
    pairs = parse_qsl(query, keep_blank_values=True)
    secrets: list[str] = []
    kept: list[tuple[str, str]] = []
    for name, value in pairs:
        if name.lower() in SECRET_PARAMS or name.lower() in redaction.params:
            if len(value) >= 8:
                secrets.append(value)
            value = REDACTED
        kept.append((name, value))
    return f"{base}?{urlencode(kept, safe='[]/:')}", secrets


def scrub_body(body: bytes, secrets: Iterable[str], redaction: Redaction) -> bytes:
    """The body with any secret value and any ``forge_redact`` pattern match replaced."""
    for secret in secrets:
        raw = secret.encode("utf-8", "surrogateescape")
        if raw and raw in body:
            body = body.replace(raw, REDACTED.encode())
    if redaction.patterns:
        text = body.decode("utf-8", "surrogateescape")
        for pattern in redaction.patterns:
            text = pattern.sub(REDACTED, text)
        body = text.encode("utf-8", "surrogateescape")
    return body


def proxy_auth_user(value: str | None) -> str | None:
    """The user name of a ``Proxy-Authorization: Basic ...`` header (the rollout id)."""
    credentials = proxy_credentials(value)
    return (credentials[0] or None) if credentials else None


def proxy_credentials(value: str | None) -> tuple[str, str] | None:
    """(user, password) of a ``Proxy-Authorization: Basic ...`` header; None without one."""
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        user, _, password = (
            base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
        )
    except (binascii.Error, UnicodeDecodeError):
        return None
    return user, password
