"""The search agent's tools: ``search`` and ``get_document`` (docs/eval.md §1.5, §1.7).

Shape follows BCP's MCP server (``searcher/tools.py``):

* ``search(query)`` -> JSON list of ``{"docid", "score", "snippet"}``, best first, ``k`` hits
  (BCP default ``--k 5``); ``score`` is left out when it is None. The model does not choose
  ``k`` unless the ToolBox is made with ``expose_k=True`` (then ``search(query, k)``,
  1 <= k <= ``max_k``); BCP fixes k on the server.
* ``get_document(docid)`` -> JSON ``{"docid", "text"}`` with the whole text (offered only with
  ``get_document=True``, like BCP's ``--get-document``).
* Tool descriptions are our own wording of BCP's ("... Returns top-k hits with docid, score, and
  snippet ...").

Interpretations [U]: outputs are ``json.dumps(..., indent=2, ensure_ascii=False)`` (BCP's exact
whitespace is not known; it changes token counts, not content). Where BCP returns None (unknown
docid) or raises (bad arguments), :meth:`ToolBox.call` returns ``{"error": "..."}`` as the tool
output so the agent can continue; it never raises for the model's mistakes.

Bookkeeping for metrics (§1.7, §1.9): every call is kept in ``calls`` (:class:`ToolCall`), and
``retrieved_docids`` is the union, in first-seen order, of docids returned by *search* calls
(not by get_document), which is what BCP's ``retrieved_docids`` holds. ``tool_call_counts``
counts every call by name, errors included; names containing "retrieval" count as ``search``
(BCP's normalisation).
"""
# Spec: docs/eval.md

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from eval.bcp.retrieval import Searcher

SEARCH = "search"
GET_DOCUMENT = "get_document"
DEFAULT_K = 5


@dataclass(frozen=True)
class ToolCall:
    tool_name: str
    arguments: Any  # the parsed dict, or the raw string when it was not a JSON object
    output: str
    docids: tuple[str, ...] = ()
    error: str | None = None

    def result_item(self) -> dict:
        """This call as a BCP run-file ``result`` item (§1.7)."""
        args = self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments, ensure_ascii=False)
        return {"type": "tool_call", "tool_name": self.tool_name, "arguments": args, "output": self.output}


def normalize_tool_name(name: str) -> str:
    """BCP counts any tool whose name contains "retrieval" as ``search`` (§1.5)."""
    return SEARCH if "retrieval" in name else name


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False)


def _error(message: str) -> str:
    return dumps({"error": message})


class ToolBox:
    """The tools offered to one agent run, with a record of what was called."""

    def __init__(self, searcher: Searcher, *, k: int = DEFAULT_K, get_document: bool = True,
                 expose_k: bool = False, max_k: int = 50):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.searcher, self.k, self.with_get_document = searcher, k, get_document
        self.expose_k, self.max_k = expose_k, max_k
        self.calls: list[ToolCall] = []
        self.retrieved_docids: list[str] = []

    def reset(self) -> None:
        self.calls.clear()
        self.retrieved_docids.clear()

    def schemas(self) -> list[dict]:
        """OpenAI function-calling schemas of the offered tools."""
        search_props: dict[str, Any] = {"query": {"type": "string", "description": "The search query."}}
        if self.expose_k:
            search_props["k"] = {"type": "integer", "minimum": 1, "maximum": self.max_k,
                                 "description": f"Number of hits to return (default {self.k})."}
        tools = [_function(SEARCH, f"Search the document collection with a keyword query. Returns the "
                           f"top-{self.k} hits with docid, score, and snippet (the start of the document).",
                           search_props, ["query"])]
        if self.with_get_document:
            tools.append(_function(GET_DOCUMENT, "Get the full text of a document by its docid.",
                                   {"docid": {"type": "string", "description": "The docid of a search hit."}},
                                   ["docid"]))
        return tools

    @property
    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.schemas()]

    def call(self, name: str, arguments: dict | str) -> str:
        """Run one tool call and return its output; failures come back as ``{"error": ...}``."""
        args, problem = _parse_arguments(arguments)
        if problem is None and name not in self.tool_names:
            problem = f"unknown tool {name!r}; available: {', '.join(self.tool_names)}"
        docids: tuple[str, ...] = ()
        if problem is None:
            if name == SEARCH:
                problem, output, docids = self._search(args)
            else:
                problem, output = self._get_document(args)
        if problem is not None:
            output = _error(problem)
        self.calls.append(ToolCall(name, args if args is not None else arguments, output, docids, problem))
        for d in docids:
            if d not in self.retrieved_docids:
                self.retrieved_docids.append(d)
        return output

    def _search(self, args: dict) -> tuple[str | None, str, tuple[str, ...]]:
        allowed = {"query", "k"} if self.expose_k else {"query"}
        problem = _check_keys(args, {"query"}, allowed)
        query = args.get("query")
        if problem is None and (not isinstance(query, str) or not query.strip()):
            problem = "query must be a non-empty string"
        k = args.get("k", self.k)
        if problem is None and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.max_k):
            problem = f"k must be an integer in [1, {self.max_k}]"
        if problem is not None:
            return problem, "", ()
        hits = self.searcher.search(query, k)
        rows = [{"docid": h.docid, "score": h.score, "snippet": h.text} if h.score is not None
                else {"docid": h.docid, "snippet": h.text} for h in hits]
        return None, dumps(rows), tuple(h.docid for h in hits)

    def _get_document(self, args: dict) -> tuple[str | None, str]:
        problem = _check_keys(args, {"docid"}, {"docid"})
        docid = args.get("docid")
        if problem is None and isinstance(docid, int) and not isinstance(docid, bool):
            docid = str(docid)
        if problem is None and not isinstance(docid, str):
            problem = "docid must be a string"
        if problem is not None:
            return problem, ""
        doc = self.searcher.get_document(docid)
        if doc is None:
            return f"document {docid!r} not found", ""
        return None, dumps({"docid": doc.docid, "text": doc.text})

    @property
    def tool_call_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for c in self.calls:
            key = normalize_tool_name(c.tool_name)
            counts[key] = counts.get(key, 0) + 1
        return counts

    @property
    def search_calls(self) -> int:
        return self.tool_call_counts.get(SEARCH, 0)


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


def _parse_arguments(arguments: dict | str) -> tuple[dict | None, str | None]:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return None, f"arguments are not valid JSON ({exc.msg})"
    if not isinstance(arguments, dict):
        return None, "arguments must be a JSON object"
    return arguments, None


def _check_keys(args: dict, required: set[str], allowed: set[str]) -> str | None:
    missing = sorted(required - args.keys())
    if missing:
        return f"missing argument(s): {', '.join(missing)}"
    extra = sorted(args.keys() - allowed)
    if extra:
        return f"unexpected argument(s): {', '.join(extra)}"
    return None
