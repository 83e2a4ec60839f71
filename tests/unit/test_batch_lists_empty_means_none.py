"""serving/request_checks.py ``check_batch_lengths``: an empty list where SGLang reads empty as
"none" (``EMPTY_MEANS_NONE``: ``modalities``; ``GenerateReqInput.__getitem__`` tests
``if self.modalities``) is no batch list and passes whatever the batch size (the OpenAI chat
route sends ``modalities: []`` with ``n`` > 1); a non-empty one is held to the batch size like
any other per-request list, and an empty list of any other field is too short."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from serving.request_checks import EMPTY_MEANS_NONE, RequestError, check_batch_lengths


def test_an_empty_modalities_list_means_none_for_any_batch_size():
    assert "modalities" in EMPTY_MEANS_NONE
    for count in (1, 2, 5):
        check_batch_lengths(SimpleNamespace(modalities=[]), count)


def test_a_short_non_empty_modalities_list_is_refused():
    check_batch_lengths(SimpleNamespace(modalities=["image", "image"]), 2)
    with pytest.raises(RequestError, match="^modalities: 1 entries for a batch of 2 requests$"):
        check_batch_lengths(SimpleNamespace(modalities=["image"]), 2)


def test_an_empty_list_of_another_field_is_too_short():
    with pytest.raises(RequestError, match="^image_data: 0 entries for a batch of 2 requests$"):
        check_batch_lengths(SimpleNamespace(image_data=[]), 2)
