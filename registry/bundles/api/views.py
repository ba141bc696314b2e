"""Thin views: parse, call a service, shape the answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
from django.http import FileResponse, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from config.security import FILE_POLICY
from registry.api.faults import storage_fault
from registry.api.serializers import ProblemsSerializer
from registry.bundles.api.serializers import (
    SUMMARY_FIELDS,
    BundleDetailSerializer,
    BundleSerializer,
    UploadResponseSerializer,
    UploadSerializer,
    bundle_summaries,
)
from registry.api.throttles import UploadThrottle
from registry.api.uploads import publish_field
from registry.filtersets import BundleFilterSet
from registry.bundles.models import Bundle
from registry.permissions import NotAllowed
from registry.bundles.services import PublishError, bundle_archive_chunks, publish_upload
from registry.bundles.services.checkout import BlobDriftError, checkout_file
from registry.bundles.services.export import format_archive
from registry.bundles.services.publish import QuotaExceeded
from registry.tokens import HashedTokenAuthentication

if TYPE_CHECKING:
    from django.db.models import QuerySet
    from rest_framework.request import Request

__all__ = ["BundleViewSet"]

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


def _not_modified(etag: str) -> HttpResponse:
    response = HttpResponse(status=status.HTTP_304_NOT_MODIFIED)
    response["ETag"] = etag
    return response


@extend_schema(tags=["bundles"])
class BundleViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Bundle]
):
    """Published bundles: list and filter, details with tables, download, upload."""

    queryset = Bundle.objects.all()
    filterset_class = BundleFilterSet
    ordering_fields = (
        "id",
        "published_at",
        "measured_at",
        "hardware",
        "model",
        "variant",
        "vllm_version",
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
        result = publish_field(request, "archive", "the bundle archive", publish_upload)
        if isinstance(result, Response):
            return result
        bundle = (
            Bundle.objects.select_related("published_by")
            .prefetch_related("tables")
            .get(pk=result.bundle.pk)
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
    def download(self, request: Request, pk: str | None = None) -> HttpResponseBase:
        """The bundle as .tar.gz; ETag is the bundle's sha256, so the download is cacheable."""
        bundle = self.get_object()
        etag = f'"{bundle.sha256}"'
        if _etag_matches(request, etag):
            return _not_modified(etag)
        try:
            chunks = bundle_archive_chunks(bundle)
        except BlobDriftError as exc:
            return storage_fault(str(exc))
        response = StreamingHttpResponse(chunks, content_type="application/gzip")
        response["ETag"] = etag
        response["Content-Disposition"] = f'attachment; filename="{bundle.archive_stem}.tar.gz"'
        response["Cache-Control"] = "public, max-age=31536000, immutable"
        response["X-Bundle-Sha256"] = bundle.sha256
        return response

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "fmt",
                str,
                OpenApiParameter.PATH,
                enum=["llmservingsim", "aiconfigurator"],
                description="llmservingsim: the historical moe-components-v1 layout; "
                "aiconfigurator: its MoE perf table (balanced rows)",
            )
        ],
        responses={
            (200, "application/gzip"): OpenApiResponse(OpenApiTypes.BINARY),
            422: OpenApiResponse(ProblemsSerializer, description="what the format cannot express"),
        },
    )
    @action(detail=True, methods=["get"], url_path=r"export/(?P<fmt>[a-z]+)")
    def export(self, request: Request, pk: str | None = None, fmt: str = "") -> HttpResponse:
        """The bundle written for another simulator (``python -m moetables export``)."""
        from moetables.export import FORMATS, ExportError

        bundle = self.get_object()
        if fmt not in FORMATS:
            raise NotFound(f"no export format {fmt!r}; formats are {', '.join(FORMATS)}")
        try:
            name, data = format_archive(bundle, fmt)
        except ExportError as exc:
            return Response({"problems": exc.problems}, status=status.HTTP_422_UNPROCESSABLE_ENTITY)
        response = HttpResponse(data, content_type="application/gzip")
        response["Content-Disposition"] = f'attachment; filename="{name}"'
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
    @action(detail=True, methods=["get"], url_path=r"files/(?P<path>[\s\S]+)")
    def files(self, request: Request, pk: str | None = None, path: str = "") -> HttpResponseBase:
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
            return storage_fault(str(exc))
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
