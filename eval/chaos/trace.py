"""The default chaos trace: a few editing conversations in token ids, with their answers fixed.

Pure (a seed in, ``TraceCall`` values out). Each conversation is a ``eval.soak.conversation``
conversation (append, delete in the middle, replace the tail, repeat) whose answers are drawn
here, so the trace can be replayed with forced decoding like any recorded one. Every first prompt
starts with one shared "system prompt" of ``shared`` tokens: a prefix that several conversations
read, so a worker that never saw it reads it once (the cross-worker reuse ``eval.cluster bench``
predicts). It is kept shorter than SCR's 1,024-token session match, so scr never puts two
conversations in one session: a conversation whose worker died can only fall back to a plain
read, which the chaos checks can then require. Ids come from the tiny model's vocabulary.
"""

from __future__ import annotations

import random

from eval.soak.conversation import Conversation, ConversationConfig, random_ids
from eval.traces.format import TraceCall

SHARED_TOKENS = 256  # < SCR's session match (1,024 common tokens): conversations never share a session
ANSWER_TOKENS = (8, 24)


def chaos_config(max_prompt: int) -> ConversationConfig:
    """Long-enough prompts for scr to relocate (its sessions match on 1,024 common tokens)."""
    return ConversationConfig(min_prompt=1200, max_prompt=max_prompt, short_share=0.0, min_turns=1, max_turns=1)


def chaos_trace(conversations: int, turns: int, seed: int = 0, max_prompt: int = 2500,
                shared: int = SHARED_TOKENS) -> list[TraceCall]:
    """``conversations`` x ``turns`` calls, in turn order within each conversation (interleaved
    across conversations by turn). The shared prefix replaces each first prompt's first ``shared``
    ids, so the prompt lengths and edit rules stay the soak's."""
    if conversations < 1 or turns < 1:
        raise ValueError(f"need at least one conversation and one turn, got {conversations} x {turns}")
    cfg = chaos_config(max_prompt)
    system = random_ids(random.Random(f"chaos:{seed}:system"), shared, cfg.low, cfg.high)
    calls: list[list[TraceCall]] = []
    for index in range(conversations):
        conv = Conversation.start(seed, index, tenant=0, cfg=cfg)
        answers = random.Random(f"chaos:{seed}:answers:{index}")
        answer: list[int] | None = None
        mine = []
        for turn in range(turns):
            kind, prompt = conv.next_prompt(answer)
            if turn == 0:
                prompt = system + prompt[shared:]
                conv.prompt = list(prompt)
            answer = random_ids(answers, answers.randint(*ANSWER_TOKENS), cfg.low, cfg.high)
            mine.append(TraceCall(conversation=f"c{index:02d}", turn=turn, prompt_ids=prompt, completion_ids=answer,
                                  kind=kind))
        calls.append(mine)
    return [conv_calls[turn] for turn in range(turns) for conv_calls in calls]
