"""The test helpers' own promises, where tests rely on more than their names."""

from __future__ import annotations

import socket

from tests.daemon_helpers import quiet_port


def test_a_quiet_port_is_free_and_below_the_range_the_kernel_hands_out() -> None:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        low = int(ports.read().split()[0])
    for port in {quiet_port() for _ in range(20)}:
        assert 1024 <= port < low, (port, low)
        for _ in range(2):  # a server listens there, stops, and listens there again
            with socket.socket() as server:
                server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                server.bind(("127.0.0.1", port))
                server.listen()
