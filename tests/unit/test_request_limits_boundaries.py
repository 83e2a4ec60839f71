"""serving/request_limits.py at its boundaries (survivors of the mutation pass, docs/mutation.md):

* every limit may be 1 (a positive integer, as the launcher's flags say): a server that takes one
  prompt per request is a valid choice;
* ``n`` of a /generate body whose ``sampling_params`` is a list (one per prompt) is read from the
  first entry, as SGLang reads it, even when later entries differ or there is only one."""

from __future__ import annotations

import pytest

from serving import request_limits
from serving.request_limits import FLAGS, RequestLimits

SMALL = RequestLimits(max_prompts=4, max_sequences=8)
GENERATE_FIELDS = (("text", "input_ids", "input_embeds"), "sampling_params.n")


@pytest.mark.parametrize("name", [n for n in FLAGS if n != "stop_regex_max_mem"])
def test_a_limit_of_one_is_a_limit(name):
    assert getattr(RequestLimits(**{name: 1}), name) == 1


@pytest.mark.parametrize("sampling, expected", [
    ([{"n": 3}, {"n": 1}, {"n": 1}], "sampling_params.n: 3 prompts x n = 3 is 9 sequences"),
    ([{"n": 1}, {"n": 3}, {"n": 3}], None),
])
def test_n_is_read_from_the_first_sampling_params_entry(sampling, expected):
    found = request_limits.body_batch_problem({"text": ["a"] * 3, "sampling_params": sampling}, *GENERATE_FIELDS, SMALL)
    assert (found is None) if expected is None else found.startswith(expected)


def test_a_one_entry_sampling_params_list_is_read():
    body = {"text": ["a"], "sampling_params": [{"n": 9}]}
    assert request_limits.body_batch_problem(body, *GENERATE_FIELDS, SMALL).startswith("sampling_params.n: 1 prompts x n = 9")
