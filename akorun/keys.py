"""What a rank signs with and how it checks what it receives: the run's keys in one place.

This module owns authentication, both directions:

- `RunKeys`: the cluster secret, the run id and the 8-byte wire hash (config,
  initial parameters, resolved p), which is known only once the scheme node is
  built (`bind_wire_hash`).
- `Signer`, the outgoing side: encodes (and so signs) partials, signs control
  requests, checks the signature of their answers.
- `RequestVerifier`, the incoming side: checks control requests, signs their
  answers, verifies a partial's body HMAC and its run.

Every partial and control message goes through one of these two, so a change of
what messages are bound to (per-start sessions, per-rank keys) lands here.
"""

from __future__ import annotations

from dataclasses import dataclass

from akocore.messages import Partial
from akorun import control
from akorun.wire import Header, Verifier, check_run, encode_bytes


@dataclass
class RunKeys:
    """The run's shared secret and identity; `wire_hash` is None until the node exists."""

    secret: bytes
    run_id: bytes
    wire_hash: bytes | None = None

    def bind_wire_hash(self, wire_hash: bytes) -> None:
        self.wire_hash = wire_hash


class Signer:
    """Signs what this rank sends: partials (wire HMAC) and control requests."""

    def __init__(self, keys: RunKeys) -> None:
        self.keys = keys

    def encode(self, message: Partial) -> bytes:
        wire_hash = self.keys.wire_hash
        assert wire_hash is not None, "no partial is sent before the node is built"
        return encode_bytes(message, run_id=self.keys.run_id, config_hash=wire_hash,
                            secret=self.keys.secret)

    def sign_request(self, path: str, body: bytes) -> str:
        return control.signature(self.keys.secret, "POST", path, body)

    def answer_is_signed(self, path: str, body: bytes, given: str | None) -> bool:
        return control.is_signed(self.keys.secret, control.ANSWER, path, body, given)


class RequestVerifier:
    """Checks what this rank receives and signs its answers."""

    def __init__(self, keys: RunKeys) -> None:
        self.keys = keys

    @property
    def ready(self) -> bool:
        """Partials can be checked (the wire hash is known)."""
        return self.keys.wire_hash is not None

    def request_is_signed(self, method: str, path: str, body: bytes, given: str | None) -> bool:
        return control.is_signed(self.keys.secret, method, path, body, given)

    def sign_answer(self, path: str, body: bytes) -> str:
        return control.signature(self.keys.secret, control.ANSWER, path, body)

    def body_verifier(self, signed_header: bytes) -> Verifier:
        """The streaming HMAC check of one partial's body."""
        return Verifier(self.keys.secret, signed_header)

    def check_run(self, header: Header) -> None:
        """WireError (409) unless the partial belongs to this run and this config."""
        wire_hash = self.keys.wire_hash
        assert wire_hash is not None, "partials are admitted only once the node is built"
        check_run(header, self.keys.run_id, wire_hash)
