"""latency_cli package."""
