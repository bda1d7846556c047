"""Simulated realism against real vLLM runs: ``python -m load.sim_realism DIR --preset NAME``.

Replays every measured run of a folder in LMBench's layout (``runs``) in the simulator at
its recorded launch times, on a preset's servers behind the policy that stands for the
stack (``replay``), with the one unrecorded workload parameter fitted on each stack's
lowest-QPS run (``fit``), and judges measured against simulated per QPS (``compare``).
See docs/evaluation.md, "Realism against real vLLM runs".
"""
