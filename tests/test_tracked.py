"""tracked.py: requests known by their tokens; the zero-copy view the suffix index reads."""

from __future__ import annotations

import numpy as np
import pytest

from suffixspec.drafting.proposers import RequestContext
from suffixspec.drafting.tracked import ContextView, TrackedRequest, token_key


@pytest.mark.parametrize("index", [slice(None), slice(-3, None), slice(1, 4), slice(None, None, -1), slice(4, 1, -1),
                                   slice(None, None, -2), slice(-1, -5, -1), slice(10, None, -1), slice(3, 3),
                                   slice(None, -10), 0, -1, 4])
def test_context_view_indexes_as_a_list_does(index):
    """Every slice, reversed ones included (they came back empty), reads ``row[:n]`` as the list would."""
    row = np.array([5, 6, 7, 8, 9, 99, 99], dtype=np.int32)  # n = 5: the 99s are past the request's tokens
    tokens = [5, 6, 7, 8, 9]
    view = ContextView(row, 5)
    assert view[index] == tokens[index]
    assert isinstance(view[index], list if isinstance(index, slice) else int)
    assert list(view) == tokens and len(view) == 5


def test_a_request_is_found_whatever_the_rows_integer_type():
    """Keys and comparisons go through one function (int32 bytes): a row of int64 holds the request it keyed."""
    assert token_key(np.array([5, 6, 7], dtype=np.int64), 2) == token_key(np.array([5, 6], dtype=np.int32), 2)
    req = TrackedRequest.new([], np.array([5, 6, 7, 8], dtype=np.int64), 4, RequestContext(prompt_ids=[5, 6, 7]))
    assert req.key == token_key(np.array([5, 6, 7, 8]), 4)
    assert req.holds(np.array([5, 6, 7, 8, 9], dtype=np.int64), 5)
    assert req.holds(np.array([5, 6, 7, 8, 9], dtype=np.int32), 5)
    assert not req.holds(np.array([5, 6, 7, 1, 9], dtype=np.int64), 5)
