"""How far ``scr`` answers are from a cold read of the same prompt.

``python -m eval.fidelity --server URL --out DIR [--scenarios FILE] [--events FILE] [--tokens N] [--top K]``

For each scenario (a conversation of token-id prompts) and each arm (a per-request knob salt), the
conversation is served turn by turn through the ``--cache-policy scr`` server at ``URL`` in the
arm's own namespace; every turn after the first is then sent again **cold** (a fresh salt: no
session, no radix match) with the same decode settings: greedy (temperature 0), N tokens
(``ignore_eos``), ``return_logprob`` and the top-K logprobs per generated token. The two answers are
compared (``eval/fidelity/metrics.py`` defines every number). ``--events`` is the server's
``--cache-events`` file: with it each row also gets ``moved``, ``blocks``, ``prefix_reused`` and the
moved share; without it they are ``null`` ("unknown" in the table). Only a loopback server is
accepted (127.0.0.0/8, ``localhost``, ``::1``). Request order and namespaces:
``eval/fidelity/run.py`` and ``eval/fidelity/scenarios.py``. Every request, a cold read included,
opens an SCR session that may hold a side slot, so start the server with ``--cache-policy-set
side_sessions=16`` (= ``max_sessions``) when it serves more than this run: then no conversation
can find every slot taken (it would relocate nothing; the run warns about such an arm).

Outputs in DIR: ``fidelity.jsonl`` (one row per measured request), ``fidelity.csv`` (the same
rows without the id lists), ``table.md`` (per-arm summary, then per-request rows; also printed),
``kl_vs_moved.png`` (first-token KL against moved share, one marker per arm), ``summary.json``.
Progress: one line per scenario on stderr. Exit status: 0 ok; 2 usage error (bad flags, bad
scenario file, non-loopback or unreachable server: one line); 1 a check failed (a cold read that
reused tokens, an answer without the requested tokens or logprobs, a missing or non-scr event, a
request the server refused).

On the tiny random model (``eval/tiny_model.py``) the numbers show the machinery and the ordering
only, not the real model's quality.

Scenario file (``--scenarios FILE``, JSON; default: ``scenarios.DEFAULT_SPEC``)::

    {
      "arms": [                                   # optional; default: fork, none, norerot
        {"name": "fork", "salt": ""},             # no knobs: the server's settings
        {"name": "none", "salt": "kvreuse:knobs:ssm=none"},
        {"name": "norerot", "salt": "kvreuse:knobs:rerot=0"}
      ],
      "scenarios": [
        {"name": "explicit", "turns": [[12, 7, ...], [12, 7, ...]]},   # >= 2 token-id prompts
        {"name": "generated", "seed": 11, "first": 2400,               # turn 1: 2400 ids from seed 11
         "edits": [{"delete": [[1400, 1600]], "append": 40}],          # turn k+1 from turn k
         "arms": [...]}                                                # optional, replaces the file's arms
      ]
    }

* ``name``: 1-64 characters of ``A-Z a-z 0-9 _ -``, unique among scenarios (and among a list's arms).
* ``turns``: explicit prompts, turn 1 first; every later turn is measured.
* generated form: ``first`` ids from ``random.Random(seed)`` in [10, 400) (the generator of
  ``tests/engine/prompts.py``); edit k (1-based) deletes the half-open spans ``[start, end)`` of
  the previous turn's prompt (sorted, disjoint, inside it) and appends ``append`` ids drawn with
  seed ``seed + k``. An SCR session is matched by content, so an edit must keep the first 1024
  tokens for the edited turn to be matched to its conversation (``docs/scr.md`` §4.3).
* arm ``salt``: ``""``, plain text (a namespace, no knobs) or ``kvreuse:knobs:k=v,...``; the run
  appends a unique suffix (``scenarios.arm_salt``). ``kvreuse:off``, other ``kvreuse:`` switches,
  knobs the server would ignore, and single-phase knobs are refused.

In-process use (demo, engine tests): ``run_fidelity(server_url, out_dir, scenarios=None,
events_path=None, tokens=16, top=20)`` returns the summary dict (also written to ``summary.json``,
plus ``rows``).
"""

from eval.fidelity.run import ServerError, UsageError, run_fidelity
from eval.fidelity.scenarios import Arm, Scenario, ScenarioError, default_scenarios, load_scenarios

__all__ = ["Arm", "Scenario", "ScenarioError", "ServerError", "UsageError", "default_scenarios", "load_scenarios",
           "run_fidelity"]
