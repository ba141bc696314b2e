"""Thin views: parse, call a service, shape the answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
from django.http import HttpResponse
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.api.serializers import (
    LookupErrorSerializer,
    LookupRequestSerializer,
    LookupResponseSerializer,
    ProblemsSerializer,
)

if TYPE_CHECKING:
    from rest_framework.request import Request

__all__ = ["ApiRootView", "LookupDocumentation"]

# Bundle files are data and are always served as downloads (issue 17, item 1): a type from
# this table or application/octet-stream, never one guessed from the name (an .html or .svg
# stored before the registry refused them must not come back as text/html or image/svg+xml).
CONTENT_TYPES = {
    ".csv": "text/csv",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
    ".json": "application/json",
    ".jsonl": "application/jsonl",
    ".md": "text/plain",
    ".txt": "text/plain",
}


def _etag_matches(request: Request, etag: str) -> bool:
    header = request.headers.get("If-None-Match", "")
    if not header:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in header.split(",")]
    return "*" in tags or etag in tags


def _storage_fault(exc: Exception) -> HttpResponse:
    """A stored file is missing or damaged: a clear 503, never a 500 or a cut connection."""
    response = HttpResponse(
        orjson.dumps({"error": "storage_fault", "message": str(exc)}),
        status=status.HTTP_503_SERVICE_UNAVAILABLE,
        content_type="application/json",
    )
    response["Retry-After"] = "300"
    return response


def _not_modified(etag: str) -> HttpResponse:
    response = HttpResponse(status=status.HTTP_304_NOT_MODIFIED)
    response["ETag"] = etag
    return response


@extend_schema(exclude=True)
class ApiRootView(APIView):
    """Where API v1's resources are."""

    permission_classes = (AllowAny,)

    def get(self, request: Request) -> Response:
        return Response(
            {
                "bundles": request.build_absolute_uri(reverse("registry-api:bundle-list")),
                "lookup": request.build_absolute_uri(reverse("registry-api:lookup")),
                "schema": request.build_absolute_uri(reverse("schema")),
                "docs": request.build_absolute_uri(reverse("swagger-ui")),
            }
        )


@extend_schema(tags=["lookup"])
class LookupDocumentation(APIView):
    """Component times from a bundle, interpolated inside measured support only.

    The URL is served by ``registry.lookup.http.lookup`` (the one door,
    which answers every lookup request); drf-spectacular reads this class to describe it.
    """

    permission_classes = (AllowAny,)

    @extend_schema(
        request=LookupRequestSerializer,
        parameters=[
            OpenApiParameter("backend", str, description="pin: execution path or kernel"),
            OpenApiParameter("vllm_version", str, description="pin: the vLLM version"),
            OpenApiParameter("bundle", str, description="pin: a bundle id or sha256"),
        ],
        responses={
            200: LookupResponseSerializer,
            400: OpenApiResponse(ProblemsSerializer, description="malformed request"),
            404: OpenApiResponse(LookupErrorSerializer, description="no such bundle"),
            409: OpenApiResponse(LookupErrorSerializer, description="stored bundle is corrupt"),
            503: OpenApiResponse(LookupErrorSerializer, description="a stored file is missing"),
            422: OpenApiResponse(LookupErrorSerializer, description="no table for the target"),
        },
    )
    def post(self, request: Request) -> HttpResponse:
        """One answer per query: ``{"time_us": t}`` or ``{"error": code, "message": why}``;
        the body and the X-Bundle-* headers say which bundle answered."""
        # Never routed here (the URL maps to the one door itself); should a caller reach this
        # class anyway, it still gets the one door's answer.
        from registry.lookup.http import lookup

        return lookup(request._request)
