"""Concurrent POST /reload against a hung training server never starve the probes.

The training server is a real loopback socket that accepts connections and never answers;
the prediction server is the real app on loopback. 50 reloads wait (coalesced into the
syncs of prediction_server.reload) while /healthz, /readyz and /metrics answer.
"""
from __future__ import annotations

import asyncio
import socket
import statistics
import threading
import time

import httpx

from prediction_server.app import create_app
from prediction_server.reload import CoalescedReload
from prediction_server.settings import Settings
from support.servers import run_app

SYNC_TIMEOUT = 60.0


class HungServer:
    """Accepts TCP connections on loopback and never sends a byte."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        """Stop listening and drop every connection (clients then fail fast)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not
        except OSError:
            pass
        self.sock.close()
        for c in self.conns:
            c.close()
        self._thread.join(5)


def _wait(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.02)


def test_probes_answer_while_50_reloads_wait_on_a_hung_training_server():
    hung = HungServer()
    settings = Settings.from_env({}, training_server_url=hung.url, sync_interval_sec=3600,
                                 sync_timeout_sec=SYNC_TIMEOUT)
    app = create_app(settings)
    coalesced: CoalescedReload = app.state.reload
    results: list[tuple[int, dict]] = []

    def reload(url: str) -> None:
        with httpx.Client(base_url=url, timeout=10 * SYNC_TIMEOUT) as h:
            r = h.post("/reload")
            results.append((r.status_code, r.json()))

    try:
        with run_app(app) as url, httpx.Client(base_url=url, timeout=10) as c:
            _wait(lambda: hung.conns, 10, "the poller never reached the hung server")
            threads = [threading.Thread(target=reload, args=(url,), daemon=True) for _ in range(50)]
            for t in threads:
                t.start()
            _wait(lambda: coalesced.waiting == 50, 30, "the 50 reloads are not all waiting")
            latencies = []
            for _ in range(20):
                for path, code in (("/healthz", 200), ("/readyz", 503), ("/metrics", 200)):
                    t0 = time.perf_counter()
                    r = c.get(path, timeout=SYNC_TIMEOUT / 4)
                    dt = time.perf_counter() - t0
                    assert r.status_code == code, path
                    if path == "/healthz":
                        latencies.append(dt)
            assert coalesced.waiting == 50 and results == []  # the probes answered while all 50 waited
            assert coalesced.syncs == 1  # 50 reloads: one sync (waiting for the poller's), one queued
            print(f"\n/healthz while 50 reloads wait: median {statistics.median(latencies) * 1000:.1f} ms, "
                  f"max {max(latencies) * 1000:.1f} ms over {len(latencies)} probes")
            hung.close()  # the training server goes away: every reload gets the failure
            for t in threads:
                t.join(3 * SYNC_TIMEOUT)
            assert len(results) == 50 and {code for code, _ in results} == {502}
            assert {body["reason"] for _, body in results} == {"network"}
            assert coalesced.syncs <= 2 and coalesced.waiting == 0
    finally:
        hung.close()


def test_reloads_arriving_during_a_sync_share_one_later_sync():
    """A reload never takes the result of a sync that began before it arrived, and any
    number of reloads cost at most the running sync plus one."""
    started: list[float] = []
    gate = threading.Event()

    def sync_once() -> dict:
        started.append(time.monotonic())
        n = len(started)
        if n == 1:
            gate.wait(10)
        return {"result": "unchanged", "sync": n}

    async def scenario() -> list[dict]:
        reload = CoalescedReload(sync_once)
        first = asyncio.ensure_future(reload())
        while not started:  # the first sync is running
            await asyncio.sleep(0.01)
        arrived = time.monotonic()
        later = [asyncio.ensure_future(reload()) for _ in range(10)]
        await asyncio.sleep(0.05)
        assert reload.waiting == 11 and reload.syncs == 1
        gate.set()
        out = await asyncio.gather(first, *later)
        assert started[1] > arrived and reload.syncs == 2 and reload.waiting == 0
        return out

    out = asyncio.run(scenario())
    assert out[0]["sync"] == 1 and {r["sync"] for r in out[1:]} == {2}
