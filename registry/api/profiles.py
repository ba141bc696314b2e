"""Routing profiles over REST: list, details, upload (token), download, delete (owner or staff).

``GET /api/v1/routing-profiles/``, ``POST`` (multipart field ``profile``: a ``.routing.npz``),
``GET /api/v1/routing-profiles/{id}/``, ``GET .../{id}/download`` (ETag: the file's sha256),
``DELETE .../{id}/``. An estimate names a published profile by id (``"profile": 3``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.http import FileResponse, HttpResponse
from django.http.response import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import NotAuthenticated, PermissionDenied
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response

from registry.api.faults import storage_fault
from registry.api.throttles import UploadThrottle
from registry.api.uploads import publish_field
from registry.permissions import NotAllowed
from registry.profile_models import RoutingProfileRecord
from registry.services.profiles import delete_profile, publish_profile
from registry.storage import blob_name, bundle_storage, hash_blob
from registry.tokens import HashedTokenAuthentication

if TYPE_CHECKING:
    from rest_framework.request import Request

__all__ = ["RoutingProfileViewSet"]


class RoutingProfileSerializer(serializers.ModelSerializer[RoutingProfileRecord]):
    published_by = serializers.SerializerMethodField()
    download = serializers.SerializerMethodField()

    class Meta:
        model = RoutingProfileRecord
        fields = (
            "id",
            "sha256",
            "size",
            "model",
            "router",
            "source",
            "global_experts",
            "top_k",
            "layers",
            "steps",
            "tokens",
            "captured_at",
            "filename",
            "published_by",
            "published_at",
            "download",
            "summary",
        )

    def get_published_by(self, obj: RoutingProfileRecord) -> str | None:
        user = obj.published_by
        return None if user is None else str(user.get_username())

    def get_download(self, obj: RoutingProfileRecord) -> str:
        request = self.context.get("request")
        path = f"/api/v1/routing-profiles/{obj.pk}/download"
        return request.build_absolute_uri(path) if request is not None else path


class ProfileUploadSerializer(serializers.Serializer[Any]):
    profile = serializers.FileField(help_text="a routing profile file (.routing.npz)")


@extend_schema(tags=["routing profiles"])
class RoutingProfileViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[RoutingProfileRecord]
):
    """Published routing profiles: what real routers chose, per layer and step."""

    queryset = RoutingProfileRecord.objects.select_related("published_by")
    serializer_class = RoutingProfileSerializer
    authentication_classes = (HashedTokenAuthentication,)
    parser_classes = (MultiPartParser, FormParser)
    throttle_classes = (UploadThrottle,)
    lookup_value_regex = r"[0-9]+"

    @extend_schema(
        request={"multipart/form-data": ProfileUploadSerializer},
        responses={
            201: OpenApiResponse(RoutingProfileSerializer, description="a new profile"),
            200: OpenApiResponse(RoutingProfileSerializer, description="identical bytes exist"),
            400: OpenApiResponse(description="every problem found, each naming its field"),
            401: OpenApiResponse(description="no token, or a wrong one"),
            413: OpenApiResponse(description="over the publisher's quota"),
        },
    )
    def create(self, request: Request) -> Response:
        """Upload a routing profile, validated in full (schema, checksums, counts) first."""
        if not request.user or not request.user.is_authenticated:
            raise NotAuthenticated("uploading a routing profile needs a token")
        result = publish_field(request, "profile", "the profile file", publish_profile)
        if isinstance(result, Response):
            return result
        body = dict(self.get_serializer(result.record).data)
        body["created"] = result.created
        return Response(
            body, status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK
        )

    @extend_schema(responses={204: None, 401: None, 403: None, 404: None})
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        """Delete a profile: its publisher or staff."""
        record = self.get_object()
        if not request.user or not request.user.is_authenticated:
            raise NotAuthenticated("deleting a routing profile needs a token")
        try:
            delete_profile(request.user, record)
        except NotAllowed as exc:
            raise PermissionDenied(str(exc)) from None
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        responses={
            (200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY),
            304: OpenApiResponse(description="If-None-Match matched the file's sha256"),
            404: OpenApiResponse(description="no such profile"),
            503: OpenApiResponse(
                description="the stored file is missing or damaged (JSON `storage_fault`)"
            ),
        },
    )
    def download(self, request: Request, pk: str | None = None) -> HttpResponseBase:
        """The profile file byte for byte as published; ETag is its sha256."""
        record = self.get_object()
        etag = f'"{record.sha256}"'
        if etag in [t.strip() for t in request.headers.get("If-None-Match", "").split(",")]:
            unchanged = HttpResponse(status=status.HTTP_304_NOT_MODIFIED)
            unchanged["ETag"] = etag
            return unchanged
        storage = bundle_storage()
        name = blob_name(record.sha256)
        # Hashed before the first byte goes out, as bundle downloads are served from verified
        # checkouts: an immutable, ETag-named answer must never carry drifted bytes.
        stored = hash_blob(storage, record.sha256)
        if stored is None:
            return storage_fault(
                f"routing profile {record.pk}: its file is missing from storage; "
                "run manage.py verify_bundles"
            )
        if stored != (record.size, record.sha256):
            return storage_fault(
                f"routing profile {record.pk}: the stored file no longer matches its sha256; "
                "run manage.py verify_bundles"
            )
        response = FileResponse(
            storage.open(name, "rb"),
            content_type="application/octet-stream",
            as_attachment=True,
            filename=f"routing-profile-{record.pk}.routing.npz",
        )
        response["ETag"] = etag
        response["X-Content-Type-Options"] = "nosniff"
        response["Cache-Control"] = "public, max-age=31536000, immutable"
        return response
