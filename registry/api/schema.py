"""OpenAPI post-processing: the error answers every operation can give, documented once
(issue 17, item 9: schemathesis found 400, 401, 403, 404 and 429 undocumented).

DRF answers these for any view (a malformed query or body, a missing or wrong token, a
permission refused, an unknown id, a throttle); listing them per view would repeat the same
lines everywhere and miss the next view.
"""

from __future__ import annotations

from typing import Any

__all__ = ["add_error_responses"]

_DETAIL = {"$ref": "#/components/schemas/ErrorDetail"}
_ANY_OBJECT = {"type": "object", "additionalProperties": True}
_COMMON = {
    "400": ("the request is malformed; the body names each problem", _ANY_OBJECT),
    "401": ("no token, or a token that is not valid", _DETAIL),
    "403": ("the user may not do this", _DETAIL),
    "404": ("no such object", _DETAIL),
    "429": ("too many requests; see Retry-After", _DETAIL),
}


def add_error_responses(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault(
        "ErrorDetail",
        {
            "type": "object",
            "properties": {"detail": {"type": "string"}},
            "required": ["detail"],
        },
    )
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            responses = operation.setdefault("responses", {})
            for code, (description, body) in _COMMON.items():
                if code not in responses:
                    responses[code] = {
                        "description": description,
                        "content": {"application/json": {"schema": body}},
                    }
                elif "content" not in responses[code]:
                    # A view that lists the status without a body (``401: None``) still
                    # answers DRF's JSON: document that body under the view's description.
                    responses[code]["content"] = {"application/json": {"schema": body}}
                    if responses[code].get("description") in (None, "", "No response body"):
                        responses[code]["description"] = description
    return result
