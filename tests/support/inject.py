"""A tiny HTTP/1.1 server for failure injection (status, body and delay chosen per test)."""
from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class InjectServer:
    """Tiny HTTP/1.1 server for failure injection: ``handler(path, body) -> (status, body)``
    after ``delay`` seconds, or, with ``hold``, once ``release`` is set (at the latest when the
    server stops). Records every request body and counts the answers sent (``answered``): a
    client that returned while ``answered`` is 0 did not wait for the answer."""

    def __init__(self, handler, delay: float = 0.0, hold: bool = False):
        self.handler, self.delay, self.bodies = handler, delay, []
        self.release, self.answered = threading.Event(), 0
        if not hold:
            self.release.set()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.bodies.append(json.loads(body))
                if outer.delay:
                    time.sleep(outer.delay)
                outer.release.wait(30)
                status, out = outer.handler(self.path, body)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:
                    pass
                outer.answered += 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@contextmanager
def inject(handler, delay=0.0, hold=False):
    s = InjectServer(handler, delay, hold)
    try:
        yield s
    finally:
        s.stop()
