"""Thin views: parse, call a service, shape the answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.http import HttpResponse
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
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


@extend_schema(exclude=True)
class ApiRootView(APIView):
    """Where API v1's resources are."""

    permission_classes = (AllowAny,)

    def get(self, request: Request) -> Response:
        return Response(
            {
                "bundles": request.build_absolute_uri(reverse("registry-api:bundle-list")),
                "lookup": request.build_absolute_uri(reverse("registry-api:lookup")),
                "clusters": request.build_absolute_uri(reverse("registry-api:cluster-list")),
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
        # The door reads application/json only (any other type is a 400).
        request={"application/json": LookupRequestSerializer},
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
