"""The 10-minute end-to-end check on one GPU (``scripts/gpu_check.sh``, docs/gpu.md "The 10-minute check").

``python -m eval.gpu_check [--device cuda|cpu] [--out DIR] [--only STEP,...] [--quick]`` serves the
tiny model (bf16 on CUDA, built locally, no downloads) under each cache policy and checks what only
a GPU can show: that SGLang's CUDA kernels keep exact's warm = cold bit for bit, that scr relocates
with CUDA graphs on, that the launcher's refusals hold, and that the key re-rotation matches
SGLang's own rotary kernel at Qwen3.6's geometry. ``--device cpu`` runs the same steps on CPU as a
dry run (GPU-only parts are reported as skipped). One summary table at the end, a JSON report, and
exit status 1 when any step failed.
"""
