"""The lookup's short way through Django's request cycle."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, get_script_prefix, resolve, reverse

from registry.api.views import lookup, lookup_response, plain_lookup_body

__all__ = ["LookupMiddleware"]


class LookupMiddleware:
    """Answers the common POST /api/v1/lookup (``plain_lookup_body``) that carries no cookie,
    before the middleware listed after this one and without resolving its URL.

    Simulators send one such request per step. The middleware after this one (sessions, CSRF,
    authentication, messages) would do nothing for it: with no cookie there is no session,
    CSRF token or message to read or reset, and the lookup reads no user and is CSRF-exempt.
    The middleware before it (security headers, host validation, Content-Length,
    X-Frame-Options) treat it as any other request. Every other request goes on as usual,
    the rest of the lookups to the same view.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.paths: frozenset[str] | None = None

    def _lookup_paths(self) -> frozenset[str]:
        """The paths the URL conf routes to the lookup (with and without the slash)."""
        # reverse() writes the script prefix; request.path_info has none
        path = "/" + reverse("registry-api:lookup").removeprefix(get_script_prefix()).strip("/")
        paths = set()
        for candidate in (path, path + "/"):
            try:
                if resolve(candidate).func is lookup:
                    paths.add(candidate)
            except Resolver404:
                pass
        return frozenset(paths)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if self.paths is None:
            self.paths = self._lookup_paths()
        if request.path_info in self.paths and not request.META.get("HTTP_COOKIE"):
            data = plain_lookup_body(request)
            if data is not None:
                return lookup_response(data)
        return self.get_response(request)
