"""A wait's record keeps the children it waited on as runs of steps."""

from __future__ import annotations

import pytest

from pg_scheduler.workflows.children import spans


@pytest.mark.parametrize(
    "seqs, expected",
    [
        ([], []),
        ([7], [[7, 7]]),
        (list(range(1, 10_001)), [[1, 10_000]]),
        ([1, 2, 3, 5, 6, 9], [[1, 3], [5, 6], [9, 9]]),
        ([4, 3, 2], [[4, 4], [3, 3], [2, 2]]),  # the order given, not sorted
        ([2, 2, 3], [[2, 2], [2, 3]]),  # a child named twice stays twice
    ],
)
def test_spans(seqs: list[int], expected: list[list[int]]) -> None:
    assert spans(seqs) == expected
