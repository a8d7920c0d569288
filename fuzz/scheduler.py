"""Which property a campaign runs next: more time for those still finding new behaviour.

After HypoFuzz's idea: each chunk of a property counts its *discoveries* (:class:`Discoveries`:
a feature, or a pair of features occurring in one case, that this property had not produced
before in the campaign, and each new failure signature), and :class:`Scheduler` draws the next
property with a probability that follows its recent discoveries (and, where torch coverage is
measured, the torch lines it reached first) per second, with a floor so that no property starves.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Iterable


class Scheduler:
    """Which property runs the next chunk: the ones still discovering get more of the time.

    Each property's rate is its discoveries per second over its recent chunks (an exponential
    moving sum, ``decay`` per chunk, so the estimate follows a property as it saturates), with a
    prior of half a discovery so that a property that found nothing yet keeps a chance. The
    share of time is ``floor / n`` for every property plus ``1 - floor`` split by rate. Every
    property runs once before any weighting, in the order given.

    With ``line_share`` > 0 (a campaign that measures torch coverage), the torch lines a chunk
    reached first in the campaign are a second signal: each property has a second rate, made
    the same way from ``log2(1 + new lines)`` per chunk (a chunk that reaches hundreds of lines
    at once, as the first chunks do, counts a few times one that reaches one, not hundreds of
    times), and ``1 - floor`` is split ``line_share`` by the line rates and the rest by the
    discovery rates. With ``line_share`` 0 the line counts are ignored: the shares are those
    above, unchanged.
    """

    def __init__(
        self,
        names: Iterable[str],
        rng: random.Random,
        *,
        floor: float = 0.2,
        decay: float = 0.7,
        line_share: float = 0.0,
    ) -> None:
        self.names = list(names)
        if not self.names:
            raise ValueError("a scheduler needs at least one property")
        if not 0.0 <= line_share <= 1.0:
            raise ValueError(f"line_share={line_share!r} must be between 0 and 1")
        self.rng = rng
        self.floor = floor
        self.decay = decay
        self.line_share = line_share
        self.found: dict[str, float] = dict.fromkeys(self.names, 0.0)
        self.lines: dict[str, float] = dict.fromkeys(self.names, 0.0)
        self.seconds: dict[str, float] = dict.fromkeys(self.names, 0.0)
        self.chunks: Counter[str] = Counter()

    def record(self, name: str, *, seconds: float, discoveries: int, new_lines: int = 0) -> None:
        self.found[name] = self.found[name] * self.decay + discoveries
        self.lines[name] = self.lines[name] * self.decay + math.log2(1 + max(new_lines, 0))
        self.seconds[name] = self.seconds[name] * self.decay + max(seconds, 1e-3)
        self.chunks[name] += 1

    def rates(self) -> dict[str, float]:
        return {n: (self.found[n] + 0.5) / (self.seconds[n] + 1.0) for n in self.names}

    def line_rates(self) -> dict[str, float]:
        return {n: (self.lines[n] + 0.5) / (self.seconds[n] + 1.0) for n in self.names}

    def weights(self) -> dict[str, float]:
        rates = self.rates()
        total = sum(rates.values())
        n = len(self.names)
        if self.line_share == 0:
            return {k: self.floor / n + (1 - self.floor) * r / total for k, r in rates.items()}
        lines = self.line_rates()
        line_total = sum(lines.values())
        share = {
            k: (1 - self.line_share) * r / total + self.line_share * lines[k] / line_total for k, r in rates.items()
        }
        return {k: self.floor / n + (1 - self.floor) * v for k, v in share.items()}

    def pick(self) -> str:
        for name in self.names:
            if not self.chunks[name]:
                return name
        weights = self.weights()
        return self.rng.choices(self.names, weights=[weights[n] for n in self.names])[0]


class Discoveries:
    """What each property has produced so far: features, feature pairs, failure signatures."""

    def __init__(self) -> None:
        self.seen: dict[str, set[str]] = {}
        self.total = 0

    def add(self, prop: str, features: Iterable[str]) -> int:
        """Record one case's features; returns how many features and pairs were new."""
        seen = self.seen.setdefault(prop, set())
        fs = sorted(set(features))
        keys = fs + [f"{a}&{b}" for a, b in itertools.combinations(fs, 2)]
        new = [k for k in keys if k not in seen]
        seen.update(new)
        self.total += len(new)
        return len(new)
