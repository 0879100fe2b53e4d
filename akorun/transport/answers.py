"""How a requester reads and judges an answer: bounded before it is read, trusted only if tagged.

This module owns the client side's rules for every HTTP answer a rank gets
from a peer (a partial's, akorun.transport.sender; a control request's, akorun.transport.client):

- Bounded: `read_bounded` reads an answer's body only if it declares a
  Content-Length no larger than the cap the caller gives (`PARTIAL_ANSWER_MAX_BYTES`
  for a partial; `CONTROL_ANSWER_MAX_BYTES` for JSON control answers, more for the
  binary ones, akorun.transport.client), and never more than that: an answer without a
  length, or longer, is not read at all (`AnswerTooLarge`) and counts as a failed
  request. Nobody on the path can make a rank hold more than the cap per request.
- Tagged: the server tags every answer it gives once the request's seal is open,
  whatever its status (akorun.transport.keys.answer_tag: bound to the request's tag, the
  status and the body). An answer without a valid tag (forged on the path, or
  refused before the seal could be opened: 401/421/not ready) is never acted on
  as a refusal: the request failed and is made again (`Verdict.RETRY`).
- Final: only a tagged refusal that says the message itself is wrong (400 but not
  ``damaged``, 401 once the seal was open: a header naming another sender, 409,
  413, 422) ends the attempts (`Verdict.REFUSED`); the sender then records the
  message as refused for good (the run fails loudly, never "equal" by
  accident). A tagged 5xx, 429, 421 or a ``damaged`` 400 (the bytes were
  altered or cut on the way) means "send it again".
"""

from __future__ import annotations

import asyncio
from enum import Enum

import aiohttp

PARTIAL_ANSWER_MAX_BYTES = 4 * 1024  # a partial's answer: a tiny JSON or one line of text
CONTROL_ANSWER_MAX_BYTES = 1 << 20  # a JSON control answer (hello, heartbeat, ...)
ANSWER_TEXT_MAX_CHARS = 300  # a refusal's text, as the server writes it
DAMAGED = "damaged"  # a refusal's reason: the request's bytes were altered or cut in transit
FINAL_STATUSES = frozenset({400, 401, 409, 413, 422})  # tagged: the message itself is refused


class AnswerTooLarge(Exception):
    """An answer declared no length, or one over the cap: it was not read."""


class Verdict(Enum):
    """What a requester does with a (non-200) answer."""

    RETRY = "retry"  # failed: the bytes stay owed and go again
    REFUSED = "refused"  # refused for good by the peer itself (tagged)


async def read_bounded(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The answer's body, if it declares a Content-Length of at most `max_bytes`;
    AnswerTooLarge (nothing read, the connection closed) otherwise."""
    length = response.content_length
    if length is None or length > max_bytes:
        response.close()  # the rest is never read; the connection is not reused
        declared = "no length" if length is None else f"{length} bytes"
        raise AnswerTooLarge(f"answer of {declared}, over the {max_bytes}-byte cap: not read")
    if length == 0:
        return b""
    try:
        return await response.content.readexactly(length)
    except asyncio.IncompleteReadError as error:  # the answer was cut
        raise aiohttp.ClientPayloadError(f"answer cut short after {len(error.partial)} of "
                                         f"{length} bytes") from None


def reason_of(body: bytes) -> str:
    """The reason word of a refusal's text ("reason: detail")."""
    return body.split(b":", 1)[0].strip().decode("ascii", "replace")


def verdict(status: int, body: bytes, authentic: bool) -> Verdict:
    """What to do with a non-200 answer of `status` and `body`, tagged or not."""
    if not authentic:
        return Verdict.RETRY
    if status in FINAL_STATUSES and reason_of(body) != DAMAGED:
        return Verdict.REFUSED
    return Verdict.RETRY
