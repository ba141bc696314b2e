"""URL map: the landing page, the REST API v1, its OpenAPI schema and docs, the admin."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import include, path
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerSplitView,
)
from rest_framework.response import Response

from config.security import REDOC_LOGO, policy_with


class RedocView(SpectacularRedocView):
    """ReDoc under the site's policy, plus the one image its bundle loads from Redocly's CDN
    (config.security.REDOC_LOGO; without it the browser reports a blocked image)."""

    # The override would otherwise drop the parent's exclusion and join the API schema.
    @extend_schema(exclude=True)
    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Response:
        # drf-spectacular leaves its views untyped.
        response: Response = super().get(request, *args, **kwargs)  # type: ignore[no-untyped-call]
        if policy := policy_with("img-src", REDOC_LOGO):
            response["Content-Security-Policy"] = policy
        return response


urlpatterns = [
    path("", include("frontend.urls")),
    path("api/v1/", include("registry.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's start-up script as a file: no inline script, so the
    # dashboard's Content-Security-Policy (config/security.py) holds on the docs page too.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="swagger-ui"),
    path(
        "api/redoc/",
        RedocView.as_view(url_name="schema", template_name="frontend/redoc.html"),
        name="redoc",
    ),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
]
