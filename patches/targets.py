"""The SGLang 0.5.16 callables the policy hooks wrap, by their dotted names (``HookRegistry`` targets).

Named once here, the bottom of ``patches/``: the hook sets (``patches/hook_sets.py``), the trace
writer and the tests of the overlay read them; why each is hooked is the hook table of
docs/ARCHITECTURE.md. The request checks, routes and CPU platform name their own targets next to
their hooks.
"""

from __future__ import annotations

REQ_MATCHED = "sglang.srt.managers.schedule_batch.Req.init_next_round_input"
RELEASE_KV = "sglang.srt.mem_cache.common.release_kv_cache"
SCHEDULER_IDLE = "sglang.srt.managers.scheduler.Scheduler.on_idle"
SCHEDULER_INIT = "sglang.srt.managers.scheduler.Scheduler.__init__"
ADD_CHUNKED_REQ = "sglang.srt.managers.schedule_policy.PrefillAdder.add_chunked_req"
ADD_ONE_REQ = "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req"
ENQUEUE = "sglang.srt.managers.scheduler.Scheduler._add_request_to_queue"
ABORT = "sglang.srt.managers.scheduler.Scheduler.abort_request"
PREFILL_RESULT = ("sglang.srt.managers.scheduler_components.batch_result_processor."
                  "SchedulerBatchResultProcessor.process_batch_result_prefill")
RUN_BATCH = "sglang.srt.managers.scheduler.Scheduler.run_batch"
