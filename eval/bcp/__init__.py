"""BrowseComp-Plus (BCP) accuracy runs (docs/eval.md §1, §5).

Offline, pure modules (no server needed):

| module         | what                                                                    | spec        |
|----------------|-------------------------------------------------------------------------|-------------|
| `data`         | load queries / answers / qrels / corpus; the published decryption       | §1.2, §1.3  |
| `fixtures`     | a small self-made corpus + questions in the same (encrypted) formats    | §3.3        |
| `retrieval`    | BM25 (bm25s) `Searcher` with a saved index and token-length snippets    | §1.4, §3.4  |
| `snippets`     | which tokenizer cuts the snippets (the served model's, else words)      | §1.5        |
| `tools`        | `search` / `get_document` tools, their schemas and output format        | §1.5, §1.7  |
| `judge`        | grader prompts, strict parser, cached judge client (temperature 0)      | §1.8        |
| `metrics`      | accuracy, evidence recall, tool calls, calibration error, citations     | §1.9        |
| `stats`        | Wilson, exact McNemar, paired bootstrap, TOST, A/A noise floor          | §5.8        |

The agent loop, run journal and CLIs live beside these (agent.py, run.py, compare.py, ...; the
README's table says which module owns what).
"""
# Spec: docs/eval.md
