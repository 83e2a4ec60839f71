"""The texts the BrowseComp-Plus agent sends: the question prompt, the CLM-style system prompt,
the agent's own tools (``context``, ``submit``) and the harness notices (``eval/bcp/agent.py``).

They are one module because they shape every trajectory: the run manifest records their hash
(``manifest.prompts_fingerprint``), and ``eval/traces/standin.py`` recognises the notices by them.
"""

from __future__ import annotations

QUERY_PROMPT = """You are a deep-research agent. Answer the question below using the search tools step by step: \
search, read what you find{get_document}, and search again until you are sure.

Question: {question}

When you are done, reply in exactly this format:
Explanation: {{your reasoning, citing the supporting docids in square brackets, e.g. [20] or [3, 17]}}
Exact Answer: {{your short final answer}}
Confidence: {{your confidence in the answer, 0-100%}}"""

CLM_SYSTEM = """You are a research agent with an editable context. The conversation you see is your \
live context; the `context` tool shows it as text (one [[CTX_TURN i role=...]] block per turn) and \
edits it: delete turns you no longer need, or replace text in a turn with a shorter summary. \
Turns 0 and 1 (this prompt and the task) cannot change.

Editing has a cost: after an edit, everything from the first changed turn to the end is read again \
by the server. Batch your edits, edit rarely, and prefer to compact old material near the end of \
the context. Your context budget is {budget} tokens; you will be warned as it fills up, and turns \
are rolled back if you go over it. A turn that only edits the context is free.

{finish}"""

FINISH_SUBMIT = "When you have the answer, call `submit` with the whole answer text (Explanation, Exact Answer, Confidence)."
FINISH_TEXT = "When you have the answer, reply with it without calling a tool."

CONTEXT_TOOL = {
    "type": "function",
    "function": {
        "name": "context",
        "description": "View or edit your live context. action=view shows it; action=delete removes the "
                       "listed turns; action=replace replaces the text `old` (which must occur exactly once) "
                       "by `new`.",
        "parameters": {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["view", "delete", "replace"]},
                "turns": {"type": "array", "items": {"type": "integer"}, "description": "turns to delete"},
                "old": {"type": "string"},
                "new": {"type": "string"},
            },
            "required": ["action"],
        },
    },
}

SUBMIT_TOOL = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Submit your final answer (Explanation, Exact Answer, Confidence) and end the task.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    },
}

NO_TOOL_CALL = "(No tool call in your last turn. Continue with a tool call, or call `submit` with your final answer.)"
NUDGE = ("[CONTEXT NOTICE] Your context has passed {ratio:.0%} of its budget: {tokens} of {budget} tokens. Consider "
         "compacting it with the `context` tool: delete or summarise what you no longer need.")
URGENT = ("[CONTEXT WARNING] Your context is at {tokens} tokens, close to the limit of {limit}. Compact it "
          "now with the `context` tool, or turns will be rolled back.")
FINALIZE = "[SYSTEM NOTICE] Only {n} turn(s) remain. Give your final answer now."
LEDGER = ("[ROLLBACK LEDGER] Your context went over its limit of {limit} tokens {count} time(s); {turns} recent "
          "turn(s) were removed in all. Compact your context with the `context` tool before continuing.")

# Hashed into the run manifest, in this order (changing the order changes every fingerprint).
FINGERPRINTED = (QUERY_PROMPT, CLM_SYSTEM, CONTEXT_TOOL, SUBMIT_TOOL, NUDGE, URGENT, FINALIZE, LEDGER, NO_TOOL_CALL)
