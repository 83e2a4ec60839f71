"""What a client changes to send a ``/generate`` call through ``sglang-router`` instead of to one server.

1. **Forced ids travel in the processor field.** The router re-encodes each body through its own
   typed request, which has no ``sampling_params.custom_params``: forced decoding's ids would be
   dropped (the worker then answers greedily and the replay stops at the first call with
   ``Mismatch``). They are sent as ``custom_logit_processor`` = ``{"forced_output_ids": [...]}``,
   the spelling ``serving/forced.py`` reads as data. ``rid`` and ``extra_key`` pass unchanged.
2. **The affinity header** (``eval/cluster/affinity.py``), when the router pins routing keys
   (its ``manual`` policy).
"""

from __future__ import annotations

import copy

from eval.cluster.affinity import affinity_headers
from serving.forced import FORCED_KEY, envelope


def for_router(payload: dict, affinity: bool) -> tuple[dict, dict[str, str] | None]:
    """(body, headers) of ``payload`` sent through the router; ``payload`` itself is not changed."""
    headers = affinity_headers(payload) if affinity else None
    custom = (payload.get("sampling_params") or {}).get("custom_params")
    if not isinstance(custom, dict) or FORCED_KEY not in custom:
        return payload, headers
    body = copy.deepcopy(payload)
    rest = {k: v for k, v in custom.items() if k != FORCED_KEY}
    body["custom_logit_processor"] = envelope(custom[FORCED_KEY])
    if rest:
        body["sampling_params"]["custom_params"] = rest
    else:
        del body["sampling_params"]["custom_params"]
    return body, headers
