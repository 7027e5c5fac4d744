"""The access rules written into the OpenAPI schema, so clients and fuzzers know them.

Every route that needs a key documents the bearer scheme, its 401 and its 403; an HTML
route's 401 is its sign-in page. The rights come from ``service.api.access``, the same
function the requests are checked with.
"""

from __future__ import annotations

from typing import Any

from service.api.access import right_for
from service.api.schemas import answers
from service.settings import Settings

SCHEME = {"type": "http", "scheme": "bearer", "description": "An API key: dlk_..."}


def document_access(schema: dict[str, Any], settings: Settings) -> None:
    """Add the security scheme and each guarded operation's 401/403 to ``schema``."""
    components = schema.setdefault("components", {})
    components.setdefault("securitySchemes", {})["bearer"] = SCHEME
    refusals = {
        str(code): _response(body)
        for code, body in answers(401, 403).items()  # the ErrorPublic model, by reference
    }
    public = frozenset(settings.public_paths)
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            right = right_for(method.upper(), path, public)
            if right is None:
                continue
            operation["security"] = [{"bearer": []}]
            responses = operation.setdefault("responses", {})
            for code, refusal in refusals.items():
                if code in responses:
                    continue
                html = code == "401" and _is_html(operation)
                responses[code] = _html_refusal() if html else refusal
            responses["403"]["description"] += f" This route needs {right!r}."


def _response(body: dict[str, Any]) -> dict[str, Any]:
    ref = {"$ref": "#/components/schemas/ErrorPublic"}
    return {"description": body["description"], "content": {"application/json": {"schema": ref}}}


def _html_refusal() -> dict[str, Any]:
    schema = {"type": "string"}
    return {"description": "The sign-in page.", "content": {"text/html": {"schema": schema}}}


def _is_html(operation: dict[str, Any]) -> bool:
    ok = operation.get("responses", {}).get("200", {})
    return "text/html" in ok.get("content", {})
