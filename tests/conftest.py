"""Fixtures shared by every test folder."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def confdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mitmproxy CA for the whole session (mitmdump makes it on first start)."""
    return tmp_path_factory.mktemp("mitmproxy-conf")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(random, scripted) tiny Qwen3 models with the real Qwen3 tokenizer, built once."""
    from tests.support.policy import build_models

    return build_models(tmp_path_factory.mktemp("models"))
