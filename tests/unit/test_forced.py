"""Forced decoding: the request rules (``serving/forced.py``: checks, how a request is prepared
at the entry: processor attached, params filled, client processors refused, and which row gets
which id) and the masking on small logits (``patches/forced.py``) with stand-in requests (the
scheduler's ``__req__``)."""

from __future__ import annotations

import re
import types

import pytest
import torch

from patches import forced as glue
from serving import forced
from serving.forced import FIELD, check_client_processor, check_forced
from serving.field_rules import RequestError
VOCAB = 16


def params(ids, **extra):
    return {"custom_params": {"forced_output_ids": ids}, **extra}


# ---------------------------------------------------------------------- check_forced


def test_no_forcing_is_none():
    assert check_forced(None, VOCAB) is None
    assert check_forced({"max_new_tokens": 3}, VOCAB) is None
    assert check_forced({"custom_params": {"other": 1}}, VOCAB) is None
    assert check_forced({"custom_params": "junk"}, VOCAB) is None  # SGLang's own check, not ours


@pytest.mark.parametrize("p", [params([1, 2, 3]), params([0, 15], max_new_tokens=2), params([4], n=1)])
def test_good_forcing(p):
    assert check_forced(p, VOCAB) == p["custom_params"]["forced_output_ids"]


@pytest.mark.parametrize("p, words", [
    (params([]), "non-empty list"),
    (params(5), "non-empty list"),
    (params("1,2"), "non-empty list"),
    (params([1, 2.0]), "position 1 is 2.0"),
    (params([True]), "position 0 is True"),
    (params([1, -1]), "token id -1 at position 1 is outside the vocabulary [0, 16)"),
    (params([VOCAB]), f"token id {VOCAB} at position 0 is outside"),
    (params([1, 2], max_new_tokens=3), "2 ids, but max_new_tokens is 3"),
    (params([1, 2], max_new_tokens=1), "2 ids, but max_new_tokens is 1"),
    (params([1], n=2), "needs n = 1"),
])
def test_bad_forcing_names_the_field(p, words):
    with pytest.raises(RequestError) as info:
        check_forced(p, VOCAB)
    message = str(info.value)
    assert message.startswith(f"{FIELD}: ") and words in message
    assert isinstance(info.value, ValueError)  # SGLang's HTTP layer answers ValueError with a 400


def test_client_processor_rules():
    check_client_processor(None, allowed=False, forcing=True)
    check_client_processor("code", allowed=True, forcing=False)
    with pytest.raises(RequestError, match=r"^custom_logit_processor: client-supplied"):
        check_client_processor("code", allowed=False, forcing=False)
    with pytest.raises(RequestError, match=r"^custom_logit_processor: cannot be combined"):
        check_client_processor("code", allowed=True, forcing=True)


# ---------------------------------------------------------------------- prepare_request


PROCESSOR = "FORCED"


def prepare(obj, allowed, available=True):
    forced.prepare_request(obj, VOCAB, allowed, available, lambda: PROCESSOR)


@pytest.fixture
def processor():
    return PROCESSOR


def single(sampling, processor_value=None):
    return types.SimpleNamespace(is_single=True, rid="r", sampling_params=sampling,
                                 custom_logit_processor=processor_value)


def test_prepare_single_attaches_and_fills(processor):
    obj = single(params([3, 4]))
    prepare(obj, allowed=False)
    assert obj.custom_logit_processor == processor
    assert obj.sampling_params["max_new_tokens"] == 2 and obj.sampling_params["ignore_eos"] is True


def test_prepare_keeps_client_values(processor):
    obj = single(params([3, 4], max_new_tokens=2, ignore_eos=False))
    prepare(obj, allowed=False)
    assert obj.sampling_params["ignore_eos"] is False


def test_prepare_leaves_plain_requests_alone(processor):
    obj = single({"max_new_tokens": 4})
    prepare(obj, allowed=False, available=False)
    assert obj.custom_logit_processor is None and obj.sampling_params == {"max_new_tokens": 4}


def test_prepare_refuses_client_processor_unless_allowed(processor):
    with pytest.raises(RequestError, match=r"^custom_logit_processor: "):
        prepare(single({"max_new_tokens": 4}, "dill code"), allowed=False)
    obj = single({"max_new_tokens": 4}, "dill code")
    prepare(obj, allowed=True)
    assert obj.custom_logit_processor == "dill code"


def test_prepare_needs_processors_on(processor):
    with pytest.raises(RequestError, match=r"^sampling_params.custom_params.forced_output_ids: .*launch_server"):
        prepare(single(params([1])), allowed=False, available=False)


def test_prepare_batch_per_prompt(processor):
    obj = types.SimpleNamespace(is_single=False, rid=["a", "b", "c"],
                                sampling_params=[params([1]), {"max_new_tokens": 2}, params([2, 3])],
                                custom_logit_processor=[None, None, None])
    prepare(obj, allowed=False)
    assert obj.custom_logit_processor == [processor, None, processor]
    assert [p.get("max_new_tokens") for p in obj.sampling_params] == [1, 2, 2]
    bad = types.SimpleNamespace(is_single=False, rid=["a", "b"], sampling_params=[params([1]), params([99])],
                                custom_logit_processor=[None, None])
    with pytest.raises(RequestError, match=r"^sampling_params\[1\].custom_params.forced_output_ids: token id 99"):
        prepare(bad, allowed=False)


def test_enable_records_the_operator_choice(monkeypatch):
    monkeypatch.delenv(forced.CLIENT_PROCESSORS_ENV, raising=False)
    args = types.SimpleNamespace(enable_custom_logit_processor=False)
    assert forced.client_processors_allowed(args.enable_custom_logit_processor) is False  # no launcher: SGLang's flag
    assert forced.client_processors_allowed(True) is True
    glue.enable(args)
    assert args.enable_custom_logit_processor is True
    assert forced.client_processors_allowed(args.enable_custom_logit_processor) is False
    operator = types.SimpleNamespace(enable_custom_logit_processor=True)
    glue.enable(operator)
    assert forced.client_processors_allowed(operator.enable_custom_logit_processor) is True


# ---------------------------------------------------------------------- masking


def req(prompt_len, outputs, committed=None):
    return types.SimpleNamespace(origin_input_ids=list(range(prompt_len)), output_ids=list(range(outputs)),
                                 kv_committed_len=prompt_len + outputs if committed is None else committed)


def test_mask_forces_the_next_id_per_row():
    logits = torch.arange(5 * VOCAB, dtype=torch.float32).reshape(5, VOCAB)
    original = logits.clone()
    rows = [
        {"forced_output_ids": [7, 9, 11], "__req__": req(4, 1)},  # next is position 1 -> 9
        None,  # a request without custom params
        {"other": 1, "__req__": req(4, 0)},  # custom params, no forcing
        {"forced_output_ids": [7], "__req__": req(4, 1)},  # past its forced ids: left alone
        {"forced_output_ids": [3, 5], "__req__": req(4, 0, committed=5)},  # overlap: token 0 not appended yet
    ]
    out = glue.mask_forced(logits, rows)
    assert out is logits
    for row, target in ((0, 9), (4, 5)):
        assert out[row].argmax().item() == target
        assert out[row, target].item() == 0.0
        assert torch.isinf(out[row]).sum().item() == VOCAB - 1
        assert torch.log_softmax(out[row], -1)[target].item() == 0.0  # the logprob a forced token gets
    for row in (1, 2, 3):
        assert torch.equal(out[row], original[row])


def test_mask_on_an_intermediate_prefill_chunk_uses_the_output_length():
    logits = torch.zeros(1, VOCAB)
    glue.mask_forced(logits, [{"forced_output_ids": [6], "__req__": req(100, 0, committed=32)}])
    assert logits[0].argmax().item() == 6  # harmless: SGLang discards a chunk's sample


@pytest.mark.parametrize("rows, expected", [
    (None, []),
    ([None, {"other": 1}], []),
    ([{"forced_output_ids": [7, 9], "__req__": req(4, 1)}], [(0, 9)]),
    ([{"forced_output_ids": [7], "__req__": req(4, 1)}], []),  # past its forced ids
    ([{"forced_output_ids": [7]}], []),  # no request attached: not a scheduler row
    ([{}, {"forced_output_ids": [3, 5], "__req__": req(4, 0, committed=5)}], [(1, 5)]),  # overlap scheduling
    ([{"forced_output_ids": [6], "__req__": req(100, 0, committed=32)}], [(0, 6)]),  # prefill chunk
], ids=["none", "no-forcing", "next", "past-end", "no-req", "overlap", "chunk"])
def test_forced_targets(rows, expected):
    assert forced.forced_targets(rows) == expected


def test_next_index_without_kv_bookkeeping():
    stand_in = types.SimpleNamespace(origin_input_ids=[1, 2], output_ids=[5, 6])
    assert forced.next_index(stand_in) == 2


def test_mask_with_no_rows_is_a_no_op():
    logits = torch.ones(2, VOCAB)
    assert torch.equal(glue.mask_forced(logits, None), torch.ones(2, VOCAB))
    assert torch.equal(glue.mask_forced(logits, []), torch.ones(2, VOCAB))


# ---------------------------------------------------------------------- the router-safe envelope


@pytest.mark.parametrize("value, ids", [
    (forced.envelope([3, 4]), [3, 4]),
    ('  {"forced_output_ids": []}', []),
    ('{"forced_output_ids": [1], "other": 2}', None),  # not exactly the envelope: a client processor
    ('{"forced_output_ids": ', None),  # not JSON
    ("gASV...dill", None),
    (None, None),
])
def test_unwrap_envelope(value, ids):
    assert forced.unwrap_envelope(value) == ids


def test_envelope_forces_like_custom_params(processor):
    obj = single({"temperature": 0}, forced.envelope([3, 4]))
    prepare(obj, allowed=False)
    assert obj.custom_logit_processor == processor
    assert obj.sampling_params == {"temperature": 0, "custom_params": {"forced_output_ids": [3, 4]},
                                   "max_new_tokens": 2, "ignore_eos": True}


@pytest.mark.parametrize("sampling, value, message", [
    ({}, forced.envelope([99]), r"^custom_logit_processor.forced_output_ids: token id 99"),
    ({}, '{"forced_output_ids": "x"}', r"^custom_logit_processor.forced_output_ids: must be a non-empty list"),
    ({"max_new_tokens": 5}, forced.envelope([1]), r"^custom_logit_processor.forced_output_ids: 1 ids, but max_new"),
    (params([1]), forced.envelope([1]), r"^custom_logit_processor.forced_output_ids: forced ids given twice"),
])
def test_bad_envelope_names_the_field(processor, sampling, value, message):
    with pytest.raises(RequestError, match=message):
        prepare(single(sampling, value), allowed=True)


def test_envelope_in_a_batch_sharing_one_params_dict(processor):
    shared = {"temperature": 0}
    obj = types.SimpleNamespace(is_single=False, rid=["a", "b"], sampling_params=shared,
                                custom_logit_processor=[forced.envelope([5]), None])
    prepare(obj, allowed=False)
    assert obj.custom_logit_processor == [processor, None]
    assert obj.sampling_params[0]["custom_params"] == {"forced_output_ids": [5]}
    assert "custom_params" not in obj.sampling_params[1] and shared == {"temperature": 0}


# ---------------------------------------------------------------------- nested envelopes (issue 33)


def deep_envelope(levels: int) -> str:
    return '{"forced_output_ids": ' + "[" * levels + "1" + "]" * levels + "}"


def test_an_envelope_nested_past_the_parser_is_an_envelope_error():
    with pytest.raises(forced.EnvelopeError, match="JSON nested deeper than the server parses"):
        forced.unwrap_envelope(deep_envelope(100_000))
    with pytest.raises(forced.EnvelopeError):
        forced.unwrap_envelope("{" + '"a":{' * 100_000)  # unterminated and deep: the depth is found first


@pytest.mark.parametrize("batch", [False, True])
def test_a_deep_envelope_is_a_400_naming_the_field(processor, batch):
    """It was a 500: RecursionError escaped serving/forced.py."""
    value = deep_envelope(100_000)
    obj = (types.SimpleNamespace(is_single=False, rid=["a", "b"], sampling_params={}, custom_logit_processor=[None, value])
           if batch else single({}, value))
    field = "custom_logit_processor[1]" if batch else "custom_logit_processor"
    with pytest.raises(RequestError, match=rf"^{re.escape(field)}: JSON nested deeper than the server parses"):
        prepare(obj, allowed=True)


@pytest.mark.parametrize("value, message", [
    (deep_envelope(900), "position 0 is a list of 1, not an integer token id"),
    ('{"forced_output_ids": {"a": 1}}', "must be a non-empty list of token ids, got an object of 1 keys"),
    ('{"forced_output_ids": [' + ",".join(["[0]"] * 50_000) + "]}", "position 0 is a list of 1, not an integer"),
    ('{"forced_output_ids": ["' + "x" * 1000 + '"]}', "position 0 is 'xxxx"),
])
def test_envelope_values_are_named_without_their_repr(processor, value, message):
    with pytest.raises(RequestError) as info:
        prepare(single({}, value), allowed=True)
    text = str(info.value)
    assert text.startswith(f"custom_logit_processor.forced_output_ids: {message}") and len(text) < 200, text[:300]
