"""A free TCP port on the loopback interface, for the servers the benchmarks and tests start."""
from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free on ``host`` now (another process may still take it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
