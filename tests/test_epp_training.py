"""epp_client.training: the training reporter's stratified downsampling, posting and periodic flush."""
from __future__ import annotations

import random
import time

from epp_client.training import TrainingReporter, stratified_downsample
from load.ports import free_port
from support.inject import inject


# ------------------------------------------------------------------ training reporter
def entry(ttft=0.0, tpot=0.0, i=0):
    return {"kv_cache_percentage": 0.1, "input_token_length": i, "num_request_waiting": 0, "num_request_running": 0,
            "num_tokens_generated": 0, "prefix_cache_score": 0.0, "actual_ttft_ms": ttft, "actual_tpot_ms": tpot}


def test_stratified_downsampling_quotas():
    es = [entry(ttft=1, i=i) for i in range(1500)] + [entry(tpot=1, i=i) for i in range(450)] + \
        [entry(i=i) for i in range(50)]
    out = stratified_downsample(es, 1000, random.Random(1))
    kinds = [("ttft" if e["actual_ttft_ms"] > 0 else "tpot" if e["actual_tpot_ms"] > 0 else "other") for e in out]
    assert (kinds.count("ttft"), kinds.count("tpot"), kinds.count("other")) == (750, 225, 25)
    # remainder goes to the largest group: 699 + 2, capped by the 700 it has
    es = [entry(ttft=1, i=i) for i in range(700)] + [entry(tpot=1, i=i) for i in range(200)] + \
        [entry(i=i) for i in range(101)]
    out = stratified_downsample(es, 1000, random.Random(1))
    assert sum(e["actual_ttft_ms"] > 0 for e in out) == 700 and len(out) == 999
    # remainder with a tie among the largest groups goes to TTFT first
    es = [entry(tpot=1, i=i) for i in range(3)] + [entry(ttft=1, i=i) for i in range(3)]
    out = stratified_downsample(es, 5, random.Random(1))
    assert sum(e["actual_ttft_ms"] > 0 for e in out) == 3 and len(out) == 5
    assert stratified_downsample(es, 10, random.Random(1)) == es
    # sampling is random within a group
    picks = {tuple(e["input_token_length"] for e in stratified_downsample(
        [entry(ttft=1, i=i) for i in range(100)], 10, random.Random(s))) for s in range(5)}
    assert len(picks) == 5


def test_reporter_posts_expects_202_and_counts_failures():
    status = [202]
    with inject(lambda path, body: (status[0], b'{"accepted": 1}')) as srv:
        r = TrainingReporter(srv.url, autostart=False)
        r.add([entry(ttft=5, i=1), entry(tpot=2, i=2)])
        assert r.flush() == 2 and r.sent == 2
        assert srv.bodies[0] == {"entries": [entry(ttft=5, i=1), entry(tpot=2, i=2)]}
        status[0] = 200  # anything but 202 is a failure; no retry
        r.add([entry(ttft=5)])
        assert r.flush() == 0 and r.failed == 1 and r.failed_posts == 1 and r.buffered() == 0
        r.flush()
        assert len(srv.bodies) == 2  # an empty buffer posts nothing
    r = TrainingReporter(f"http://127.0.0.1:{free_port()}", autostart=False)
    r.add([entry(ttft=1)])
    assert r.flush() == 0 and r.failed == 1


def test_reporter_downsamples_above_max_and_bounds_its_buffer():
    with inject(lambda path, body: (202, b"{}")) as srv:
        r = TrainingReporter(srv.url, max_sample_size=10, max_buffer=50, autostart=False)
        r.add([entry(ttft=1, i=i) for i in range(30)] + [entry(tpot=1, i=i) for i in range(10)])
        r.add([entry(ttft=1, i=i) for i in range(25)])  # 65 > 50: the 15 oldest are dropped
        assert r.dropped == 15 and r.buffered() == 50
        assert r.flush() == 10 and r.downsampled == 40 and len(srv.bodies[0]["entries"]) == 10


def test_reporter_flushes_periodically_and_on_close():
    with inject(lambda path, body: (202, b"{}")) as srv:
        r = TrainingReporter(srv.url, flush_interval_s=0.05)
        r.add([entry(ttft=1, i=i) for i in range(3)])
        give_up = time.monotonic() + 10
        while r.sent < 3 and time.monotonic() < give_up:
            time.sleep(0.02)
        assert r.sent == 3 and r._thread.is_alive()
        r.add([entry(tpot=1)])
        r.close()
        assert r.sent == 4 and not r._thread.is_alive()
        r.add([entry(ttft=1)])  # after close: counted as dropped, never buffered
        assert r.dropped == 1 and r.buffered() == 0
