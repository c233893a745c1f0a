"""slime v0.3.1's plugin contract tests (tests/plugin_contracts), ported to slime-ref's hook API."""
