"""patches/request_book.py ``prefix_match_cap``: SGLang 0.5.16 caps its prefix match at
``logprob_start_len`` whenever a request returns logprobs and that start is >= 0
(``Req.init_next_round_input``: ``if self.return_logprob and self.logprob_start_len >= 0``), so a
start of 0 (every prompt token's logprob) means a cap of 0: nothing reused. The events' ``match_cap``
and the exact replay (``exact_cache.replay``'s ``cap``) depend on it: with no cap the replay would
predict reuse the server never made. Negative starts (-1: no prompt logprobs) cap nothing."""

from __future__ import annotations

import pytest

from exact_cache.replay import ReplayTree
from patches.request_book import prefix_match_cap


@pytest.mark.parametrize("start, expected", [(0, 0), (1, 1), (-1, None), (-2, None)])
def test_the_cap_counts_from_position_zero(start, expected):
    assert prefix_match_cap(True, start, 100) == expected
    assert prefix_match_cap(False, start, 100) is None


def test_a_cap_of_zero_makes_the_replay_reuse_nothing():
    tree = ReplayTree(8, 1000)
    prompt = [1] * 20
    tree.serve(prompt)
    assert tree.serve(prompt, prefix_match_cap(True, 0, len(prompt)))[0] == 0
    assert tree.serve(prompt, prefix_match_cap(True, -1, len(prompt)))[0] == 16
