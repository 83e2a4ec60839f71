"""Writer of the per-request events file (``--cache-events FILE``).

One JSON object per line, appended when a request leaves the scheduler (finished or aborted),
written by the scheduler of attention-TP rank 0 only, through ``patches.jsonl_append`` (one
``write`` per line on an ``O_APPEND`` descriptor, so lines from several scheduler processes never
interleave). Readers (``eval/``) use ``policy.events.RequestEvent``.

| field          | type        | meaning                                                              |
|----------------|-------------|----------------------------------------------------------------------|
| schema         | int         | 1                                                                    |
| rid            | str         | request id (the client's ``rid`` when it sent one)                   |
| policy         | str         | cache policy that served it (``radix``, ...)                          |
| prompt_tokens  | int         | prompt length in tokens                                              |
| prefix_reused  | int         | prompt tokens served from the prefix cache (SGLang ``cached_tokens``) |
| moved          | int         | prompt tokens relocated from elsewhere (0 for prefix-only policies)  |
| read           | int         | prompt tokens run through the model = prompt - prefix_reused - moved |
| decode_tokens  | int         | generated tokens                                                     |
| cache_salt     | str / null  | the request's cache namespace (SGLang ``extra_key``: cache_salt ...) |
| plan_resume    | int / null  | reuse length the policy planned at admission (null if never planned) |
| finish_reason  | str / null  | ``stop``, ``length``, ``abort``, ...                                 |
| queued_ts      | float       | unix time the policy first saw the request                           |
| finished_ts    | float       | unix time it left the scheduler                                      |
| snapshots      | list        | ``[position, kind]`` of each recurrent-state snapshot this read kept  |
|                |             | (``exact``: periodic, prompt_end, junction, *_back); [] otherwise     |
| forwards_off_plan | int      | prefill forwards that were not the plan's next piece (must be 0)     |
| blocks         | int         | blocks of relocated rows spliced into the prompt (``scr``; else 0)    |
| fallback       | str / null  | why a policy step fell back to a plain read (``scr``: the step and    |
|                |             | the error, or ``retracted: …``); null when the plan ran as decided     |
| retractions    | int         | times SGLang retracted or preempted the request and read it again     |
| match_cap      | int / null  | the prefix match was capped at this many tokens (a request asking for |
|                |             | prompt logprobs from ``logprob_start_len``); null when not capped      |

Identity, always: ``prompt_tokens == prefix_reused + moved + read``. The counts are raw: ``scr``
writes ``prefix_reused = cached_tokens - 2 * moved`` unclamped, so a wrong rule shows up as a
negative count that the accounting check I1 reports.
"""

from __future__ import annotations

from patches.jsonl_append import JsonlAppender
from policy.events import RequestEvent


class EventWriter(JsonlAppender):
    def write(self, event: RequestEvent) -> None:
        self.append(event.to_dict())
