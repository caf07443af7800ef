"""Forge's mitmproxy addon: capture (record mode) and policy serving (serve mode)."""
