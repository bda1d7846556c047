"""Discrete-event simulator of a cluster of vLLM-like model servers and the closed-loop
routing benchmark (``latency-predictor simulate``). See ``load/simulate_cli.py``."""
