"""Radix, exact and scr on a trace without a server (``python -m eval.offline``, ``run.py``): the
arrival order (``arrival.py``), each arm's offline model (``arms.py``, ``scr_arm.py``), the table
(``table.py``) and the GPU time estimate (``gpu_time.py``)."""
