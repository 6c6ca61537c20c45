import socket

from gpuaas.cluster.process import _ephemeral_range, free_port


def test_free_ports_are_listenable_and_outside_the_range_outgoing_connections_use():
    low, high = _ephemeral_range()
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1
    for port in ports:
        assert not low <= port <= high
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()
