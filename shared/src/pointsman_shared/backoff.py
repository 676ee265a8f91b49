"""How long to wait before the next attempt after failures: one capped exponential, optionally jittered.

Pure: the randomness comes from the caller's :class:`random.Random`, so a table test can pin it. The
delay before attempt ``n + 1`` after ``n`` failures in a row (``attempt = n``, from 1) is drawn under the
ceiling ``min(maximum, initial * factor ** (attempt - 1))``:

- ``Jitter.NONE``: the ceiling itself (one process retrying alone: predictable, easy to read in logs);
- ``Jitter.FULL``: uniform in ``[0, ceiling]`` (many clients of one server: spreads them out the most);
- ``Jitter.EQUAL``: uniform in ``[ceiling / 2, ceiling]`` (spread out, yet never retrying at once).

Where a backoff delays fresh data, its cap must stay below the staleness budget the readers apply
(``collector.staleness`` and ``picker.maxStaleness``, 2 s by default). Each user states its own
parameters beside the code that retries, with the reason for them.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass


class Jitter(enum.Enum):
    NONE = "none"
    FULL = "full"
    EQUAL = "equal"


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    initial: float  # the ceiling after the first failure, seconds
    maximum: float  # no ceiling grows past this, seconds
    factor: float = 2.0  # the ceiling's growth per failure
    jitter: Jitter = Jitter.NONE

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(f"backoff needs 0 < initial <= maximum, got {self.initial} and {self.maximum}")
        if self.factor < 1:
            raise ValueError(f"backoff factor must be at least 1, got {self.factor}")

    def ceiling(self, attempt: int) -> float:
        """The longest wait after ``attempt`` failures in a row (0 and 1 both give ``initial``)."""
        try:
            grown = self.initial * self.factor ** max(0, attempt - 1)
        except OverflowError:  # thousands of failures: long past the cap
            return self.maximum
        return min(self.maximum, grown)

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The wait after ``attempt`` failures in a row, jittered as configured."""
        ceiling = self.ceiling(attempt)
        if self.jitter is Jitter.FULL:
            return rng.uniform(0.0, ceiling)
        if self.jitter is Jitter.EQUAL:
            return ceiling / 2 + rng.uniform(0.0, ceiling / 2)
        return ceiling
