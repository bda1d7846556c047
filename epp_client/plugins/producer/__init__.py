"""Data producers: what the scheduler knows of each candidate before the profiles run: the
predicted latency (``predicted-latency-producer``), the router's in-flight load
(``inflight-load-producer``) and the prompt blocks probably cached
(``approx-prefix-cache-producer``)."""
