"""How a harness trusts the proxy: its proxy and CA variables, one list for every runtime.

Each runtime reads its own variable. Some add a CA to the system store
(``NODE_EXTRA_CA_CERTS``: Forge's CA alone); others replace the store, so they get a
bundle of the system CAs plus Forge's. ``forge record``, ``forge rollout`` and the
Kubernetes pod entrypoint all set these, and nothing else: no system or Python trust
store is changed.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from pipeline.atomic import write_atomic

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
NO_PROXY = "localhost,127.0.0.1,::1"
# Variables that add one CA file to the runtime's own store (Node).
ADDED_CA_VARIABLES = ("NODE_EXTRA_CA_CERTS",)
# Variables that replace the runtime's store: they point at the bundle (system CAs + Forge's).
BUNDLE_VARIABLES = (
    "SSL_CERT_FILE",  # OpenSSL, Python's ssl, Codex
    "REQUESTS_CA_BUNDLE",  # requests
    "CURL_CA_BUNDLE",  # curl
    "GIT_SSL_CAINFO",  # git
    "CODEX_CA_CERTIFICATE",  # Codex CLI
)


def system_ca_file() -> Path | None:
    """The system's CA bundle (OpenSSL's default, Debian's, Red Hat's, else certifi's)."""
    for candidate in (
        ssl.get_default_verify_paths().cafile,
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    try:
        import certifi

        return Path(certifi.where())
    except ImportError:
        return None


def write_ca_bundle(ca_cert: Path, dest: Path) -> Path:
    """System CAs plus Forge's in ``dest`` (replaced atomically), for ``BUNDLE_VARIABLES``."""
    parts = []
    system = system_ca_file()
    if system is not None:
        parts.append(system.read_text(errors="replace").rstrip() + "\n")
    parts.append(ca_cert.read_text())
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(dest, "".join(parts), sync=False, sync_dir=False)
    return dest


def trust_env(proxy_url: str, ca_cert: Path, bundle: Path) -> dict[str, str]:
    """The proxy variables (none for an empty ``proxy_url``: transparent capture) and the
    CA variables of every runtime."""
    env: dict[str, str] = {}
    if proxy_url:
        for name in PROXY_VARIABLES:
            env[name] = proxy_url
        env["NO_PROXY"] = env["no_proxy"] = NO_PROXY
    for name in ADDED_CA_VARIABLES:
        env[name] = str(ca_cert)
    for name in BUNDLE_VARIABLES:
        env[name] = str(bundle)
    return env
