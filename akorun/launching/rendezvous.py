"""Forming a run without a host list: ranks meet at one known address (as torchrun's c10d).

Every rank is started with the run's cluster file and ``--rendezvous HOST:PORT``
(or ``AKORUN_RENDEZVOUS``). The process that can bind that address (it is one of
this machine's; the first to bind it when several ranks share the machine)
serves the rendezvous: an aiohttp app with one route, ``POST /v1/rendezvous``,
for the start of the run only. Every rank, the serving one included, registers
there with the ``host:port`` it will listen on and the rank it asks for (from
``--rank`` or a rank variable: AKORUN_RANK, RANK, SLURM_PROCID,
JOB_COMPLETION_INDEX), or none. The answer waits until all ``cluster.workers``
ranks registered; then ranks asked for are kept, the others given in arrival
order, and every rank gets its rank and the list of every rank's ``host:port``:
the ``cluster.hosts`` of the run, after which the join proceeds as with a
cluster file that lists them (per-session keys from the run's secret).

Requests and answers are authenticated with a key derived from the run's
secret (``HKDF(secret, salt = run id, info = "ako rendezvous v1")``, keyed
BLAKE3 tags over each body; the answer's tag is bound to its request's), so
only holders of the cluster file register, and a rank accepts only a list its
run's rendezvous sent for its own request. Two processes asking for one rank,
a registration once the run is complete, or an address that is not
``HOST:PORT`` are user errors (one line, exit 2); a rendezvous that does not
complete within the join timeout is a failed run (exit 1).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from akorun.errors import RunError, UsageError
from akorun.transport.keys import hkdf_sha256, keyed_digest

ENV_ADDRESS = "AKORUN_RENDEZVOUS"
PATH = "/v1/rendezvous"
TAG_HEADER = "X-Ako-Rendezvous"
RETRY_S = 0.2
LINGER_S = 0.3  # the serving rank waits this long after the last answer went out


@dataclass(frozen=True)
class Joined:
    """What the rendezvous gave this process: its rank and every rank's ``host:port``."""

    rank: int
    hosts: tuple[str, ...]


def parse_address(text: str, source: str = "--rendezvous") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) -> (host, port); UsageError otherwise."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{source}: got {text!r}, expected HOST:PORT such as "
                         f"node01:29400 (the address where the ranks meet)")
    return host, int(port)


def address_from(flag: str | None, env: Mapping[str, str]) -> str | None:
    """The rendezvous address: the flag, else AKORUN_RENDEZVOUS; None for neither."""
    if flag:
        return flag
    return env.get(ENV_ADDRESS) or None


def route_address(host: str, port: int) -> str:
    """This machine's address on the way to `host` (what the others reach us at)."""
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_UDP)
    except OSError as error:
        raise UsageError(f"--rendezvous: cannot resolve {host!r}: "
                         f"{error.strerror or error}") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(address)  # UDP: no packet is sent, the route is chosen
        return str(probe.getsockname()[0])


def rendezvous_key(secret: bytes, run_id: bytes) -> bytes:
    return hkdf_sha256(secret, salt=run_id, info=b"ako rendezvous v1")


def request_tag(key: bytes, body: bytes) -> bytes:
    return keyed_digest(key, b"rendezvous request", body)


def answer_tag(key: bytes, request: bytes, status: int, body: bytes) -> bytes:
    return keyed_digest(key, b"rendezvous answer", request, str(status).encode(), body)


# --------------------------------------------------------------------------- serving


@dataclass
class _Entry:
    wanted: int | None
    endpoint: str
    arrival: int


@dataclass
class Registry:
    """The registrations of one run and, once all are in, the ranks (no I/O)."""

    world: int
    entries: dict[str, _Entry] = field(default_factory=dict)  # by process instance
    ranks: dict[str, int] = field(default_factory=dict)

    def register(self, instance: str, wanted: int | None, endpoint: str) -> None:
        """Add a process (again: nothing changes); ValueError for a taken or wrong rank
        or a full run."""
        if instance in self.entries:
            return
        if len(self.entries) >= self.world:
            raise ValueError(f"the run's {self.world} ranks have all registered")
        if wanted is not None:
            if not 0 <= wanted < self.world:
                raise ValueError(f"rank {wanted} is out of range 0..{self.world - 1}")
            for entry in self.entries.values():
                if entry.wanted == wanted:
                    raise ValueError(f"rank {wanted} is taken by the process at "
                                     f"{entry.endpoint}")
        for entry in self.entries.values():
            if entry.endpoint == endpoint:
                raise ValueError(f"{endpoint} is registered by another process")
        self.entries[instance] = _Entry(wanted, endpoint, len(self.entries))
        if len(self.entries) == self.world:
            self._assign()

    @property
    def complete(self) -> bool:
        return len(self.ranks) == self.world

    def _assign(self) -> None:
        taken = {e.wanted for e in self.entries.values() if e.wanted is not None}
        free = iter(r for r in range(self.world) if r not in taken)
        for instance, entry in sorted(self.entries.items(), key=lambda kv: kv[1].arrival):
            self.ranks[instance] = entry.wanted if entry.wanted is not None else next(free)

    def hosts(self) -> tuple[str, ...]:
        by_rank = {rank: self.entries[i].endpoint for i, rank in self.ranks.items()}
        return tuple(by_rank[r] for r in range(self.world))


class RendezvousServer:
    """The rendezvous of one run on an aiohttp app (started by the rank that can bind the
    address); answers each registration once every rank registered."""

    def __init__(self, key: bytes, run_id: str, world: int, timeout_s: float) -> None:
        self.key = key
        self.run_id = run_id
        self.registry = Registry(world)
        self.timeout_s = timeout_s
        self.changed = asyncio.Event()
        self.answered: set[str] = set()
        self.runner: Any = None

    async def start(self, host: str, port: int) -> bool:
        """Serve on (host, port); False when the address is not ours or already served."""
        from aiohttp import web

        app = web.Application(client_max_size=4096)
        app.router.add_post(PATH, self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port, reuse_address=False).start()
        except OSError:
            await runner.cleanup()
            return False
        self.runner = runner
        return True

    async def close_when_answered(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while len(self.answered) < self.registry.world and loop.time() < deadline:
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                break
        await asyncio.sleep(LINGER_S)  # the last answers leave the socket
        if self.runner is not None:
            await self.runner.cleanup()

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.read()
        try:
            given = bytes.fromhex(request.headers.get(TAG_HEADER, ""))
        except ValueError:
            given = b""
        expected = request_tag(self.key, body)
        if not secrets.compare_digest(given, expected):
            return web.Response(status=401)
        status, answer = self._answer_now(body)
        if status == 200 and not self.registry.complete:
            try:
                await asyncio.wait_for(self._completed(), self.timeout_s)
            except TimeoutError:
                have = len(self.registry.entries)
                status, answer = 504, {"error": f"only {have} of {self.registry.world} ranks "
                                                f"registered within {self.timeout_s:g} s"}
            else:
                status, answer = self._answer_now(body)
        data = json.dumps(answer).encode("utf-8")
        if status == 200:
            self.answered.add(json.loads(body)["instance"])
            self.changed.set()
        return web.Response(status=status, body=data, content_type="application/json",
                            headers={TAG_HEADER: answer_tag(self.key, expected, status,
                                                            data).hex()})

    async def _completed(self) -> None:
        while not self.registry.complete:
            self.changed.clear()
            await self.changed.wait()

    def _answer_now(self, body: bytes) -> tuple[int, dict[str, Any]]:
        try:
            asked = json.loads(body)
            if asked.get("run_id") != self.run_id:
                return 409, {"error": f"run {asked.get('run_id')} registered at the "
                                      f"rendezvous of run {self.run_id}"}
            instance = str(asked["instance"])
            wanted = asked.get("rank")
            self.registry.register(instance, None if wanted is None else int(wanted),
                                   str(asked["endpoint"]))
        except ValueError as error:
            return 409, {"error": str(error)}
        except (KeyError, TypeError):
            return 400, {"error": "not a rendezvous registration"}
        self.changed.set()
        if not self.registry.complete:
            return 200, {}
        return 200, {"rank": self.registry.ranks[instance],
                     "hosts": list(self.registry.hosts())}


# --------------------------------------------------------------------------- registering


async def _register(address: tuple[str, int], key: bytes, body: bytes,
                    deadline: float) -> dict[str, Any]:
    import aiohttp

    loop = asyncio.get_running_loop()
    tag = request_tag(key, body)
    host = f"[{address[0]}]" if ":" in address[0] else address[0]
    url = f"http://{host}:{address[1]}{PATH}"
    last = "nothing answered"
    async with aiohttp.ClientSession() as session:
        while loop.time() < deadline:
            try:
                async with session.post(url, data=body, headers={TAG_HEADER: tag.hex()},
                                        timeout=aiohttp.ClientTimeout(
                                            total=max(1.0, deadline - loop.time()))) as reply:
                    data = await reply.read()
                    status = reply.status
                    given = reply.headers.get(TAG_HEADER, "")
            except (aiohttp.ClientError, TimeoutError, OSError) as error:
                last = str(error) or type(error).__name__
                await asyncio.sleep(RETRY_S)
                continue
            if status == 401:
                raise UsageError(f"--rendezvous {address[0]}:{address[1]}: refused our "
                                 f"registration (401): this rank's cluster file is not the "
                                 f"run's (its secret or run id differs)")
            try:
                authentic = secrets.compare_digest(bytes.fromhex(given),
                                                   answer_tag(key, tag, status, data))
            except ValueError:
                authentic = False
            if not authentic:
                last = f"an answer without a valid tag (status {status})"
                await asyncio.sleep(RETRY_S)
                continue
            answer = json.loads(data)
            if status == 200:
                return dict(answer)
            if status == 504:
                raise RunError(f"rendezvous at {address[0]}:{address[1]}: {answer['error']}")
            raise UsageError(f"rendezvous at {address[0]}:{address[1]}: {answer['error']}")
    raise RunError(f"rendezvous at {address[0]}:{address[1]}: no answer within the join "
                   f"timeout ({last})")


async def _meet(address: tuple[str, int], *, key: bytes, run_id: str, world: int,
                wanted: int | None, endpoint: str, timeout_s: float) -> Joined:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    server = RendezvousServer(key, run_id, world, timeout_s)
    serving = await server.start(*address)
    body = json.dumps({"run_id": run_id, "instance": f"{os.getpid()}-{time.time_ns()}",
                       "nonce": secrets.token_hex(16), "rank": wanted,
                       "endpoint": endpoint}).encode("utf-8")
    try:
        answer = await _register(address, key, body, deadline)
    finally:
        if serving:
            await server.close_when_answered(deadline)
    hosts = tuple(str(h) for h in answer["hosts"])
    if len(hosts) != world or not 0 <= int(answer["rank"]) < world:
        raise RunError(f"rendezvous at {address[0]}:{address[1]}: an answer for "
                       f"{len(hosts)} ranks, the run has {world}")
    return Joined(int(answer["rank"]), hosts)


def meet(address: tuple[str, int], *, secret: bytes, run_id: str, run_id_bytes: bytes,
         world: int, wanted: int | None, endpoint: str, timeout_s: float) -> Joined:
    """Register `endpoint` (this rank's ``host:port``) at the rendezvous `address`,
    serving it if the address is this machine's and free; this process's rank and every
    rank's endpoint, once all `world` ranks registered."""
    return asyncio.run(_meet(address, key=rendezvous_key(secret, run_id_bytes), run_id=run_id,
                             world=world, wanted=wanted, endpoint=endpoint,
                             timeout_s=timeout_s))
