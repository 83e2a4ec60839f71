"""``eval/render.py``: the two renderings of earlier turns and the chat-template flags they mean."""

from __future__ import annotations

import pytest

from eval import render


def test_each_rendering_maps_to_its_chat_template_kwargs():
    assert render.chat_template_kwargs("default") == {"enable_thinking": True, "preserve_thinking": False}
    assert render.chat_template_kwargs("preserve") == {"enable_thinking": True, "preserve_thinking": True}
    assert render.chat_template_kwargs("preserve", enable_thinking=False)["enable_thinking"] is False


@pytest.mark.parametrize("name", render.RENDERINGS)
def test_the_kwargs_read_back_as_the_same_rendering(name):
    assert render.from_kwargs(render.chat_template_kwargs(name)) == name


def test_no_kwargs_is_the_default_and_an_unknown_name_is_refused():
    assert render.from_kwargs(None) == render.from_kwargs({}) == "default"
    with pytest.raises(ValueError, match="choose from default, preserve"):
        render.preserve_thinking("keep")
