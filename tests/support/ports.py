"""A TCP port for a test's server or rendezvous endpoint on 127.0.0.1.

Binding port 0 hands out an *ephemeral* port, and the ephemeral range is where every outgoing
connection of the other test worker gets its port too (gloo's pairs, HTTP clients): between the probe
closing and the server binding, one can take it. torchrun's c10d rendezvous then found the port taken,
joined whatever held it as a client and hung the two-node test until its timeout (CI, once). So the
port is drawn at random below the ephemeral range (ip_local_port_range), where nothing is handed out
unasked, and checked free; two tests draw the same one with odds of about 1 in 10,000.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOW = 20_000  # above the well-known and registered ports most daemons use


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that is free now and outside the ephemeral range (see the module docstring)."""
    high = _ephemeral_start()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(LOW, high) if high > LOW + 100 else rng.randrange(LOW, 65_000)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every draw taken: fall back to an ephemeral one
        s.bind((host, 0))
        return s.getsockname()[1]
