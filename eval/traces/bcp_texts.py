"""The fixed texts a BrowseComp-Plus client sends around a run file's items, in this project's words.

``eval.traces import --format bcp-run`` rebuilds each LM call of a run file as the client that
wrote it made it (``bcp_runs.py``). The clients in texttron/BrowseComp-Plus ``search_agent/`` wrap
the question in a query template, describe their tools and (Tongyi's ReAct client) put a system
prompt with the tool signature in front. That repository carries no licence, so its texts are not
reproduced here: each text below is written for this project, with the same role, the same
structure (what comes first, where the question and the tool signature sit) and the same length in
Qwen3.6 tokens as the client's own, measured once from ``search_agent/`` at commit 97c637c with
``eval/qwen_tokenizer.py`` (``MEASURED``; ``tests/unit/test_bcp_runs.py`` keeps each text within
3 tokens of it). What a cache policy sees of these texts is their length, their place and that
every question of a run shares them; their wording changes only the tokens themselves.
"""

from __future__ import annotations

import json

# Qwen3.6 tokens of the clients' own texts (search_agent/ at 97c637c; the query templates without the
# question; the Tongyi system prompt with a 10-character date; the search description with k = 5).
MEASURED = {"react_system": 274, "query": 146, "query_get_document": 152, "search_description": 38,
            "get_document_description": 9, "react_final": 57}

# Tongyi-DeepResearch's ReAct client (tongyi_client.py): a system prompt with the role, the answer
# tags, the search tool's JSON signature and the call format, ending with the current date.
REACT_SEARCH_SIGNATURE = {"type": "function", "function": {
    "name": "search", "description": "Run a web search and get back the best matching results as text. Give one query.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "What to search for."}},
                   "required": ["query"]}}}

REACT_SYSTEM = (
    "You are a research assistant that investigates questions in depth. Whatever the subject, a general "
    "topic or a narrow academic field, you gather evidence from several reliable and independent sources, "
    "check it against each other, and build an answer that is complete, correct and neutral. Once you "
    "have collected enough to answer with confidence, stop searching and write your whole final answer, "
    "and nothing else after it, between <answer> and </answer> tags, so that it can be read off easily.\n\n# Tools\n\nYou may use the search tool as many times as you need to answer the "
    "question.\n\nThe search tool is described below, inside <tools></tools> tags:\n<tools>\n"
    + json.dumps(REACT_SEARCH_SIGNATURE) + "\n</tools>\n\nTo search, reply with a JSON object holding the "
    "function name and its arguments, between <tool_call></tool_call> tags:\n<tool_call>\n"
    "{\"name\": search, \"arguments\": <args-json-object>}\n</tool_call>\n\nToday's date: ")

REACT_FINAL = ("Your context is now as long as you can handle. Make no further tool calls: think once more about "
               "everything you have gathered above and give the answer you find the most likely, in this form: "
               "<think>your last thoughts</think>\n<answer>your answer</answer>")

# The Responses-API clients (openai_client.py, oss_client.py) and the Qwen-Agent client
# (qwen_client.py): a query template around the question, the tools sent as tool definitions.
QUERY = (
    "You are a deep-research agent. Answer the question below with the help of a search engine, using "
    "the {tools} you are given. Think and call the tool{s} in turns, one step at a time; you may call "
    "{them} as often as you need{more}.\n\nQuestion: {question}\n\nWrite your reply in this form:\n"
    "Explanation: {{why your final answer is right. In this part only, cite the documents you rely on "
    "by putting their docids in square brackets at the end of a sentence, for example [20].}}\n"
    "Exact Answer: {{your final answer, as short as possible}}\n"
    "Confidence: {{how sure you are of the answer, from 0% to 100%}}")


def query_prompt(question: str, get_document: bool) -> str:
    """The query template around ``question`` (with or without the get_document tool)."""
    if get_document:
        return QUERY.format(tools="search and get_document tools", s="s", them="them", more=" to search and read", question=question)
    return QUERY.format(tools="search tool", s="", them="it", more="", question=question)


def search_description(k: int = 5) -> str:
    return (f"Search a knowledge source. Returns the top {k} hits, each with its docid, score and a snippet "
            "holding the start of the document's text (cut to a token limit).")


GET_DOCUMENT_DESCRIPTION = "Fetch a full document by its docid."


def tool_definitions(search_name: str, query_argument: str, get_document: bool, k: int = 5) -> list[dict]:
    """The client's tools as chat-completions tool definitions (the form the template renders)."""
    search = {"type": "function", "function": {
        "name": search_name, "description": search_description(k),
        "parameters": {"type": "object", "properties": {query_argument: {
            "type": "string", "description": "The query to search the knowledge source for"}},
            "required": [query_argument], "additionalProperties": False}}}
    if not get_document:
        return [search]
    fetch = {"type": "function", "function": {
        "name": "get_document", "description": GET_DOCUMENT_DESCRIPTION,
        "parameters": {"type": "object", "properties": {"docid": {"type": "string", "description": "The docid"}},
                       "required": ["docid"], "additionalProperties": False}}}
    return [search, fetch]
