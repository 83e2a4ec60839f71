"""The steps of the check, in the order they run, with their time budgets on one H200.

The budgets add up to the 10 minutes the whole check must fit (the start-up step is untimed: it
compiles what every later server would otherwise compile inside its timed start); each is several times what the
step should take on the tiny model (a server start with Triton's first compilations is the
largest part). A step over its budget is flagged in the table; only the total can fail the check.
"""

from __future__ import annotations

from eval.gpu_check import exact, kernels, model, preflight, radix, refusals, rotary_step, scr, startup
from eval.gpu_check.runner import Step

STEPS = (
    Step("preflight", preflight.run, 30, "driver, torch sees the GPU, Triton, SGLang 0.5.16 imports, the model builder"),
    Step("startup", startup.run, 0, "SGLang's start-up path of the tiny model as on CUDA (text-only); one untimed "
         "server that builds the JIT and Triton kernels", timed=False),
    Step("model", model.run, 20, "the tiny model is bf16 and runs in bf16 on the device (vs the fp32 reference)"),
    Step("refusals", refusals.run, 50, "the launcher refuses settings that break a policy's promise (exit 2)"),
    Step("rotary", rotary_step.run, 35, "key re-rotation vs SGLang's rotary kernels at Qwen3.6's geometry, to 131,072"),
    Step("kernels", kernels.run, 35, "the kept rule's premise on this GPU: the GDN chunk kernel and the unified extend "
         "attention give a 64-grid split read the unsplit read's bits (the server's start-up self-test)"),
    Step("radix", radix.run, 60, "radix under the serving profile: turn 2 hits, events written"),
    Step("exact-64", exact.run_64, 105, "exact, piece 64: warm = cold bit for bit, alone and beside 1 and 3 neighbours"),
    Step("exact-832", exact.run_832, 75, "exact, piece 832: warm = cold bit for bit, alone and beside 1 and 3 neighbours"),
    Step("exact-kept", exact.run_kept, 90, "exact, cut=kept keeps=inside (the start-up self-test guard held): warm "
         "reads resumed from states kept inside forwards, where no cold read ends a forward = cold bit for bit, "
         "alone and beside 1 and 3 neighbours"),
    Step("scr", scr.run, 100, "scr with CUDA graphs: an edited turn relocates with no fallback"),
)
NAMES = tuple(step.name for step in STEPS)


def select(only: list[str] | None) -> list[Step]:
    """The steps named in ``only`` (in the check's order), or all of them."""
    return [step for step in STEPS if not only or step.name in only]
