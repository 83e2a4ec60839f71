"""eval.bcp.snippets: snippets cut by the served model's tokenizer when one loads from a local
path (BCP's unit), else by words, and the manifest says which."""

from __future__ import annotations

import pytest

from eval.bcp import snippets
from eval.bcp.data import Document
from eval.bcp.retrieval import Searcher

TEXT = "alpha, beta. gamma delta castle river"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A word-level tokenizer saved the way a model directory holds one (tokenizer.json and config);
    punctuation is a token of its own, so a token cut and a word cut differ."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["alpha", "beta", "gamma", "delta", "castle", "river", ",", "."]
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(str(path))
    return str(path)


@pytest.mark.parametrize("name, unit", [
    pytest.param("/models/qwen3-0.6b", "tokens:/models/qwen3-0.6b", id="tokenizer"),
    pytest.param(None, "words", id="none"),
    pytest.param("", "words", id="empty"),
])
def test_snippet_unit(name, unit):
    assert snippets.snippet_unit(name) == unit


def test_served_tokenizer_path_prefers_the_tokenizer_and_wants_a_local_directory(tmp_path):
    model, tok = tmp_path / "model", tmp_path / "tok"
    model.mkdir()
    tok.mkdir()
    assert snippets.served_tokenizer_path({"model_path": str(model), "tokenizer_path": str(tok)}) == str(tok)
    assert snippets.served_tokenizer_path({"model_path": str(model), "tokenizer_path": None}) == str(model)
    assert snippets.served_tokenizer_path({"model_path": "Qwen/Qwen3-0.6B"}) is None  # a hub name
    assert snippets.served_tokenizer_path({}) is None


def test_words_unless_a_tokenizer_loads(tmp_path):
    warnings = []
    assert snippets.choose_tokenizer("words", {"model_path": str(tmp_path)}, warnings.append) == (None, None)
    assert warnings == []
    assert snippets.choose_tokenizer("auto", {"model_path": "Qwen/Qwen3-0.6B"}, warnings.append) == (None, None)
    assert "whitespace words" in warnings[-1]
    # A local model directory without tokenizer files: a warning, words.
    assert snippets.choose_tokenizer("auto", {"model_path": str(tmp_path)}, warnings.append) == (None, None)
    assert "does not load" in warnings[-1]
    # Asked for by path, a tokenizer must load.
    with pytest.raises(snippets.TokenizerError, match="not a local directory"):
        snippets.choose_tokenizer(str(tmp_path / "missing"), {}, warnings.append)


def test_snippets_are_cut_by_the_served_tokenizer(tokenizer_dir):
    warnings = []
    tokenizer, name = snippets.choose_tokenizer("auto", {"model_path": tokenizer_dir}, warnings.append)
    assert name == tokenizer_dir and warnings == []
    corpus = {"1": Document("1", TEXT)}
    by_tokens = Searcher(corpus, snippet_max_tokens=3, tokenizer=tokenizer, tokenizer_name=name)
    by_words = Searcher(corpus, snippet_max_tokens=3)
    assert by_tokens.search("alpha", 1)[0].text == "alpha , beta"  # decode(encode(text)[:3])
    assert by_words.search("alpha", 1)[0].text == "alpha, beta. gamma"
    assert by_tokens.describe()["snippet_unit"] == f"tokens:{tokenizer_dir}"
    assert by_words.describe()["snippet_unit"] == "words"
