"""Response headers that make the registry's own origin safe to browse (issue 17, item 1).

Every response carries a strict Content-Security-Policy: scripts only from this origin (the
dashboard's plotly, htmx and figure code are static files; figure specs are JSON data blocks,
which a policy does not execute), no plugins, no framing, forms only to this origin. Styles
allow inline attributes because plotly and Swagger UI write ``style`` at run time; a style
cannot run code. Bundle files (``/api/v1/bundles/{id}/files/...``) get a stricter policy of
their own (``sandbox``), set by that view, which this middleware keeps.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

__all__ = [
    "DEFAULT_POLICY",
    "FILE_POLICY",
    "REDOC_LOGO",
    "ContentSecurityPolicyMiddleware",
    "policy_with",
]

DEFAULT_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "worker-src 'self' blob:",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
# A stored file is data: nothing in it may run, load or be framed, even if a browser were
# talked into rendering it.
FILE_POLICY = "default-src 'none'; sandbox; frame-ancestors 'none'"
# ReDoc (2.x, the drf-spectacular sidecar's standalone bundle) draws its "API docs by Redocly"
# attribution with this image, a URL compiled into the bundle with no option to change or hide
# it. The ReDoc page alone may load exactly this file (a source with a path matches only that
# path); no other page, and no other remote image anywhere.
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def policy_with(directive: str, *sources: str) -> str:
    """The site's policy with ``sources`` added to one directive (which must be in it); no
    policy where the site sends none."""
    policy = getattr(settings, "CONTENT_SECURITY_POLICY", DEFAULT_POLICY)
    if not policy:
        return ""
    parts = [part.strip() for part in policy.split(";")]
    found = [i for i, part in enumerate(parts) if part.split(" ", 1)[0] == directive]
    if not found:
        raise ValueError(f"the Content-Security-Policy has no {directive} directive")
    parts[found[0]] = " ".join([parts[found[0]], *sources])
    return "; ".join(parts)


class ContentSecurityPolicyMiddleware:
    """Adds ``settings.CONTENT_SECURITY_POLICY`` to every response that has none yet."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.policy = getattr(settings, "CONTENT_SECURITY_POLICY", DEFAULT_POLICY)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if self.policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = self.policy
        return response
