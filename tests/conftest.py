"""Fixtures shared by every test folder."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def confdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mitmproxy CA for the whole session (mitmdump makes it on first start)."""
    return tmp_path_factory.mktemp("mitmproxy-conf")
