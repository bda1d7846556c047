"""The umbrella ``latency-predictor`` command."""
