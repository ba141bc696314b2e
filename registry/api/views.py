"""Thin views: parse, call a service, shape the answer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from django.conf import settings
from django.http import FileResponse, HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import AllowAny
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from config.security import FILE_POLICY
from registry.api.parsers import BoundedJSONParser
from registry.api.serializers import (
    SUMMARY_FIELDS,
    BundleDetailSerializer,
    BundleSerializer,
    LookupErrorSerializer,
    LookupRequestSerializer,
    LookupResponseSerializer,
    ProblemsSerializer,
    UploadResponseSerializer,
    UploadSerializer,
    bundle_summaries,
)
from registry.api.throttles import LookupThrottle, UploadThrottle
from registry.filtersets import BundleFilterSet
from registry.models import Bundle
from registry.permissions import NotAllowed
from registry.services import PublishError, bundle_archive_chunks, publish_upload
from registry.services.checkout import BlobDriftError, checkout_file
from registry.services.lookup import run_lookup
from registry.services.publish import QuotaExceeded
from registry.tokens import HashedTokenAuthentication

if TYPE_CHECKING:
    from django.db.models import QuerySet
    from rest_framework.request import Request

__all__ = ["ApiRootView", "BundleViewSet", "LookupView", "lookup"]

# Bundle files are data and are always served as downloads (issue 17, item 1): a type from
# this table or application/octet-stream, never one guessed from the name (an .html or .svg
# stored before the registry refused them must not come back as text/html or image/svg+xml).
CONTENT_TYPES = {".csv": "text/csv", ".yaml": "application/yaml", ".yml": "application/yaml",
                 ".json": "application/json", ".jsonl": "application/jsonl",
                 ".md": "text/plain", ".txt": "text/plain"}


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
        status=status.HTTP_503_SERVICE_UNAVAILABLE, content_type="application/json",
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
        return Response({
            "bundles": request.build_absolute_uri(reverse("registry-api:bundle-list")),
            "lookup": request.build_absolute_uri(reverse("registry-api:lookup")),
            "schema": request.build_absolute_uri(reverse("schema")),
            "docs": request.build_absolute_uri(reverse("swagger-ui")),
        })


@extend_schema(tags=["bundles"])
class BundleViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Bundle]
):
    """Published bundles: list and filter, details with tables, download, upload."""

    queryset = Bundle.objects.all()
    filterset_class = BundleFilterSet
    ordering_fields = (
        "id", "published_at", "measured_at", "hardware", "model", "variant", "vllm_version",
        "size",
    )
    ordering = ("-published_at", "-id")
    lookup_value_regex = r"[0-9]+"
    # Reads are anonymous; uploads need a DRF token ("Authorization: Token <key>").
    authentication_classes = (HashedTokenAuthentication,)
    parser_classes = (MultiPartParser, FormParser)
    throttle_classes = (UploadThrottle,)

    def get_queryset(self) -> QuerySet[Bundle]:
        queryset = Bundle.objects.all()
        if self.action == "retrieve":
            return queryset.select_related("published_by").prefetch_related("tables")
        return queryset

    def get_serializer_class(self) -> type[BundleSerializer]:
        return BundleSerializer if self.action == "list" else BundleDetailSerializer

    def list(self, request: Request) -> Response:
        """Bundles, newest first, with their deployment targets; filter, order, paginate."""
        queryset = self.filter_queryset(self.get_queryset()).values(*SUMMARY_FIELDS)
        page = self.paginate_queryset(queryset)
        assert page is not None  # pagination is always on
        return self.get_paginated_response(bundle_summaries(list(page), request))

    @extend_schema(
        request={"multipart/form-data": UploadSerializer},
        responses={
            201: OpenApiResponse(UploadResponseSerializer, description="a new bundle"),
            200: OpenApiResponse(UploadResponseSerializer, description="identical content exists"),
            400: OpenApiResponse(ProblemsSerializer, description="every problem found"),
            401: OpenApiResponse(description="no token, or a wrong one"),
            403: OpenApiResponse(description="the name belongs to another publisher"),
            413: OpenApiResponse(ProblemsSerializer, description="over the publisher's quota"),
        },
    )
    def create(self, request: Request) -> Response:
        """Upload a bundle archive (.tar.gz or .zip), validated in full before anything is kept."""
        upload = request.FILES.get("archive")
        if upload is None:
            return Response(
                {"problems": ["send the bundle archive as the multipart field 'archive'"]},
                status=status.HTTP_400_BAD_REQUEST,
            )
        try:
            result = publish_upload(upload, published_by=request.user)
        except NotAllowed as exc:
            raise PermissionDenied(str(exc)) from None
        except QuotaExceeded as exc:
            return Response(
                {"problems": exc.problems}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
            )
        except PublishError as exc:
            return Response({"problems": exc.problems}, status=status.HTTP_400_BAD_REQUEST)
        bundle = Bundle.objects.select_related("published_by").prefetch_related("tables").get(
            pk=result.bundle.pk
        )
        body = BundleDetailSerializer(bundle, context=self.get_serializer_context()).data
        body.update(
            created=result.created,
            left_out=result.left_out,
            left_out_reasons=result.left_out_reasons,
        )
        headers = {"Location": body["url"]} if result.created else {}
        code = status.HTTP_201_CREATED if result.created else status.HTTP_200_OK
        return Response(body, status=code, headers=headers)

    @extend_schema(
        responses={
            (200, "application/gzip"): OpenApiResponse(OpenApiTypes.BINARY),
            304: OpenApiResponse(description="If-None-Match matched the bundle's sha256"),
            404: OpenApiResponse(description="no such bundle"),
            503: OpenApiResponse(description="a stored file is missing or damaged"),
        },
    )
    @action(detail=True, methods=["get"], url_path="download")
    def download(self, request: Request, pk: str | None = None) -> HttpResponse:
        """The bundle as .tar.gz; ETag is the bundle's sha256, so the download is cacheable."""
        bundle = self.get_object()
        etag = f'"{bundle.sha256}"'
        if _etag_matches(request, etag):
            return _not_modified(etag)
        try:
            chunks = bundle_archive_chunks(bundle)
        except BlobDriftError as exc:
            return _storage_fault(exc)
        response = StreamingHttpResponse(chunks, content_type="application/gzip")
        response["ETag"] = etag
        response["Content-Disposition"] = f'attachment; filename="{bundle.archive_stem}.tar.gz"'
        response["Cache-Control"] = "public, max-age=31536000, immutable"
        response["X-Bundle-Sha256"] = bundle.sha256
        return response

    @extend_schema(
        parameters=[OpenApiParameter("path", str, OpenApiParameter.PATH, description="file path")],
        responses={
            (200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY),
            304: OpenApiResponse(description="If-None-Match matched the file's sha256"),
            404: OpenApiResponse(description="no such bundle or file"),
            503: OpenApiResponse(description="the stored file is missing or damaged"),
        },
    )
    @action(detail=True, methods=["get"], url_path=r"files/(?P<path>.+)")
    def files(self, request: Request, pk: str | None = None, path: str = "") -> HttpResponse:
        """One file of the bundle, byte for byte as published; ETag is its sha256."""
        bundle = self.get_object()
        record = bundle.file_record(path)
        if record is None:
            raise NotFound(f"bundle {bundle.pk} has no file {path!r}")
        etag = f'"{record["sha256"]}"'
        if _etag_matches(request, etag):
            return _not_modified(etag)
        suffix = "." + path.rsplit(".", 1)[-1].lower() if "." in path else ""
        try:
            # From the verified checkout: a drifted blob is never served under its ETag.
            local = checkout_file(bundle, record)
        except BlobDriftError as exc:
            return _storage_fault(exc)
        response = FileResponse(
            local.open("rb"),
            content_type=CONTENT_TYPES.get(suffix, "application/octet-stream"),
            as_attachment=True,
            filename=path.rsplit("/", 1)[-1],
        )
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Security-Policy"] = FILE_POLICY
        response["ETag"] = etag
        response["Cache-Control"] = "public, max-age=31536000, immutable"
        return response


class JSONOnlyNegotiation(BaseContentNegotiation):
    """The lookup speaks JSON only: skip parsing Accept headers (DRF's documented pattern)."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0]

    def select_renderer(self, request: Request, renderers: Any, format_suffix: Any = None) -> Any:
        return (renderers[0], renderers[0].media_type)


class FastJSONRenderer(JSONRenderer):
    """DRF's compact JSON (no indent: the negotiation above never asks for one), written by
    orjson: 10,000 answers in about 1 ms instead of 25. Floats print in their shortest
    round-trip form, as json's do (``1e-7`` where json writes ``1e-07``)."""

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        if data is None:
            return b""
        try:
            return orjson.dumps(data)
        except TypeError:  # a type orjson does not write: DRF's encoder does
            return super().render(data, accepted_media_type, renderer_context)


@extend_schema(tags=["lookup"])
class LookupView(APIView):
    """Component times from a bundle, interpolated inside measured support only.

    Kept lean because simulators call it per step: JSON in and out, no negotiation, and a
    throttle only when a rate is configured. The URL is served by ``lookup`` below, which
    answers the common request itself and hands every other one to this view.
    """

    # Anonymous, or a token (so that a throttle can count per user); no session lookups.
    authentication_classes = (HashedTokenAuthentication,)
    permission_classes = (AllowAny,)
    throttle_classes = (LookupThrottle,)
    parser_classes = (BoundedJSONParser,)
    renderer_classes = (FastJSONRenderer,)
    content_negotiation_class = JSONOnlyNegotiation

    def get_throttles(self) -> list[Any]:
        return super().get_throttles() if settings.REGISTRY.get("LOOKUP_THROTTLE") else []

    @extend_schema(
        request=LookupRequestSerializer,
        responses={
            200: LookupResponseSerializer,
            400: OpenApiResponse(description="malformed request"),
            404: OpenApiResponse(LookupErrorSerializer, description="no such bundle"),
            409: OpenApiResponse(LookupErrorSerializer, description="stored bundle is corrupt"),
            503: OpenApiResponse(LookupErrorSerializer, description="a stored file is missing"),
            422: OpenApiResponse(LookupErrorSerializer, description="no table for the target"),
        },
    )
    def post(self, request: Request) -> Response:
        """One answer per query: ``{"time_us": t}`` or ``{"error": code, "message": why}``."""
        http_status, body = run_lookup(request.data)
        return Response(body, status=http_status)


_lookup_view = LookupView.as_view()
_RENDERER = FastJSONRenderer()
# A run of 19 digits (every digit made "0", then searched: ten times faster than a regular
# expression): maybe an integer beyond int64, which orjson reads as a float and json as an
# int. A float with that many digits merely takes the json path too.
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_NUMBER = b"0" * 19
_UTF8 = ("utf-8", "utf8")


def plain_lookup_body(request: HttpRequest) -> Any:
    """The body of a common lookup request, read by orjson; None for any other request.

    Common: a POST of a JSON body (UTF-8, no larger than Django reads into memory) with no
    credentials while no throttle is configured. orjson reads such a body exactly as DRF's
    JSONParser (json) does, except where it refuses (NaN, 1e400, lone surrogates, a BOM,
    invalid UTF-8: json's reading or error then stands) and for integers beyond int64, which
    the digit check sends to json.
    """
    meta = request.META
    if (
        request.method != "POST"
        or "HTTP_AUTHORIZATION" in meta
        or settings.REGISTRY.get("LOOKUP_THROTTLE")
        or request.content_params.get("charset", settings.DEFAULT_CHARSET).lower() not in _UTF8
    ):
        return None
    try:
        length = int(meta.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if length <= 0 or (limit is not None and length > limit):
        return None
    body = request.body
    if _LONG_NUMBER in body.translate(_DIGITS_AS_ZERO):
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


@csrf_exempt
def lookup(request: HttpRequest) -> HttpResponse:
    """POST /api/v1/lookup, as ``LookupView`` answers it, without DRF's request cycle for
    the common request (``plain_lookup_body``): simulators send one per step. Every other
    request, and every error DRF words (a malformed body, a method, a token, a throttle),
    goes to the view.
    """
    data = plain_lookup_body(request)
    if data is None:
        return _lookup_view(request)  # type: ignore[no-any-return]
    return lookup_response(data)


def lookup_response(data: Any) -> HttpResponse:
    """LookupView's response to a parsed body, written by orjson."""
    http_status, body = run_lookup(data)
    response = HttpResponse(
        _RENDERER.render(body), content_type="application/json", status=http_status
    )
    response["Allow"] = "POST, OPTIONS"  # as LookupView's responses carry it
    return response


# The schema generator (drf-spectacular) documents the URL through the view it names.
lookup.cls = LookupView  # type: ignore[attr-defined]
lookup.initkwargs = {}  # type: ignore[attr-defined]
