"""Forge's storage contract and DuckDB pipeline (importable without mitmproxy)."""
