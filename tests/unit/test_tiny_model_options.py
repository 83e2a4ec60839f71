"""The tiny model's variants (``--max-positions``, ``--vocab-size``): option checks, the config they
write, and ``cached_build``'s folder per variant (the build itself is replaced by a stub here;
``test_tiny_model.py`` checks the default build byte for byte)."""

from __future__ import annotations

import json

import pytest

from eval import tiny_model as mtm


def test_tokenizer_size_is_the_trained_tokenizer():
    assert mtm.TOKENIZER_SIZE == 480
    assert mtm.LONG_CONTEXT_POSITIONS >= 131072


@pytest.mark.parametrize("vocab, positions, message", [
    (479, 8192, "vocab_size 479 is smaller than the tokenizer's 480 tokens"),
    (512, 0, "max_positions 0 must be a positive integer"),
    (512.0, 8192, "vocab_size 512.0"),
])
def test_bad_options_are_refused(vocab, positions, message):
    with pytest.raises(ValueError, match=message):
        mtm.check_options(vocab, positions)
    with pytest.raises(ValueError, match=message):
        mtm.cached_build("/nonexistent", vocab_size=vocab, max_positions=positions)


def test_cli_refuses_a_vocabulary_smaller_than_the_tokenizer(capsys):
    with pytest.raises(SystemExit) as exit_info:
        mtm.main(["/nonexistent", "--vocab-size", "100"])
    assert exit_info.value.code == 2
    assert "vocab_size 100 is smaller than the tokenizer's 480 tokens" in capsys.readouterr().err


def test_config_carries_the_options():
    default = mtm.text_config_kwargs(473, 471)
    assert (default["vocab_size"], default["max_position_embeddings"]) == (512, 8192)
    big = mtm.text_config_kwargs(473, 471, vocab_size=248320, max_positions=131072)
    assert (big["vocab_size"], big["max_position_embeddings"]) == (248320, 131072)


@pytest.fixture
def stub_build(monkeypatch):
    """``build`` replaced by one that writes a config naming its options; returns the calls."""
    calls = []

    def build(out, seed=0, *, vocab_size, max_positions, tokenizer="tiny"):
        calls.append((vocab_size, max_positions))
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"vocab": vocab_size, "positions": max_positions}))
        return out

    monkeypatch.setattr(mtm, "build", build)
    return calls


def test_cached_build_keys_the_folder_on_the_options(tmp_path, stub_build):
    default = mtm.cached_build(tmp_path)
    long_context = mtm.cached_build(tmp_path, max_positions=mtm.LONG_CONTEXT_POSITIONS)
    both = mtm.cached_build(tmp_path, max_positions=131072, vocab_size=248320)
    assert default.name == mtm.cached_name() and "-p" not in default.name and "-v" not in default.name
    assert long_context.name == default.name + "-p131072"
    assert both.name == default.name + "-p131072-v248320"
    assert stub_build == [(512, 8192), (512, 131072), (248320, 131072)]
    # built once: a second call finds the folder
    assert mtm.cached_build(tmp_path, max_positions=131072) == long_context
    assert mtm.cached_build(tmp_path) == default
    assert len(stub_build) == 3
    assert json.loads((both / "config.json").read_text()) == {"vocab": 248320, "positions": 131072}
    assert not list(tmp_path.glob("*.partial"))


def test_the_default_name_keeps_todays_form(tmp_path):
    name = mtm.cached_name()
    assert name.startswith("tiny-model-") and len(name) == len("tiny-model-") + 12
    assert mtm.cached_name(vocab_size=151936) == name + "-v151936"


def test_the_qwen_variant_has_the_real_vocabulary_and_its_own_folder(tmp_path, stub_build):
    qwen = mtm.cached_build(tmp_path, max_positions=131072, tokenizer="qwen")
    assert qwen.name.endswith("-p131072-v248320-qwen") and stub_build == [(248320, 131072)]
    with pytest.raises(ValueError, match="smaller than the tokenizer's 248077 tokens"):
        mtm.check_options(248000, 8192, "qwen")
    with pytest.raises(ValueError, match="tokenizer 'gpt2'"):
        mtm.check_options(512, 8192, "gpt2")
