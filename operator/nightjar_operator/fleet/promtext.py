"""Parse the Prometheus text exposition format (version 0.0.4) into flat samples.

Pure: no I/O. The operator scrapes worker ``/metrics`` (vLLM's ``vllm:*`` plus ``nightjar_*``) and
reads a few counters, gauges and histograms from it; a full client library is not needed for that,
and a parser of our own gives clear errors naming the line that is malformed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

__all__ = ["Histogram", "PromParseError", "Sample", "Scrape", "parse"]


class PromParseError(ValueError):
    """A line of the exposition could not be parsed (message names line number and text)."""


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]  # sorted (key, value) pairs
    value: float

    def label(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return default


def _parse_float(text: str) -> float:
    t = text.strip()
    if t in ("+Inf", "Inf", "inf", "+inf"):
        return math.inf
    if t in ("-Inf", "-inf"):
        return -math.inf
    if t in ("NaN", "nan"):
        return math.nan
    return float(t)


def _parse_labels(s: str, i: int, lineno: int, line: str) -> tuple[tuple[tuple[str, str], ...], int]:
    """Parse ``{k="v",...}`` starting at s[i] == '{'; return (labels, index after '}')."""
    labels: list[tuple[str, str]] = []
    i += 1
    n = len(s)
    while True:
        while i < n and s[i] in " \t,":
            i += 1
        if i < n and s[i] == "}":
            return tuple(sorted(labels)), i + 1
        j = i
        while j < n and (s[j].isalnum() or s[j] == "_"):
            j += 1
        key = s[i:j]
        if not key or j >= n or s[j] != "=" or j + 1 >= n or s[j + 1] != '"':
            raise PromParseError(f"line {lineno}: malformed label set: {line!r}")
        i = j + 2
        buf: list[str] = []
        while True:
            if i >= n:
                raise PromParseError(f"line {lineno}: unterminated label value: {line!r}")
            c = s[i]
            if c == "\\" and i + 1 < n:
                nxt = s[i + 1]
                buf.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))
                i += 2
                continue
            if c == '"':
                i += 1
                break
            buf.append(c)
            i += 1
        labels.append((key, "".join(buf)))


def parse(text: str) -> Scrape:
    """Parse an exposition document. Comments (``# HELP``/``# TYPE``) are kept only for types."""
    samples: list[Sample] = []
    types: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        i = 0
        n = len(line)
        while i < n and line[i] not in "{ \t":
            i += 1
        name = line[:i]
        if not name:
            raise PromParseError(f"line {lineno}: missing metric name: {raw!r}")
        labels: tuple[tuple[str, str], ...] = ()
        if i < n and line[i] == "{":
            labels, i = _parse_labels(line, i, lineno, raw)
        rest = line[i:].split()
        if not rest:
            raise PromParseError(f"line {lineno}: missing value: {raw!r}")
        try:
            value = _parse_float(rest[0])  # an optional timestamp may follow; ignored
        except ValueError as e:
            raise PromParseError(f"line {lineno}: bad value {rest[0]!r}: {raw!r}") from e
        samples.append(Sample(name, labels, value))
    return Scrape(samples, types)


def _matches(s: Sample, want: Mapping[str, str]) -> bool:
    return all(s.label(k) == v for k, v in want.items())


@dataclass(frozen=True)
class Histogram:
    """A cumulative Prometheus histogram: ``buckets`` are (upper bound ``le``, cumulative count),
    ascending, ending with +Inf."""

    buckets: tuple[tuple[float, float], ...]
    sum: float = 0.0
    count: float = 0.0

    @staticmethod
    def from_buckets(buckets: Iterable[tuple[float, float]], sum_: float = 0.0, count: float | None = None) -> Histogram:
        merged: dict[float, float] = {}
        for le, c in buckets:
            merged[le] = merged.get(le, 0.0) + c
        bs = tuple(sorted(merged.items()))
        total = count if count is not None else (bs[-1][1] if bs else 0.0)
        return Histogram(bs, sum_, total)

    @property
    def observations(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0

    def __add__(self, other: Histogram) -> Histogram:
        """``sum by (le)`` of two histograms (bucket bounds may differ; union of bounds)."""
        return Histogram.from_buckets(list(self.buckets) + list(other.buckets), self.sum + other.sum, self.count + other.count)

    def delta(self, earlier: Histogram | None) -> Histogram:
        """Observations since ``earlier`` (an older scrape of the same series). A counter reset
        (any count went down, e.g. the worker restarted) returns ``self`` as Prometheus' rate() does."""
        if earlier is None:
            return self
        old = dict(earlier.buckets)
        out: list[tuple[float, float]] = []
        for le, c in self.buckets:
            d = c - old.get(le, 0.0)
            if d < 0:
                return self
            out.append((le, d))
        if self.count < earlier.count:
            return self
        return Histogram(tuple(out), self.sum - earlier.sum, self.count - earlier.count)

    def quantile(self, q: float) -> float | None:
        """PromQL ``histogram_quantile(q, ...)``: linear interpolation inside the bucket holding the
        rank; the lowest bucket starts at 0 (if its bound is positive); a rank in the +Inf bucket
        returns the largest finite bound. None when there are no observations or no +Inf bucket."""
        if math.isnan(q):
            return None
        if q < 0:
            return -math.inf
        if q > 1:
            return math.inf
        bs = list(self.buckets)
        if len(bs) < 2 or not math.isinf(bs[-1][0]):
            return None
        # Enforce monotonicity as Prometheus does (scrape races can produce tiny inversions).
        fixed: list[tuple[float, float]] = []
        hi = 0.0
        for le, c in bs:
            hi = max(hi, c)
            fixed.append((le, hi))
        total = fixed[-1][1]
        if total <= 0:
            return None
        rank = q * total
        b = next(i for i, (_, c) in enumerate(fixed) if c >= rank)
        if b == len(fixed) - 1:
            return fixed[-2][0]
        if b == 0 and fixed[0][0] <= 0:
            return fixed[0][0]
        start = 0.0 if b == 0 else fixed[b - 1][0]
        end = fixed[b][0]
        count = fixed[b][1]
        if b > 0:
            count -= fixed[b - 1][1]
            rank -= fixed[b - 1][1]
        if count <= 0:
            return end
        return start + (end - start) * (rank / count)

    def fraction_le(self, x: float) -> float | None:
        """Fraction of observations <= x, interpolated linearly inside a bucket (the inverse of
        ``quantile``); observations in the +Inf bucket count as above any finite x."""
        total = self.observations
        if total <= 0:
            return None
        prev_le, prev_c = 0.0, 0.0
        for le, c in self.buckets:
            if x < le:
                if math.isinf(le):
                    return prev_c / total
                width = le - prev_le
                frac = 0.0 if width <= 0 else max(0.0, min(1.0, (x - prev_le) / width))
                return (prev_c + (c - prev_c) * frac) / total
            prev_le, prev_c = le, c
        return 1.0


@dataclass
class Scrape:
    """All samples of one scrape, with lookup helpers."""

    samples: list[Sample]
    types: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._by_name: dict[str, list[Sample]] = {}
        for s in self.samples:
            self._by_name.setdefault(s.name, []).append(s)

    def names(self) -> set[str]:
        return set(self._by_name)

    def series(self, name: str, **labels: str) -> list[Sample]:
        return [s for s in self._by_name.get(name, ()) if _matches(s, labels)]

    def value(self, name: str, **labels: str) -> float | None:
        """Sum of all series of ``name`` matching ``labels`` (None if there is none)."""
        ss = self.series(name, **labels)
        return sum(s.value for s in ss) if ss else None

    def by_label(self, name: str, key: str) -> dict[str, float]:
        """``sum by (key)`` of ``name``."""
        out: dict[str, float] = {}
        for s in self._by_name.get(name, ()):
            v = s.label(key)
            if v is not None:
                out[v] = out.get(v, 0.0) + s.value
        return out

    def histogram(self, base: str, **labels: str) -> Histogram | None:
        """The histogram ``base`` (``_bucket``/``_sum``/``_count``), summed over series matching
        ``labels`` (i.e. ``sum by (le)``). None if it is absent."""
        bks = self.series(base + "_bucket", **labels)
        if not bks:
            return None
        pairs: list[tuple[float, float]] = []
        for s in bks:
            le = s.label("le")
            if le is None:
                continue
            pairs.append((_parse_float(le), s.value))
        if not pairs:
            return None
        return Histogram.from_buckets(pairs, self.value(base + "_sum", **labels) or 0.0, self.value(base + "_count", **labels))

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)
