"""The policy server: token-in, token-out generation and its HTTP API."""
