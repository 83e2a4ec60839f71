"""What the server says about itself (``/server_info``, ``/v1/models``), for the run manifest and
for finding the served model's tokenizer (``eval/bcp/snippets.py``).

``/server_info`` is an admin route of the patched server (``serving/route_policy.py``): it is read
with ``$CACHE_POLICY_ADMIN_KEY`` (``eval.http.admin_headers``). The server's keys it lists are
never recorded (``SECRET_KEYS``)."""

from __future__ import annotations

from typing import Any

from eval import http
from eval.bcp.manifest import SERVER_KEYS_VOLATILE
from serving import profile as serving_profile


SECRET_KEYS = ("api_key", "admin_api_key")  # settings /server_info lists that a manifest must not hold


def _get(base_url: str, path: str, headers: dict[str, str] | None = None) -> Any:
    return http.get_json(base_url.rstrip("/") + path, timeout=30.0, headers=headers)


def _raw_server_info(base_url: str) -> dict:
    headers = http.admin_headers()
    try:
        info = _get(base_url, "/server_info", headers)
    except http.HttpError as exc:
        if exc.status in (401, 403):
            raise http.HttpError(exc.method, exc.url, exc.status,
                                 f"{exc.text} (an admin route: export {http.ADMIN_KEY_ENV}=<the server's "
                                 "--admin-api-key>)") from None
        info = _get(base_url, "/get_server_info", headers)  # older servers
    return {k: v for k, v in info.items() if k not in SECRET_KEYS}


def served_model_name(base_url: str) -> str | None:
    """The first model ``/v1/models`` lists; None when the server does not answer."""
    try:
        return _get(base_url, "/v1/models")["data"][0]["id"]
    except Exception:
        return None


def server_description(base_url: str | None) -> dict:
    """The server's settings (scalars only, volatile ones left out), SGLang version and served
    model; {} without a server, ``{"error": ...}`` when it does not describe itself."""
    if not base_url:
        return {}
    info: dict[str, Any] = {}
    try:
        raw = _raw_server_info(base_url)
    except Exception as exc:
        return {"error": f"server_info unavailable: {exc}"}
    info["args"] = {k: v for k, v in sorted(raw.items())
                    if k not in SERVER_KEYS_VOLATILE and (v is None or isinstance(v, (str, int, float, bool)))}
    info["profile"] = serving_profile.identify(raw)  # the --serving-profile the settings match, or None
    info["sglang_version"] = raw.get("version")
    info["served_model"] = served_model_name(base_url)
    return info
