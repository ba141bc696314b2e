"""Acquisition jobs over REST: queue (token), follow, cancel, retry. Thin: each action is one
call into `registry.jobs.services`; the worker does the rest."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from django.http import FileResponse, Http404
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import IsAuthenticated, IsAuthenticatedOrReadOnly
from rest_framework.response import Response

from registry.api.throttles import JobThrottle
from registry.jobs.models import AcquisitionJob
from registry.jobs.parameters import JobParameterError, JobParametersSerializer
from registry.jobs.services import BrokerUnavailable, JobStateError
from registry.permissions import NotAllowed, can_view_job_details
from registry.services.authorized import cancel_job_as, queue_job_as, retry_job_as

if TYPE_CHECKING:
    from django.db.models import QuerySet
    from rest_framework.request import Request

__all__ = ["AcquisitionJobSerializer", "JobParametersSerializer", "JobViewSet"]


class AcquisitionJobSerializer(serializers.ModelSerializer[AcquisitionJob]):
    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True
    )
    result_bundle = serializers.SerializerMethodField()
    progress = serializers.FloatField(source="progress_fraction", read_only=True, allow_null=True)
    command_line = serializers.SerializerMethodField()
    work_dir = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()
    waiting_for_worker = serializers.SerializerMethodField(
        help_text="for a queued job whose queue has no online worker: says so, else null"
    )

    class Meta:
        model = AcquisitionJob
        fields = (
            "id",
            "url",
            "state",
            "phase",
            "points_done",
            "points_total",
            "progress",
            "eta_seconds",
            "log_tail",
            "error",
            "parameters",
            "queue",
            "result_bundle",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
            "updated_at",
            "attempts",
            "cancel_requested",
            "worker",
            "work_dir",
            "artifacts",
            "command_line",
            "waiting_for_worker",
        )
        read_only_fields = fields

    def _absolute(self, path: str) -> str:
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request is not None else path

    def _details_shown(self, job: AcquisitionJob) -> bool:
        request = self.context.get("request")
        return can_view_job_details(getattr(request, "user", None), job)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_work_dir(self, job: AcquisitionJob) -> str | None:
        """The job's folder on the worker host: its creator and staff only (issue 17, item 9)."""
        return job.work_dir if self._details_shown(job) else None

    @extend_schema_field(OpenApiTypes.STR)
    def get_command_line(self, job: AcquisitionJob) -> str:
        try:
            shown = job.command_line
        except (KeyError, TypeError):  # parameters of a row not made by queue_job
            return ""
        if self._details_shown(job) or not job.work_dir:
            return shown
        return shown.replace(job.work_dir, "<work_dir>")

    @extend_schema_field(OpenApiTypes.STR)
    def get_waiting_for_worker(self, job: AcquisitionJob) -> str | None:
        from registry.services.requests import waiting_for_worker

        return waiting_for_worker(job)

    @extend_schema_field(OpenApiTypes.URI)
    def get_url(self, job: AcquisitionJob) -> str:
        return self._absolute(reverse("registry-api:job-detail", args=[job.pk]))

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_result_bundle(self, job: AcquisitionJob) -> dict[str, Any] | None:
        bundle = job.result_bundle
        if bundle is None:
            return None
        return {
            "id": bundle.pk,
            "sha256": bundle.sha256,
            "hardware": bundle.hardware,
            "model": bundle.model,
            "variant": bundle.variant,
            "url": self._absolute(reverse("registry-api:bundle-detail", args=[bundle.pk])),
            "download": self._absolute(reverse("registry-api:bundle-download", args=[bundle.pk])),
        }


_UNAVAILABLE = inline_serializer(
    "BrokerUnavailable", {"error": serializers.CharField(), "message": serializers.CharField()}
)


def _unavailable(exc: BrokerUnavailable) -> Response:
    return Response(
        {"error": "broker_unavailable", "message": str(exc)},
        status=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": "30"},
    )


@extend_schema(tags=["jobs"])
class JobViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[AcquisitionJob]
):
    """Acquisition jobs: queue one (token), follow its progress, cancel or retry it."""

    serializer_class = AcquisitionJobSerializer
    permission_classes = (IsAuthenticatedOrReadOnly,)
    throttle_classes = (JobThrottle,)
    filterset_fields = ("state", "queue")
    ordering_fields = ("id", "created_at", "started_at", "finished_at")

    def get_queryset(self) -> QuerySet[AcquisitionJob]:
        return AcquisitionJob.objects.select_related("created_by", "result_bundle")

    @extend_schema(
        request=JobParametersSerializer,
        responses={
            201: AcquisitionJobSerializer,
            400: OpenApiResponse(OpenApiTypes.OBJECT, description="{field: [message]}"),
            503: OpenApiResponse(_UNAVAILABLE, description="the broker does not answer"),
        },
    )
    def create(self, request: Request) -> Response:
        # The service checks every field (and refuses unknown ones) the way the CLI does; the
        # serializer (derived from acquisition.options like the check) documents the body.
        data = request.data
        params = data.dict() if hasattr(data, "dict") else data
        try:
            job = queue_job_as(request.user, cast("Mapping[str, Any]", params))
        except NotAllowed as exc:
            raise PermissionDenied(str(exc)) from None
        except JobParameterError as exc:
            return Response(exc.errors, status=status.HTTP_400_BAD_REQUEST)
        except BrokerUnavailable as exc:
            return _unavailable(exc)
        # The job as this request left it (queued): a free worker may claim it the moment its
        # message is sent, so a re-read here would answer either state (GET shows the live one).
        body = self.get_serializer(job).data
        return Response(body, status=status.HTTP_201_CREATED, headers={"Location": body["url"]})

    @extend_schema(
        request=None, responses={200: AcquisitionJobSerializer, 409: OpenApiTypes.OBJECT}
    )
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        try:
            job = cancel_job_as(request.user, job)
        except NotAllowed as exc:
            raise PermissionDenied(str(exc)) from None
        except JobStateError as exc:
            return Response(
                {"error": "conflict", "message": str(exc)}, status=status.HTTP_409_CONFLICT
            )
        return Response(self.get_serializer(job).data)

    @extend_schema(
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, 404: OpenApiTypes.OBJECT}
    )
    @action(detail=True, methods=["get"], url_path=r"artifacts/(?P<name>[^/]+)")
    def artifact(self, request: Request, pk: str | None = None, name: str = "") -> FileResponse:
        """One of the job's listed artifacts (log, progress events, failure evidence)."""
        job = self.get_object()
        listed = next((a for a in job.artifacts if a.get("name") == name), None)
        work = Path(job.work_dir) if job.work_dir else None
        path = (work / listed["path"]).resolve() if listed and work else None
        # Only files the runner listed, and only inside the job's own work folder.
        if (
            path is None
            or work is None
            or not path.is_relative_to(work.resolve())
            or not path.is_file()
        ):
            raise Http404(f"job {job.pk} has no artifact {name!r}")
        return FileResponse(path.open("rb"), as_attachment=True, filename=path.name)

    @extend_schema(
        request=None,
        responses={200: AcquisitionJobSerializer, 409: OpenApiTypes.OBJECT, 503: _UNAVAILABLE},
    )
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated])
    def retry(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        try:
            job = retry_job_as(request.user, job)
        except NotAllowed as exc:
            raise PermissionDenied(str(exc)) from None
        except JobStateError as exc:
            return Response(
                {"error": "conflict", "message": str(exc)}, status=status.HTTP_409_CONFLICT
            )
        except BrokerUnavailable as exc:
            return _unavailable(exc)
        # As queued by the retry, not re-read: see create().
        return Response(self.get_serializer(job).data)
