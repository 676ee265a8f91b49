"""From scrape outcomes to the pod state the collector publishes. Pure: time comes in as ``now``.

Rules (docs/upstream-spec.md §4, the model-server protocol):
- A field the page did not give keeps its previous value and its update time (upstream's partial
  updates); ``field_times`` says when each was last read. The LoRA fields count as read when the page
  had a usable LoRA series, idle ones included (an idle series says "nothing loaded changed").
- ``page.lora is None`` (no LoRA family, or only idle series) keeps the previous adapter sets and
  max_lora: the last-known adapter set rule. ``page.lora_error`` leaves the LoRA fields as they were
  while queue and KV still update.
- One departure from upstream: while a pod has never reported a max_lora (0), the max_lora of its idle
  series is taken. Upstream leaves such a pod at 0 slots, so until it serves its first adapter it is
  never "available" to LoRA affinity and the first pod that loaded any adapter draws them all.
- Prefix cache: the hit rate is hits over queries (tokens) between the oldest kept reading of the
  counters within ``window`` seconds and this one; readings are kept a tenth of the window apart, so a
  pod holds at most eleven. A counter that went down (the server restarted) starts the window again.
  A window without a query keeps the last rate; before the first window's rate, the rate since the
  server started (0 before any query). A page with the older engines' gauge of the hit rate
  instead gives that (vLLM V0: since the server started). ``block_size`` and ``num_gpu_blocks`` come
  from the cache-config info series, and stand while a page does not give them.
- Health: a pod is published unhealthy, with a ``reason``, until its first good scrape, after
  ``max_failures`` failed scrapes in a row, or when its last good scrape is older than ``staleness``.
  The next good scrape makes it healthy again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pointsman_shared.model_server import PageMetrics, PrefixCounters
from pointsman_shared.snapshot import FieldTimes, PodSnapshot

# Reasons of unhealthy pods besides the scrape error reasons (errors.SCRAPE_REASONS).
PENDING = "pending"  # not scraped yet
TIMEOUT = "timeout"  # the scrape reason of an answer later than collector.timeout
STALE = "stale"  # no good scrape within the staleness window, without a failure to blame


# Over how long the prefix-cache hit rate is worked out from the counters (collector.prefixCacheWindow).
PREFIX_WINDOW = 30.0


@dataclass(frozen=True, slots=True)
class Reading:
    """The prefix-cache counters as read at ``at``."""

    at: float
    queries: float
    hits: float


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    max_failures: int = 3
    staleness: float = 2.0


@dataclass(frozen=True, slots=True)
class PodState:
    """What the collector knows about one pod: the snapshot to publish and the failure streak."""

    snapshot: PodSnapshot
    failures: int = 0  # failed scrapes in a row
    error: str = ""  # reason of the latest failed scrape; empty after a good one
    good: bool = False  # whether any scrape has succeeded, i.e. whether the snapshot holds data
    readings: tuple[Reading, ...] = ()  # the prefix-cache counters over the window, oldest first

    @property
    def attempted(self) -> bool:
        return self.good or self.failures > 0


def new_pod(address: str) -> PodState:
    return PodState(PodSnapshot(address=address, healthy=False, reason=PENDING))


def on_page(state: PodState, page: PageMetrics, now: float, window: float = PREFIX_WINDOW) -> PodState:
    """A good scrape: merge the page into the previous snapshot; the pod is healthy."""
    prev = state.snapshot
    readings = state.readings
    hit_rate = prev.prefix_cache_hit_rate
    if page.prefix_cache is not None:
        readings, rate = _windowed(readings, page.prefix_cache, now, window)
        if rate is not None:
            hit_rate = rate
        elif hit_rate is None:
            # No rate over a window yet: since the server started (0 before any query), so a pod
            # that exports the counters is never taken for one that does not.
            counters = page.prefix_cache
            hit_rate = min(1.0, counters.hits / counters.queries) if counters.queries > 0 else 0.0
    elif page.prefix_cache_hit_rate is not None:
        hit_rate = page.prefix_cache_hit_rate
    lora = page.lora
    times = prev.field_times
    # The constructors, not the slots' own setters: those saved about 2% of a scrape, under the
    # bench's noise (docs/decisions/slot-setters.md). A field added to PodSnapshot needs its line here: a
    # test made from the field list fails until it has one.
    snapshot = PodSnapshot(
        address=prev.address,
        waiting=prev.waiting if page.waiting is None else page.waiting,
        running=prev.running if page.running is None else page.running,
        kv_cache_usage=prev.kv_cache_usage if page.kv_cache_usage is None else page.kv_cache_usage,
        prefix_cache_hit_rate=hit_rate,
        block_size=prev.block_size if page.block_size is None else page.block_size,
        num_gpu_blocks=prev.num_gpu_blocks if page.num_gpu_blocks is None else page.num_gpu_blocks,
        max_lora=_max_lora(prev.max_lora, page),
        running_adapters=prev.running_adapters if lora is None else lora.running,
        waiting_adapters=prev.waiting_adapters if lora is None else lora.waiting,
        updated_at=now,
        field_times=FieldTimes(
            waiting=times.waiting if page.waiting is None else now,
            running=times.running if page.running is None else now,
            kv_cache_usage=times.kv_cache_usage if page.kv_cache_usage is None else now,
            lora=now if lora is not None or page.idle_max_lora is not None else times.lora,
        ),
    )
    return PodState(snapshot, good=True, readings=readings)


def _windowed(
    readings: tuple[Reading, ...], counters: PrefixCounters, now: float, window: float
) -> tuple[tuple[Reading, ...], float | None]:
    """The readings to keep with this one, and the hit rate since the oldest (None: no query since)."""
    new = Reading(now, counters.queries, counters.hits)
    if readings and (counters.queries < readings[-1].queries or counters.hits < readings[-1].hits):
        readings = ()  # the counters were reset: the server restarted
    kept = tuple(r for r in readings if r.at >= now - window)  # at most eleven
    rate: float | None = None
    if kept and (queries := new.queries - kept[0].queries) > 0:
        rate = min(1.0, (new.hits - kept[0].hits) / queries)
    if not kept or now - kept[-1].at >= window / 10:
        kept = (*kept, new)
    return kept, rate


def _max_lora(previous: int, page: PageMetrics) -> int:
    if page.lora is not None:
        return page.lora.max_lora
    if previous == 0 and page.idle_max_lora is not None:
        return page.idle_max_lora
    return previous


def on_failure(state: PodState, reason: str, now: float, policy: HealthPolicy) -> PodState:
    """A failed scrape: the data stays as last known; health follows the policy."""
    failed = replace(state, failures=state.failures + 1, error=reason)
    return judge(failed, now, policy)


def judge(state: PodState, now: float, policy: HealthPolicy) -> PodState:
    """Apply the health policy at ``now``; returns ``state`` itself when nothing changes."""
    healthy, reason = _health(state, now, policy)
    snapshot = state.snapshot
    if snapshot.healthy == healthy and snapshot.reason == reason:
        return state
    return replace(state, snapshot=replace(snapshot, healthy=healthy, reason=reason))


def _health(state: PodState, now: float, policy: HealthPolicy) -> tuple[bool, str]:
    if not state.good:
        return False, state.error or PENDING
    if state.failures >= policy.max_failures:
        return False, state.error
    if state.failures and state.error == TIMEOUT:
        # No answer within collector.timeout: a pod that slow to report is as slow to serve (and waiting
        # for maxFailures more would keep it in routing for seconds).
        return False, TIMEOUT
    if now - state.snapshot.updated_at > policy.staleness:
        return False, state.error or STALE
    return True, ""


def same_load(a: PodSnapshot, b: PodSnapshot) -> bool:
    """Whether two snapshots say the same thing to the picker, apart from their update times."""
    return (
        a.waiting == b.waiting
        and a.running == b.running
        and a.kv_cache_usage == b.kv_cache_usage
        and a.healthy == b.healthy
        and a.reason == b.reason
        and a.max_lora == b.max_lora
        and a.running_adapters == b.running_adapters
        and a.waiting_adapters == b.waiting_adapters
    )
