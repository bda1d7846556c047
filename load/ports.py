"""Free TCP ports on the loopback interface, for the servers the benchmarks and tests start."""
from __future__ import annotations

import random
import socket

# Linux hands out ephemeral (outgoing-connection) ports from 32768-60999 by default, so a
# run of ports below that range cannot be taken by a client socket between the check and
# the server's bind; only another listener could.
_LOW, _HIGH = 20000, 32000


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free on ``host`` now (another process may still take it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(n: int, host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A base port ``b`` with ``b .. b+n-1`` all free on ``host`` now, chosen below the
    ephemeral range so that outgoing connections cannot take one of them meanwhile."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(_LOW, _HIGH - n)
        socks: list[socket.socket] = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind((host, p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports in {_LOW}-{_HIGH} on {host}")
