"""Transport: the wire format, keys and seals, the server, clients and per-peer senders."""
