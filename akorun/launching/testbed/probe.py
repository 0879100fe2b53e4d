"""One TCP transfer between two testbed namespaces, timed: what the shaping really gives.

`measure_transfer` opens a listening socket in the receiver's namespace and a
client socket in the sender's (akorun.launching.testbed.netns.entered; a socket stays
in the namespace it was made in), sends `nbytes` over one connection and
times it at the receiver, from the connection's first byte to its end of
stream. It includes TCP's own costs (headers, ACKs, slow start), which is the
point: the ratio to the shaped rate is the goodput factor a fluid model
misses. A figure, not a check.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

from akorun.launching.testbed.netns import entered

PROBE_PORT = 7979
CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class Transfer:
    nbytes: int  # received
    seconds: float  # first byte to end of stream, at the receiver

    @property
    def rate_bps(self) -> float:
        return self.nbytes * 8 / self.seconds if self.seconds > 0 else float("inf")


def measure_transfer(sender_namespace: str, receiver_namespace: str, receiver_address: str,
                     nbytes: int, *, port: int = PROBE_PORT, timeout_s: float = 60.0) -> Transfer:
    """Send `nbytes` from one namespace to `receiver_address` in another; the receiver's
    count and time."""
    with entered(receiver_namespace):
        server = socket.create_server((receiver_address, port))
    with entered(sender_namespace):
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    received: list[Transfer] = []

    def receive() -> None:
        server.settimeout(timeout_s)
        connection, _ = server.accept()
        with connection:
            connection.settimeout(timeout_s)
            count, first_s = 0, None
            while chunk := connection.recv(CHUNK_BYTES):
                if first_s is None:
                    first_s = time.perf_counter()
                count += len(chunk)
            end_s = time.perf_counter()
        received.append(Transfer(count, end_s - (first_s if first_s is not None else end_s)))

    thread = threading.Thread(target=receive, name="testbed-probe", daemon=True)
    thread.start()
    try:
        with client:
            client.settimeout(timeout_s)
            client.connect((receiver_address, port))
            payload = bytes(CHUNK_BYTES)
            left = nbytes
            while left > 0:
                sent = client.send(payload[:min(left, CHUNK_BYTES)])
                left -= sent
        thread.join(timeout_s)
    finally:
        server.close()
    if not received:
        raise TimeoutError(f"no transfer to {receiver_address}:{port} within {timeout_s:g} s")
    return received[0]
