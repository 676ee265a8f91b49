"""Upstream's approximate prefix cache (``approx-prefix-cache-producer``; before v1.5 part of
``prefix-cache-scorer``) as a lifecycle plugin: ``prepare`` hashes the request's prompt into blocks
once and writes, per pod, how many of its first blocks the pod probably holds (:data:`PREFIX_MATCH`,
what ``prefix-cache-scorer`` and ``prefix-cache-affinity-filter`` read); ``picked`` records the blocks
for the chosen pod. The index (:class:`~pointsman_picker.scheduling.prefix_index.PrefixIndex`) is the
plugin's state: a config reload with the same parameters keeps it.

Pickers share what they record: each block a pod newly got (or that was last announced more than
``announce_every`` seconds ago) waits in :meth:`PrefixCacheProducer.outbox` until the picker's Redis
side takes it (:meth:`drain`) and publishes it; what the other pickers announced comes in through
:meth:`learn`. Without Redis the outbox only drops its oldest entries past ``outbox_limit``.

``autoTune`` takes the block size (tokens) and each pod's LRU capacity (``num_gpu_blocks``) from the
pods' ``vllm:cache_config_info`` when they export it, as upstream does. A pod missing from the pool's
candidates at two purges in a row (``purge_every`` seconds apart) is forgotten. Pure: time comes in as
arguments.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from math import exp
from typing import ClassVar, NamedTuple

from pointsman_picker.scheduling.assignments import POSITIONS
from pointsman_picker.scheduling.contracts import RequestPlugin, Ticket
from pointsman_picker.scheduling.prefix_index import BlockHasher, PrefixIndex
from pointsman_picker.scheduling.prompt import CHARS_PER_TOKEN, prompt_bytes
from pointsman_picker.scheduling.types import CycleState, DataKey, Pods, SchedulingRequest


class PrefixMatch(NamedTuple):
    """One request's prompt blocks and, per pod address, how many of the first ones it holds."""

    hashes: tuple[int, ...]
    matched: Mapping[str, int]
    pods: Pods  # the pods as prepared: what ``picked`` reads the chosen pod's capacity from


PREFIX_MATCH: DataKey[PrefixMatch] = DataKey("prefix match")
NO_MATCH = PrefixMatch((), {}, ())
# The recent requests that began with this request's first block, in pods' shares of the traffic (their
# share times the pods prepared): below 1, the requests sharing its prefix fit on one pod (a prompt
# group's system prompt); above, they need several (a system prompt every conversation starts with).
PREFIX_TRAFFIC: DataKey[float] = DataKey("prefix traffic")


class Announcement(NamedTuple):
    """``pod`` holds the blocks ``hashes`` as of ``at``: what one picker tells the others."""

    pod: str
    hashes: tuple[int, ...]
    at: float


# upstream's defaults: vLLM's 16-token blocks, 256 blocks matched at most, and the blocks an H100 holds
# for Llama-3.1-8B (64 GB of KV cache at 128 KB a token, in 16-token blocks).
DEFAULT_BLOCK_TOKENS = 16
DEFAULT_MAX_BLOCKS = 256
DEFAULT_CAPACITY = 31_250


class PrefixCacheProducer(RequestPlugin):
    type_name: ClassVar[str] = "approx-prefix-cache-producer"
    produces = (PREFIX_MATCH, PREFIX_TRAFFIC)
    consumes = (POSITIONS,)

    def __init__(
        self,
        *,
        auto_tune: bool = True,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        block_chars: int = 0,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        max_tokens: int = 0,
        capacity: int = DEFAULT_CAPACITY,
        announce_every: float = 60.0,
        outbox_limit: int = 100_000,
        purge_every: float = 10.0,
    ) -> None:
        """``block_chars`` (upstream's ``hashBlockSize`` and, before v1.4, ``blockSize``), when
        positive, is the block in characters instead of ``block_tokens`` at four characters a token;
        ``max_tokens``, when positive, bounds the matched blocks instead of ``max_blocks``."""
        if block_tokens <= 0 and block_chars <= 0:
            raise ValueError("blockSizeTokens must be positive")
        if capacity <= 0:
            raise ValueError(f"lruCapacityPerServer must be positive, got {capacity}")
        self.auto_tune = auto_tune
        self._chars = block_chars if block_chars > 0 else block_tokens * CHARS_PER_TOKEN
        self._max_blocks = max_blocks
        self._max_tokens = max_tokens
        self.capacity = capacity
        self._announce_every = announce_every
        self.index = PrefixIndex()
        self._hashes = BlockHasher()
        self._outbox: deque[Announcement] = deque()
        self._outbox_limit = outbox_limit
        self._queued = 0  # hashes in the outbox
        self.dropped = 0  # hashes the outbox let go unannounced
        self._purge_every = purge_every
        self._purged = float("-inf")
        self._absent: set[str] = set()
        self.traffic = FirstBlockTraffic()

    def block_chars(self, pods: Pods) -> int:
        """The block in characters: the pods' block size when auto-tuned and known (all pods of a pool
        share one, so the first pod's), else the configured one."""
        if self.auto_tune and pods:
            tokens = pods[0].block_size
            if tokens > 0:
                return tokens * CHARS_PER_TOKEN
        return self._chars

    def prepare(self, request: SchedulingRequest, pods: Pods, state: CycleState, now: float) -> Pods:
        if now - self._purged >= self._purge_every:
            self._purge(state[POSITIONS], now)
        chars = self.block_chars(pods)
        blocks = self._max_blocks
        if self._max_tokens > 0:
            blocks = self._max_tokens * CHARS_PER_TOKEN // chars
        body = request.body
        salt = body.get("cache_salt")
        hashes = self._hashes(
            request.target_model or "",
            salt if isinstance(salt, str) else "",
            prompt_bytes(body),
            chars,
            blocks,
        )
        state[PREFIX_MATCH] = PrefixMatch(hashes, self.index.match(hashes), pods) if hashes else NO_MATCH
        if hashes:
            state[PREFIX_TRAFFIC] = self.traffic.add(hashes[0], now) * len(pods)
        return pods

    def picked(self, ticket: Ticket, request: SchedulingRequest, state: CycleState) -> None:
        match: PrefixMatch = state.get(PREFIX_MATCH, NO_MATCH)
        if not match.hashes:
            return
        capacity = self.capacity
        if self.auto_tune:
            i = state[POSITIONS].get(ticket.address)
            blocks = match.pods[i].num_gpu_blocks if i is not None else 0
            capacity = blocks if blocks > 0 else capacity
        new = self.index.add(ticket.address, match.hashes, capacity, ticket.at, self._announce_every)
        if new:
            self._queue(Announcement(ticket.address, tuple(new), ticket.at))

    def note(self, state: CycleState) -> str:
        match: PrefixMatch = state.get(PREFIX_MATCH, NO_MATCH)
        if not match.hashes:
            return ""
        return f"prefix {max(match.matched.values(), default=0)}/{len(match.hashes)}"

    def _queue(self, announcement: Announcement) -> None:
        self._outbox.append(announcement)
        self._queued += len(announcement.hashes)
        while self._queued > self._outbox_limit:
            old = self._outbox.popleft()
            self._queued -= len(old.hashes)
            self.dropped += len(old.hashes)

    def outbox(self) -> int:
        """The hashes waiting to be announced."""
        return self._queued

    def drain(self, limit: int) -> list[Announcement]:
        """The oldest announcements waiting, at most ``limit`` hashes in all (an announcement larger
        than that is split), taken out of the outbox."""
        out: list[Announcement] = []
        room = limit
        while self._outbox and room > 0:
            first = self._outbox[0]
            if len(first.hashes) <= room:
                self._outbox.popleft()
                out.append(first)
                room -= len(first.hashes)
            else:
                out.append(Announcement(first.pod, first.hashes[:room], first.at))
                self._outbox[0] = Announcement(first.pod, first.hashes[room:], first.at)
                room = 0
        self._queued -= limit - room
        return out

    def undrain(self, announcements: Sequence[Announcement]) -> None:
        """Put back what :meth:`drain` gave (it could not be published), ahead of what came since."""
        self._outbox.extendleft(reversed(announcements))
        self._queued += sum(len(a.hashes) for a in announcements)
        while self._queued > self._outbox_limit:
            old = self._outbox.popleft()
            self._queued -= len(old.hashes)
            self.dropped += len(old.hashes)

    def learn(self, announcements: Iterable[Announcement]) -> None:
        """What other pickers announced, in the order they announced it."""
        for a in announcements:
            self.index.learn(a.pod, a.hashes, a.at, self.capacity)

    def _purge(self, positions: Mapping[str, int], now: float) -> None:
        self._purged = now
        gone = {pod for pod in self.index.pods() if pod not in positions}
        for pod in gone & self._absent:
            self.index.remove(pod)
        self._absent = gone - self._absent


class FirstBlockTraffic:
    """How much of the recent traffic began with a given first block: counts that decay by ``e`` every
    ``tau`` seconds, for every request and per first-block hash (at most ``limit`` of them, the least
    recently seen forgotten first). A first block's hash names the model, the salt and the prompt's
    first block, so prompts sharing it share a prefix. Memory: ``limit`` entries of a dict (an int and
    a tuple of two floats, ~150 bytes), 600 KB at the default."""

    def __init__(self, tau: float = 10.0, limit: int = 4096) -> None:
        self._tau = tau
        self._limit = limit
        self._total = 0.0
        self._at = float("-inf")
        self._counts: dict[int, tuple[float, float]] = {}  # first block -> (count, as of)

    def add(self, first: int, now: float) -> float:
        """Count a request beginning with ``first`` at ``now``; the share of the recent requests (this
        one included) that began so."""
        self._total = self._total * self._decay(now, self._at) + 1.0
        self._at = max(self._at, now)
        count, at = self._counts.pop(first, (0.0, now))
        count = count * self._decay(now, at) + 1.0
        self._counts[first] = (count, max(at, now))
        if len(self._counts) > self._limit:
            del self._counts[next(iter(self._counts))]
        return min(1.0, count / self._total)

    def _decay(self, now: float, at: float) -> float:
        return exp(-(now - at) / self._tau) if now > at else 1.0
