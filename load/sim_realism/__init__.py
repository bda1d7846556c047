"""Simulated realism against real vLLM runs: ``python -m load.sim_realism DIR --preset NAME``.

Replays every measured run of a folder in LMBench's layout (``runs``), with the requests it
lost put back where the workload allows (``lost``), in the simulator at its launch times, on
a preset's servers behind the policy that stands for the stack (``replay``), with what the
runs do not record (the engine's per-step floor, the request timeout, the share of continued
prompts, the latency outside the engine) fitted on each stack's lowest-QPS run (``fit``), and
judges measured against simulated per QPS (``compare``).
See docs/evaluation.md, "Realism against real vLLM runs".
"""
