"""The forced-decoding processor inside SGLang's own machinery on CPU: the string a forced request
carries deserializes (dill, by reference) to ``patches.forced.ForcedLogitProcessor``, and SGLang's
``apply_custom_logit_processor`` with it makes the sampler's greedy argmax pick the forced ids."""

from __future__ import annotations

import json
import types

import pytest

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
processor_module = pytest.importorskip("sglang.srt.sampling.custom_logit_processor")
sampler = pytest.importorskip("sglang.srt.layers.sampler")

from patches import forced  # noqa: E402


def test_the_string_is_a_reference_to_the_class():
    text = forced.processor_string()
    assert len(text) < 300  # the class by name, not its code
    assert bytes.fromhex(json.loads(text)["callable"]).find(b"patches.forced") >= 0
    instance = processor_module.CustomLogitProcessor.from_str(text)
    assert type(instance) is forced.ForcedLogitProcessor
    assert isinstance(instance, processor_module.CustomLogitProcessor)


class BatchInfo:
    """What ``apply_custom_logit_processor`` reads of a ``SamplingBatchInfo``."""

    def __init__(self, processor_string: str, custom_params: list):
        mask = torch.tensor([p is not None for p in custom_params])
        self.custom_logit_processor = {
            hash(processor_string): (processor_module.CustomLogitProcessor.from_str(processor_string), mask)}
        self.custom_params = custom_params

    def __len__(self):
        return len(self.custom_params)


def test_sglang_applies_it_before_the_greedy_argmax():
    vocab = 32
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0))
    free_choice = logits[1].argmax().item()
    stand_in = types.SimpleNamespace(origin_input_ids=[1, 2, 3], output_ids=[4], kv_committed_len=4)
    info = BatchInfo(forced.processor_string(), [
        {"forced_output_ids": [0, 17], "__req__": stand_in},
        None,
        {"forced_output_ids": [5, 6, 7], "__req__": types.SimpleNamespace(
            origin_input_ids=[1], output_ids=[], kv_committed_len=1)},
    ])
    sampler.apply_custom_logit_processor(logits, info)
    assert torch.argmax(logits, -1).tolist() == [17, free_choice, 5]
    assert torch.log_softmax(logits, -1)[0, 17].item() == 0.0
