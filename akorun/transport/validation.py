"""What a received partial must satisfy before it touches a replica, on either path.

`checked_header`: its 100-byte wire header is the one its seal commits to (else
`DamagedInTransit`: altered or cut on the way, answered 400 ``damaged``, sent again),
within the body cap and of the receiver's run (`WireError`), and names the sealed
sender. `partial_of`: the partial a checked header and its filled buffer make.
Both the HTTP path (akorun.transport.server) and the data path
(akorun.transport.datapath_server) call them, in the same order.

Values: values must be finite. A partial carrying NaN or an infinity is
refused with 422 "non_finite" (the server counts it in ``rejected``), but its round is
still recorded, with zeros for its values: the receiver's replica stays
finite, its delivery log has no hole (no gate waits for a round that will
never come) and every receiver that refuses the same message stays equal to
the others. The sender logs the refusal loudly and does not resend. The
server calls `refuse_non_finite` where a partial is accepted (through its
host's ``on_partial``) and answers 422 when it raises.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from akocore.codecs import Codec
from akocore.messages import Partial
from akorun.transport.keys import Opened, RequestVerifier
from akorun.transport.wire import Header, Status, WireError, decode_header, to_partial

NON_FINITE_STATUS = 422


class NonFiniteValues(Exception):
    """A partial carried NaN or infinite values (answered 422 "non_finite")."""

    status = NON_FINITE_STATUS
    reason = "non_finite"


def refuse_non_finite(partial: Partial) -> tuple[Partial, NonFiniteValues | None]:
    """`partial` as it may be applied, and the refusal to raise once it is recorded:
    non-finite values are replaced by zeros (the round counts, the values do not)."""
    values = partial.values
    if values is None or values.size == 0 or bool(np.isfinite(values).all()):
        return partial, None
    bad = int(values.size - np.count_nonzero(np.isfinite(values)))
    refusal = NonFiniteValues(f"{bad} non-finite value(s) in round {partial.round} part "
                              f"{partial.part} from rank {partial.sender}: recorded as zeros")
    zeros = np.zeros_like(values)
    return dataclasses.replace(partial, values=zeros), refusal


class DamagedInTransit(Exception):
    """A sealed request's header or body is not what its seal commits to (altered or cut
    on the way): answered 400 ``damaged``, tagged, which tells the sender to send again."""


def checked_header(verifier: RequestVerifier, opened: Opened, head: bytes, *, max_body_bytes: int,
                   codec: Codec | None) -> Header:
    """The decoded wire header `head` of a request whose seal `opened` was opened:
    DamagedInTransit if it is not the header the seal commits to, WireError if it is
    malformed, over `max_body_bytes`, of another run, or names another sender."""
    try:
        verifier.check_digest(opened, head)
    except WireError as error:
        raise DamagedInTransit(f"header: {error.reason}") from None
    header = decode_header(head, max_body_bytes=max_body_bytes, codec=codec)
    if header.sender != opened.sender:
        raise WireError(f"header says sender {header.sender}, the seal is rank "
                        f"{opened.sender}'s", Status.BAD_SIGNATURE)
    verifier.check_run(header)
    return header


def partial_of(header: Header, values: np.ndarray) -> Partial:
    """The partial of a checked `header` whose body filled `values` (a pooled buffer)."""
    # a coded body (akocore.codecs) fills the buffer's first bytes: the runtime decodes it
    partial = to_partial(header, values if header.codec == "none"
                         else values.view(np.uint8)[:header.body_nbytes])
    if partial.values is None and partial.payload is None:  # an empty marker (final,
        # PULL) still carries its values
        partial = dataclasses.replace(partial, values=values)
    return partial
