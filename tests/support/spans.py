"""Measures of recorded runs: the most of them open at once, the most starts
in a window (a job body records its start and end; the tests hold the
limits to these)."""

from __future__ import annotations


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one instant (an end before a start at the same time)."""
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, step in points:
        now += step
        most = max(most, now)
    return most


def most_starts_in(starts: list[float], window: float) -> int:
    """The most starts within any ``window`` seconds."""
    starts = sorted(starts)
    most = first = 0
    for last, t in enumerate(starts):
        while t - starts[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most
