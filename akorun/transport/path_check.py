"""Whether the path to one peer carries akorun's data path, or only HTTP.

Partials go over akorun's data path (akorun.transport.datapath): binary requests on
the peer's HTTP port. A proxy or middlebox in front of a peer that waits for an HTTP
request line holds such bytes and answers nothing until its own timeout (often a
minute or more), while HTTP through it works. A `DataPathCheck` per peer finds that in
bounded time and says so once:

- until the data path has answered once, a data-path request still unanswered after
  `CHECK_AFTER_S` starts one check (shared by the requests then waiting);
- the check sends a probe on a connection of its own
  (`akorun.transport.datapath_client.DataLink.probe`): answered within
  `PROBE_TIMEOUT_S`, the path is good (a big body is simply still on its way);
- unanswered, while a plain HTTP GET of the peer's ``/status`` through the same path
  answers within `PROBE_TIMEOUT_S`: the path carries only HTTP. The sender logs one
  line and sends this peer's partials as HTTP POSTs from then on (the requests still
  waiting on the data path are abandoned and go again: exactly once holds);
- neither answering (a paused or cut-off peer) is no verdict: the data path is kept and
  the next slow request checks again.

So a run behind such a middlebox falls back within `CHECK_AFTER_S` + 2 x
`PROBE_TIMEOUT_S` (7 s) of its first partial. A middlebox that appears after the data
path has answered once is not looked for (its requests fail and are retried on the
data path: a known limit).
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

import aiohttp

from akorun.transport.datapath_client import DataLink

log = logging.getLogger("akorun")

CHECK_AFTER_S = 3.0  # a data-path request unanswered this long (none answered yet): check
PROBE_TIMEOUT_S = 2.0  # for the probe's answer, and for the HTTP GET's


def status_url(partial_url: str) -> str:
    """The peer's ``/status`` URL on the same scheme, host and port as `partial_url`."""
    parts = urlsplit(partial_url)
    return f"{parts.scheme}://{parts.netloc}/status"


class DataPathCheck:
    """Whether partials to `dest` keep to the data path (see the module docstring)."""

    def __init__(self, dest: int, url: str, session: aiohttp.ClientSession,
                 ssl: object = True) -> None:
        self.dest = dest
        self.url = status_url(url)
        self.session = session
        self.ssl = ssl
        self.verified = False  # the data path answered (a request or a probe)
        self.http_only = False  # found: the path carries only HTTP
        self._check: asyncio.Task[bool] | None = None

    async def falls_back(self, link: DataLink) -> bool:
        """Check the path (once for every request waiting now); True when it carries
        only HTTP (then the caller stops using `link`)."""
        if self.verified or self.http_only:
            return self.http_only
        if self._check is None or self._check.done():
            self._check = asyncio.ensure_future(self._run(link))
        return await asyncio.shield(self._check)

    async def _run(self, link: DataLink) -> bool:
        verdict = await link.probe(PROBE_TIMEOUT_S)
        if verdict is not False:  # answered (the path is good), or no connection at all
            self.verified = verdict is True
            return False
        if not await self._http_answers():
            return False  # the peer answers nothing (paused, cut off): no verdict
        self.http_only = True
        log.warning("peer %d: the data path gets no answer while HTTP does (a proxy or "
                    "middlebox on the path that carries only HTTP?): its partials go as "
                    "HTTP POSTs from now on", self.dest)
        return True

    async def _http_answers(self) -> bool:
        try:
            async with self.session.get(
                    self.url, timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
                    ssl=self.ssl, allow_redirects=False) as response:  # type: ignore[arg-type]
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False
