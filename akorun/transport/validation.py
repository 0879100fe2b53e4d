"""What a received partial's values must satisfy before they touch a replica.

Policy: values must be finite. A partial carrying NaN or an infinity is
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

from akocore.messages import Partial

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
