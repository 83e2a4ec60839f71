"""What exact's engine modules share (``test_exact_server``, ``test_exact_messages``,
``test_exact_kept``): a warm answer decoded beside neighbours against the cold solo answer,
message-shaped prompts, and the long-context model and conversation.

Helpers only (no tests, no fixtures): each module starts its own server with its own cut rule and
passes it in.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

from eval.server import output_record
from tests.engine.conftest import assert_equals_reference
from tests.engine.prompts import prompt_ids

NEIGHBOUR_TOKENS = 24  # the warm answer beside its neighbours: a row that went wrong shows in a few tokens
DECODE_BATCH = re.compile(r"Decode batch.*?#running-req: (\d+)")

# The long-context tiny model's server: room for one 8,500-token read and its decode.
LONG_CONTEXT_ARGS = ["--context-length", "16384", "--max-total-tokens", "20480"]


def warm_beside_neighbours(server, reference, prompt, others, *, history=None,
                           tokens: int = NEIGHBOUR_TOKENS):
    """Exact under load: on a flushed cache the prompts of ``history`` (``[prompt]`` by default)
    are read first, so the read of ``prompt`` is warm; it then decodes in one batch with ``others`` (each in its own namespace),
    and its ids and logprobs must equal, bit for bit, the cold read of ``prompt`` decoded alone,
    which equals the reference. On CPU a batched fp32 GEMM, or an elementwise op over the batch's
    rows, gives a row other bits than the same row alone (patches/row_invariance.py).

    The neighbours are sent first and decode four times longer, so the warm request decodes beside
    all of them; the server's per-step decode log (``--decode-log-interval 1``) must show a batch
    of ``len(others) + 1`` rows, or nothing was tested. Returns (warm, cold) records."""
    server.flush_cache()
    for earlier in history or [prompt]:
        server.generate(list(earlier), 2)
    log_start = len(server.log_text())

    def ask(ids, key, count):
        return output_record(server.generate(ids, count, extra_key=key))

    with ThreadPoolExecutor(len(others) + 1) as pool:
        futures = [pool.submit(ask, ids, f"neighbour-{n}", tokens * 4) for n, ids in enumerate(others)]
        warm = pool.submit(ask, prompt, None, tokens).result()
        [f.result() for f in futures]
    rows = len(others) + 1
    sizes = {int(n) for n in DECODE_BATCH.findall(server.log_text()[log_start:])}
    assert rows in sizes, f"never decoded {rows} rows together: {sorted(sizes)}"
    assert warm["cached_tokens"] > 0
    server.flush_cache()
    cold = output_record(server.generate(prompt, tokens))
    assert cold["cached_tokens"] == 0
    assert_equals_reference(reference, prompt, cold, "cold solo read")
    assert (warm["output_ids"], warm["logprobs"]) == (cold["output_ids"], cold["logprobs"])  # bit for bit
    return warm, cold


def im_end(model_dir) -> int:
    """The message-end token's id, read from the tokenizer (not from the code under test)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir)).convert_tokens_to_ids("<|im_end|>")


def messages(end: int, *spec: tuple[int, int]) -> list[int]:
    """Messages of (seed, length), each closed by the message-end token."""
    out: list[int] = []
    for seed, length in spec:
        out += prompt_ids(seed, length - 1) + [end]
    return out


def long_context_model():
    """The tiny model with 131,072 positions (built once under ``.artifacts``)."""
    from eval.tiny_model import LONG_CONTEXT_POSITIONS, cached_build
    from tests.conftest import ARTIFACTS

    return cached_build(ARTIFACTS, max_positions=LONG_CONTEXT_POSITIONS)


def long_conversation(end: int) -> tuple[list[int], list[int]]:
    """Eleven 750-token messages, a 100-token nudge and a 150-token message (8,500 tokens), and the
    same with the nudge deleted (8,400 tokens): both run past the default model's 8,192 positions."""
    spec = [(400 + n, 750) for n in range(11)]
    return messages(end, *spec, (420, 100), (421, 150)), messages(end, *spec, (421, 150))
