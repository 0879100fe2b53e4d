"""Who may speak to whom, in which session: every key of a rank and every seal it makes or checks.

This module owns authentication, both directions (docs/guide/security.md
section gives the argument):

- Pairwise keys: ``pair(i, j) = HKDF-SHA256(cluster secret, salt = run id,
  info = "ako pair v2" | min(i, j) | max(i, j))``. A `RankKeys` holds only the
  row of its own rank (the secret is dropped once the row is derived), so rank
  i holds no key that lets it speak as rank j to rank k; `write_rank_key_files`
  writes one such row per rank so that a host needs nothing else.
- Sessions: every start of a process draws a 16-byte nonce. A message from s to
  r is sealed with ``HKDF(pair(s, r), salt = run id, info = "ako session v2" |
  s | r | nonce(s) | nonce(r))``: it is valid only between these two instances.
  A receiver learns a peer's nonce from an authentic message bound to its own
  current nonce (or from a discovery answer bound to its own fresh request),
  and retires the previous one for good: nothing an earlier instance of a rank
  sent, and nothing sent to an earlier instance of this rank or in an earlier
  run, is accepted again.
- Seals: each request carries ``X-Ako-Auth``, a `Seal` (sender, receiver, both
  nonces, a counter, the BLAKE3 digest of what follows it and a keyed-BLAKE3
  tag over all of that and the path). The tag is checked before the server
  reads any body byte or reserves anything. Control requests must carry a
  counter not seen before in the session (a replay window); partials are
  idempotent by (sender, round, part) anyway. Every answer carries a tag keyed
  the other way and bound to the request's tag, status and body.
- Endorsements (``X-Ako-Relay``): a partial also carries, for every other
  rank k, a 16-byte tag over its header keyed with the session key to k, so
  that a peer holding it can forward it to k when its sender is lost and k
  can check it came, unchanged, from that sender (`Signer.endorse`,
  `RequestVerifier.endorsed`; akorun.runtime.recovery.relay).

Over 500 lines because keys, sessions, seals and endorsements share one key
schedule and one set of encodings: split apart, each half would re-derive or
re-parse what the other makes, and a mismatch between them is a security bug.
- Discovery, the first half of ``hello``: a hello sealed with the receiver
  nonce all zero asks a peer for its current nonce (the answer is bound to the
  asking request); it changes nothing on the server. The hello proper, and
  every later message, is then sealed for both instances' nonces.

`Sessions` is the one state both sides share; `Signer` is the sending face
(encode partials, seal requests, check answers), `RequestVerifier` the
receiving face (open seals, keep replay windows, seal answers).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import itertools
import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import blake3

from akocore.messages import Partial
from akorun.transport.wire import HEADER_SIZE, Header, Status, WireError, check_run, encode_bytes

AUTH_HEADER = "X-Ako-Auth"
PARTIAL_PATH = "/v1/partial"
SESSION_PATH = "/v1/hello"  # where a discovery seal asks a peer for its current nonce
STALE_SESSION = int(Status.STALE_SESSION)  # "Misdirected Request": for an earlier instance
NONCE_BYTES = 16
KEY_BYTES = 32
TAG_BYTES = 32
NO_NONCE = bytes(NONCE_BYTES)
SEAL_VERSION = 2
SEAL_FORMAT = "<BII16s16sQ32s"  # version, sender, receiver, nonces, counter, digest
SEAL_FIELDS_SIZE = struct.calcsize(SEAL_FORMAT)
SEAL_SIZE = SEAL_FIELDS_SIZE + TAG_BYTES
RANK_KEYS_KIND = "ako-rank-keys"
RANK_KEYS_VERSION = 1
RANK_KEY_FILE = "rank-{rank}.keys"
REPLAY_WINDOW = 1024  # control counters accepted below the highest seen (then: replays)
RELAY_HEADER = "X-Ako-Relay"  # a partial's endorsements for the sender's other peers
RELAY_TAG_BYTES = 16  # one truncated keyed-BLAKE3 tag per peer of the sender
_RELAY = b"ako relay v1\0"
ENDORSEMENT_CACHE = 256  # encoded partials whose endorsements a sealer remembers
_REQUEST = b"ako request v2\0"
_ANSWER = b"ako answer v2\0"


def hkdf_sha256(key: bytes, *, salt: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    """RFC 5869 HKDF with SHA-256 (extract, then expand), from the standard library."""
    if not key:
        raise ValueError("HKDF needs key material; the cluster secret is empty")
    prk = hmac.new(salt or bytes(32), key, hashlib.sha256).digest()
    out, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out += block
    return out[:length]


def pair_key(secret: bytes, run_id: bytes, a: int, b: int) -> bytes:
    """The static key ranks `a` and `b` (and only they) share."""
    low, high = sorted((a, b))
    return hkdf_sha256(secret, salt=run_id, info=b"ako pair v2" + struct.pack("<II", low, high))


def keyed_digest(key: bytes, *parts: bytes) -> bytes:
    """Keyed BLAKE3-256 (a MAC) over `parts`, each length-prefixed (no ambiguity)."""
    mac = blake3.blake3(key=key)
    for part in parts:
        mac.update(struct.pack("<Q", len(part)))
        mac.update(part)
    return mac.digest()


def digest(data: bytes | bytearray | memoryview) -> bytes:
    return blake3.blake3(data).digest()


@dataclass(frozen=True)
class RankKeys:
    """One rank's row of pairwise keys: enough to speak as itself, to each peer."""

    rank: int
    world: int
    run_id: bytes
    pairs: Mapping[int, bytes]

    @classmethod
    def from_secret(cls, secret: bytes, run_id: bytes, rank: int, world: int) -> RankKeys:
        return cls(rank, world, run_id, {peer: pair_key(secret, run_id, rank, peer)
                                         for peer in range(world) if peer != rank})

    def to_text(self) -> str:
        """The rank key file's text (JSON): this row only, never the cluster secret."""
        return json.dumps({"kind": RANK_KEYS_KIND, "version": RANK_KEYS_VERSION,
                           "run_id": self.run_id.hex(), "rank": self.rank, "world": self.world,
                           "pairs": {str(peer): key.hex()
                                     for peer, key in sorted(self.pairs.items())}}, indent=1)

    @classmethod
    def from_text(cls, text: str, source: str) -> RankKeys:
        """Parse a rank key file; ValueError (one line naming `source`) if it is not one."""
        try:
            record = json.loads(text)
            if record.get("kind") != RANK_KEYS_KIND:
                raise ValueError("not an akorun rank key file")
            if record.get("version") != RANK_KEYS_VERSION:
                raise ValueError(f"version {record.get('version')!r}, expected "
                                 f"{RANK_KEYS_VERSION}")
            rank, world = int(record["rank"]), int(record["world"])
            pairs = {int(peer): bytes.fromhex(key) for peer, key in record["pairs"].items()}
            run_id = bytes.fromhex(record["run_id"])
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{source}: {error}") from None
        if sorted(pairs) != [peer for peer in range(world) if peer != rank] or \
                any(len(key) != KEY_BYTES for key in pairs.values()):
            raise ValueError(f"{source}: expected one {KEY_BYTES}-byte key per peer of rank "
                             f"{rank} of {world}")
        return cls(rank, world, run_id, pairs)

    def pair(self, peer: int) -> bytes:
        key = self.pairs.get(peer)
        if key is None:
            raise WireError(f"rank {peer} is not a peer of rank {self.rank}",
                            Status.BAD_SIGNATURE)
        return key


@dataclass(frozen=True)
class Seal:
    """What authenticates one request: who, to whom, in which session, over what."""

    sender: int
    receiver: int
    sender_nonce: bytes
    receiver_nonce: bytes  # NO_NONCE: a discovery request
    counter: int
    digest: bytes  # BLAKE3 of the body (control) or of the wire header (partial)
    tag: bytes = b""

    def fields(self) -> bytes:
        return struct.pack(SEAL_FORMAT, SEAL_VERSION, self.sender, self.receiver,
                           self.sender_nonce, self.receiver_nonce, self.counter, self.digest)

    def text(self) -> str:
        return base64.b64encode(self.fields() + self.tag).decode("ascii")

    @classmethod
    def parse(cls, text: str | None) -> Seal:
        """WireError 401 unless `text` is a well-formed seal."""
        if not text:
            raise WireError(f"no {AUTH_HEADER}: unauthenticated", Status.BAD_SIGNATURE)
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise WireError(f"{AUTH_HEADER} is not base64", Status.BAD_SIGNATURE) from None
        if len(raw) != SEAL_SIZE:
            raise WireError(f"{AUTH_HEADER} has {len(raw)} bytes, expected {SEAL_SIZE}",
                            Status.BAD_SIGNATURE)
        version, sender, receiver, sender_nonce, receiver_nonce, counter, body = \
            struct.unpack_from(SEAL_FORMAT, raw)
        if version != SEAL_VERSION:
            raise WireError(f"seal version {version}, expected {SEAL_VERSION}",
                            Status.BAD_SIGNATURE)
        return cls(sender, receiver, sender_nonce, receiver_nonce, counter, body,
                   raw[SEAL_FIELDS_SIZE:])

    @property
    def discovery(self) -> bool:
        return self.receiver_nonce == NO_NONCE


@dataclass
class _Window:
    """Counters of one peer instance's control requests seen lately (replay detection)."""

    highest: int = 0
    seen: set[int] = field(default_factory=set)

    def take(self, counter: int) -> bool:
        if counter <= self.highest - REPLAY_WINDOW or counter in self.seen:
            return False
        self.seen.add(counter)
        if counter > self.highest:
            self.highest = counter
            self.seen = {c for c in self.seen if c > counter - REPLAY_WINDOW}
        return True


class Sessions:
    """This process's nonce, its peers' current nonces and the session keys between them."""

    def __init__(self, keys: RankKeys, nonce: bytes | None = None) -> None:
        self.keys = keys
        self.rank = keys.rank
        self.nonce = nonce if nonce is not None else os.urandom(NONCE_BYTES)
        self.peer_nonce: dict[int, bytes] = {}
        self.retired: dict[int, set[bytes]] = {}
        self._keys: dict[tuple[int, int, bytes, bytes], bytes] = {}
        self._windows: dict[tuple[int, bytes], _Window] = {}
        self._counter = itertools.count(1)

    def next_counter(self) -> int:
        return next(self._counter)

    def key(self, sender: int, receiver: int, sender_nonce: bytes, receiver_nonce: bytes) -> bytes:
        """The key of messages from `sender` to `receiver` between these two instances."""
        index = (sender, receiver, sender_nonce, receiver_nonce)
        key = self._keys.get(index)
        if key is None:
            peer = receiver if sender == self.rank else sender
            info = b"ako session v2" + struct.pack("<II", sender, receiver) + sender_nonce \
                + receiver_nonce
            key = hkdf_sha256(self.keys.pair(peer), salt=self.keys.run_id, info=info)
            if len(self._keys) > 4096:
                self._keys.clear()
            self._keys[index] = key
        return key

    def learn(self, peer: int, nonce: bytes) -> bool:
        """`nonce` is `peer`'s current instance (authentic and fresh): adopt it and retire
        the one before; False if it was retired already (an earlier instance)."""
        retired = self.retired.setdefault(peer, set())
        if nonce in retired or nonce == NO_NONCE:
            return False
        current = self.peer_nonce.get(peer)
        if current != nonce:
            if current is not None:
                retired.add(current)
            self.peer_nonce[peer] = nonce
        return True

    def is_retired(self, peer: int, nonce: bytes) -> bool:
        return nonce in self.retired.get(peer, ())

    def take_counter(self, peer: int, nonce: bytes, counter: int) -> bool:
        """False if this control counter of this instance of `peer` was seen (a replay)."""
        return self._windows.setdefault((peer, nonce), _Window()).take(counter)


def request_tag(key: bytes, path: str, seal: Seal) -> bytes:
    return keyed_digest(key, _REQUEST, path.encode("utf-8"), seal.fields())


def answer_tag(key: bytes, request: bytes, status: int, body: bytes) -> bytes:
    return keyed_digest(key, _ANSWER, request, struct.pack("<I", status), digest(body))


def endorsement_tag(key: bytes, header: bytes) -> bytes:
    """The tag by which a partial's sender vouches for it to one peer (see `Signer.endorse`)."""
    return blake3.blake3(_RELAY + header, key=key).digest(RELAY_TAG_BYTES)  # one pass


@dataclass
class RunKeys:
    """The keys and sessions of one process; `wire_hash` is None until the node exists."""

    keys: RankKeys
    sessions: Sessions = field(init=False)
    wire_hash: bytes | None = None

    def __post_init__(self) -> None:
        self.sessions = Sessions(self.keys)

    @classmethod
    def from_secret(cls, secret: bytes, run_id: bytes, rank: int, world: int,
                    wire_hash: bytes | None = None) -> RunKeys:
        return cls(RankKeys.from_secret(secret, run_id, rank, world), wire_hash)

    @property
    def rank(self) -> int:
        return self.keys.rank

    @property
    def run_id(self) -> bytes:
        return self.keys.run_id

    def bind_wire_hash(self, wire_hash: bytes) -> None:
        self.wire_hash = wire_hash


class Signer:
    """The sending side: encodes partials, seals requests, checks their answers."""

    def __init__(self, keys: RunKeys) -> None:
        self.keys = keys
        self.sessions = keys.sessions

    def encode(self, message: Partial) -> bytes:
        wire_hash = self.keys.wire_hash
        assert wire_hash is not None, "no partial is sent before the node is built"
        return encode_bytes(message, run_id=self.keys.run_id, config_hash=wire_hash)

    def knows(self, dest: int) -> bool:
        """A session with `dest` can be sealed (its current nonce is known)."""
        return dest in self.sessions.peer_nonce

    def seal(self, dest: int, path: str, body_digest: bytes, *, discovery: bool = False) -> Seal:
        sessions = self.sessions
        receiver_nonce = NO_NONCE if discovery else sessions.peer_nonce.get(dest, NO_NONCE)
        seal = Seal(sessions.rank, dest, sessions.nonce, receiver_nonce,
                    sessions.next_counter(), body_digest)
        key = sessions.key(seal.sender, dest, seal.sender_nonce, receiver_nonce)
        return replace(seal, tag=request_tag(key, path, seal))

    def seal_partial(self, dest: int, path: str, data: bytes) -> Seal:
        """The seal of one encoded partial to `dest`: over its header, which commits to the body."""
        return self.seal(dest, path, digest(memoryview(data)[:HEADER_SIZE]))

    def answer_is_authentic(self, seal: Seal, status: int, body: bytes,
                            given: str | None) -> bool:
        """The answer to `seal`'s request came from the instance it was sealed for."""
        if not given:
            return False
        try:
            tag = base64.b64decode(given, validate=True)
        except (binascii.Error, ValueError):
            return False
        key = self.sessions.key(seal.receiver, seal.sender, seal.receiver_nonce,
                                seal.sender_nonce)
        return hmac.compare_digest(answer_tag(key, seal.tag, status, body), tag)

    def learn(self, peer: int, nonce: bytes) -> bool:
        return self.sessions.learn(peer, nonce)

    def endorse(self, header: bytes) -> bytes:
        """Endorsements of one encoded partial (its `header`, which commits to the body): one
        `RELAY_TAG_BYTES` tag per other rank in rank order, keyed with the session key from
        this instance to that rank's current instance (zeros for a rank whose nonce is not
        known). Sent to every destination alike: rank k can check only its own tag, so a
        peer that holds the message can forward it to k (akorun.runtime.recovery.relay) and k can
        tell it came from this rank, unchanged; no rank can make or alter one for another."""
        sessions = self.sessions
        tags = []
        for peer in range(self.keys.keys.world):
            if peer == sessions.rank:
                continue
            nonce = sessions.peer_nonce.get(peer)
            if nonce is None:
                tags.append(bytes(RELAY_TAG_BYTES))
                continue
            key = sessions.key(sessions.rank, peer, sessions.nonce, nonce)
            tags.append(endorsement_tag(key, header))
        return b"".join(tags)


@dataclass(frozen=True)
class Opened:
    """A request whose seal checked out: its authenticated sender and seal."""

    seal: Seal

    @property
    def sender(self) -> int:
        return self.seal.sender


class RequestVerifier:
    """The receiving side: opens seals, keeps replay windows, seals answers."""

    def __init__(self, keys: RunKeys, *, world: int) -> None:
        self.keys = keys
        self.sessions = keys.sessions
        self.world = world

    @property
    def ready(self) -> bool:
        """Partials can be checked (the wire hash is known)."""
        return self.keys.wire_hash is not None

    def open(self, given: str | None, path: str, *, control: bool) -> Opened:
        """Check a request's seal from its HTTP header alone (before any body byte).

        WireError 401: missing, malformed, forged, for another rank, from an earlier
        instance of the sender, or (control) a replay; WireError 421 (`STALE_SESSION`):
        sealed for an earlier instance of this rank (the sender should rediscover).
        A discovery seal is valid only on `SESSION_PATH`."""
        seal = Seal.parse(given)
        sessions = self.sessions
        rank = sessions.rank
        if seal.receiver != rank:
            raise WireError(f"sealed for rank {seal.receiver}, this is rank {rank}",
                            Status.BAD_SIGNATURE)
        if seal.sender == rank or not 0 <= seal.sender < self.world:
            raise WireError(f"sender {seal.sender} is not a peer of rank {rank}",
                            Status.BAD_SIGNATURE)
        if seal.discovery and path != SESSION_PATH:
            raise WireError("sealed for no session: discover this rank's nonce first",
                            Status.STALE_SESSION)
        if not seal.discovery and seal.receiver_nonce != sessions.nonce:
            raise WireError("sealed for an earlier instance of this rank (stale session)",
                            Status.STALE_SESSION)
        if sessions.is_retired(seal.sender, seal.sender_nonce):
            raise WireError(f"from an earlier instance of rank {seal.sender} (replay)",
                            Status.BAD_SIGNATURE)
        key = sessions.key(seal.sender, rank, seal.sender_nonce, seal.receiver_nonce)
        if not hmac.compare_digest(request_tag(key, path, seal), seal.tag):
            raise WireError(f"bad seal: not made by rank {seal.sender} for this session",
                            Status.BAD_SIGNATURE)
        if seal.discovery:
            return Opened(seal)  # changes nothing here
        if control and not sessions.take_counter(seal.sender, seal.sender_nonce, seal.counter):
            raise WireError(f"request {seal.counter} of rank {seal.sender} seen before (replay)",
                            Status.BAD_SIGNATURE)
        sessions.learn(seal.sender, seal.sender_nonce)
        return Opened(seal)

    def check_digest(self, opened: Opened, data: bytes | bytearray | memoryview) -> None:
        """WireError 401 unless `data` is what the seal's digest commits to."""
        if not hmac.compare_digest(digest(data), opened.seal.digest):
            raise WireError("body or header is not the one the seal commits to",
                            Status.BAD_SIGNATURE)

    def seal_answer(self, opened: Opened, status: int, body: bytes) -> str:
        seal = opened.seal
        key = self.sessions.key(self.sessions.rank, seal.sender, seal.receiver_nonce,
                                seal.sender_nonce)
        return base64.b64encode(answer_tag(key, seal.tag, status, body)).decode("ascii")

    def endorsed(self, origin: int, origin_nonce: bytes, header: bytes, tags: bytes) -> bool:
        """`header` (of a partial relayed by a third rank) was endorsed by instance
        `origin_nonce` of rank `origin` for this instance of this rank (`Signer.endorse`)."""
        sessions = self.sessions
        rank = sessions.rank
        if origin == rank or not 0 <= origin < self.world or len(origin_nonce) != NONCE_BYTES \
                or len(tags) != (self.world - 1) * RELAY_TAG_BYTES:
            return False
        index = rank if rank < origin else rank - 1
        given = tags[index * RELAY_TAG_BYTES:(index + 1) * RELAY_TAG_BYTES]
        if given == bytes(RELAY_TAG_BYTES):
            return False
        key = sessions.key(origin, rank, origin_nonce, sessions.nonce)
        return hmac.compare_digest(endorsement_tag(key, header), given)

    def check_run(self, header: Header) -> None:
        """WireError (409) unless the partial belongs to this run and this config."""
        wire_hash = self.keys.wire_hash
        assert wire_hash is not None, "partials are admitted only once the node is built"
        check_run(header, self.keys.run_id, wire_hash)


class PartialSealer:
    """What a partial's sender (akorun.transport.sender.PeerSender) needs: a seal per
    attempt, made with
    the destination's current session, and the check of the receiver's acknowledgement."""

    def __init__(self, signer: Signer, path: str) -> None:
        self.signer = signer
        self.path = path
        self._endorsements: dict[bytes, str] = {}  # header -> RELAY_HEADER text (a few)

    def seal(self, dest: int, data: bytes) -> Seal:
        return self.signer.seal_partial(dest, self.path, data)

    def endorsements(self, data: bytes) -> str:
        """The `RELAY_HEADER` text of one encoded partial, computed once for all its
        destinations (a small cache keyed by the header)."""
        header = bytes(memoryview(data)[:HEADER_SIZE])
        text = self._endorsements.get(header)
        if text is None:
            if len(self._endorsements) >= ENDORSEMENT_CACHE:
                self._endorsements.pop(next(iter(self._endorsements)))
            text = base64.b64encode(self.signer.endorse(header)).decode("ascii")
            self._endorsements[header] = text
        return text

    def acknowledged(self, seal: Seal, duplicate: bool, given: str | None) -> bool:
        """The 200 came from the instance the partial was sealed for, about this request."""
        return self.signer.answer_is_authentic(seal, 200, ack_body(duplicate), given)

    def answered(self, seal: Seal, status: int, body: bytes, given: str | None) -> bool:
        """A non-200 answer (its `status` and `body`) came from the instance the partial
        was sealed for, about this request (akorun.transport.answers: only then is it acted on)."""
        return self.signer.answer_is_authentic(seal, status, body, given)


def ack_body(duplicate: bool) -> bytes:
    """What a partial's authenticated acknowledgement asserts: taken, or a duplicate."""
    return b"duplicate" if duplicate else b"accepted"


def rank_key_file(directory: str | os.PathLike[str], rank: int | str) -> Path:
    return Path(directory) / RANK_KEY_FILE.format(rank=rank)


def write_rank_key_files(directory: str | os.PathLike[str], secret: bytes, run_id: bytes,
                         world: int) -> list[Path]:
    """One owner-only (0600) key file per rank in `directory` (made 0700), each holding only
    that rank's row of pair keys: a host given its own file cannot speak for another rank."""
    folder = Path(directory)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    written = []
    for rank in range(world):
        target = rank_key_file(folder, rank)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(RankKeys.from_secret(secret, run_id, rank, world).to_text() + "\n")
        os.chmod(target, 0o600)
        written.append(target)
    return written


def read_rank_keys(path: str | os.PathLike[str]) -> RankKeys:
    """A rank key file written by `write_rank_key_files`; ValueError (one line) otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"{path}: cannot read the rank key file: "
                         f"{error.strerror or error}") from None
    return RankKeys.from_text(text, str(path))


def restrict_new_files() -> None:
    """Files and folders this process creates from now on are its owner's only
    (0600/0700): checkpoints, parameters, results and logs hold the model."""
    os.umask(0o077)
