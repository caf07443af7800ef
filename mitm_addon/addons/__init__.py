"""Forge's mitmproxy addons, one job each, composed in ``mitm_addon/forge_addon.py``."""
