"""API v1: a table's quality evidence (stability, conservation) and the coverage matrix."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import AllowAny, IsAuthenticatedOrReadOnly
from rest_framework.response import Response
from rest_framework.views import APIView

from moetables.errors import BundleError
from registry.bundles.models import DeploymentTable
from registry.services.coverage import coverage_matrix
from registry.services.quality import conservation_payload, stability_payload
from registry.tokens import HashedTokenAuthentication

if TYPE_CHECKING:
    from rest_framework.request import Request

__all__ = ["ConservationView", "CoverageRequestsView", "CoverageView", "StabilityView"]


class QualitySerializer(serializers.Serializer[Any]):
    label = serializers.ChoiceField(choices=["method", "exploratory"])  # type: ignore[assignment]
    tolerance = serializers.FloatField()
    max_relative_change = serializers.FloatField(allow_null=True)
    max_change_text = serializers.CharField(allow_null=True, help_text="as a percentage")


class StabilityPointSerializer(serializers.Serializer[Any]):
    component = serializers.CharField()
    tokens = serializers.IntegerField(help_text="N")
    activated_experts = serializers.IntegerField(help_text="A")
    local_assignments = serializers.IntegerField(help_text="M")
    attempt = serializers.IntegerField(help_text="0 first; a retried point has several")
    b_sets = serializers.IntegerField(allow_null=True, help_text="weight sets of the B arm")
    b_median_us = serializers.FloatField(allow_null=True, help_text="B arm median")
    b_pooled_us = serializers.FloatField(allow_null=True)
    b2_sets = serializers.IntegerField(allow_null=True)
    b2_median_us = serializers.FloatField(allow_null=True, help_text="2B arm median")
    b2_pooled_us = serializers.FloatField(allow_null=True)
    relative_change = serializers.FloatField(help_text="|2B - B| / B of the pooled medians")
    tolerance = serializers.FloatField()
    passed = serializers.BooleanField()
    published = serializers.BooleanField(help_text="this attempt's 2B median is the table's time")


class StabilitySummarySerializer(serializers.Serializer[Any]):
    published_points = serializers.IntegerField()
    controls = serializers.IntegerField()
    failed_controls = serializers.IntegerField()
    retried_points = serializers.IntegerField()
    max_relative_change = serializers.FloatField(allow_null=True)


class StabilitySerializer(serializers.Serializer[Any]):
    table = serializers.IntegerField()
    source = serializers.CharField(  # type: ignore[assignment]
        help_text="files: stability.csv (format 2); coverage.json: the historical layout's "
        "controls; none: the bundle publishes no per-point evidence",
    )
    absent = serializers.CharField(allow_null=True, help_text="why there are no points")
    quality = QualitySerializer()
    summary = StabilitySummarySerializer()
    points = StabilityPointSerializer(many=True)


class ForwardSerializer(serializers.Serializer[Any]):
    forward = serializers.IntegerField()
    tokens = serializers.IntegerField()
    native_total_us = serializers.FloatField(help_text="the forward's whole CUDA activity")
    outside_scopes_us = serializers.FloatField(help_text="activity no component scope owned")
    components_us = serializers.DictField(child=serializers.FloatField())
    attributed_us = serializers.FloatField()


class ConservationSerializer(serializers.Serializer[Any]):
    table = serializers.IntegerField()
    source = serializers.CharField()  # type: ignore[assignment]
    absent = serializers.CharField(allow_null=True, help_text="why no forward was traced")
    supplement = serializers.DictField(
        allow_null=True,
        help_text="null when the forwards were traced in the table's own build; otherwise they "
        "were traced later, separately (python -m acquisition conserve), and this says when "
        "(measured_at, beside table_measured_at), how (command_line) and on what (device_name, "
        "uuid, torch_version, cuda_version, vllm_version)",
    )
    forwards = ForwardSerializer(many=True)


def _table(pk: str) -> DeploymentTable:
    return get_object_or_404(DeploymentTable.objects.select_related("bundle"), pk=pk)


def _corrupt(exc: BundleError) -> Response:
    return Response({"error": "corrupt_bundle", "message": str(exc)}, status=409)


class StabilityView(APIView):
    """Per-point B/2B stability of one table."""

    permission_classes = (AllowAny,)

    @extend_schema(
        summary="Per-point stability of a table",
        description="For every published expert point: the B and 2B bank medians, the relative "
        "change against the tolerance, every attempt (failed and retried ones marked). Older "
        "bundles say why the points are absent.",
        responses={
            200: StabilitySerializer,
            404: OpenApiResponse(description="no such table"),
            409: OpenApiResponse(description="the stored evidence is corrupt"),
        },
    )
    def get(self, request: Request, pk: str) -> Response:
        try:
            return Response(stability_payload(_table(pk)))
        except BundleError as exc:
            return _corrupt(exc)


class ConservationView(APIView):
    """Per traced native forward: the components' sums against the whole."""

    permission_classes = (AllowAny,)

    @extend_schema(
        summary="Conservation of a table's traced native forwards",
        description="For every traced native forward: each component's sum, what fell outside "
        "the scopes and the forward's whole CUDA activity. A backend that traced none says why.",
        responses={
            200: ConservationSerializer,
            404: OpenApiResponse(description="no such table"),
            409: OpenApiResponse(description="the stored evidence is corrupt"),
        },
    )
    def get(self, request: Request, pk: str) -> Response:
        try:
            return Response(conservation_payload(_table(pk)))
        except BundleError as exc:
            return _corrupt(exc)


class CoverageCellSerializer(serializers.Serializer[Any]):
    deployment = serializers.CharField()
    tp = serializers.IntegerField()
    dp = serializers.IntegerField()
    ep = serializers.IntegerField()
    rank = serializers.IntegerField()
    sp = serializers.IntegerField(help_text="sequence parallel: 0 or 1")
    table = serializers.IntegerField(allow_null=True, help_text="null: a gap")
    url = serializers.CharField(allow_null=True)
    points = serializers.IntegerField(allow_null=True)
    measured_at = serializers.DateTimeField(allow_null=True)
    quality = QualitySerializer(allow_null=True)
    request = serializers.DictField(allow_null=True, help_text="the open request for a gap")
    not_measurable = serializers.CharField(
        allow_null=True,
        help_text="a gap its backend cannot measure: 'not measurable by <backend>: <reason>' "
        "(no request is accepted); null for a requestable gap or a table",
    )
    reason = serializers.IntegerField(
        allow_null=True,
        help_text="for a gap its backend cannot measure: its reason's number (from 1) in the "
        "row's reasons; null otherwise",
    )


class CoverageRowSerializer(serializers.Serializer[Any]):
    hardware = serializers.CharField()
    model = serializers.CharField()
    variant = serializers.CharField()
    backend = serializers.CharField()
    reasons = serializers.ListField(
        child=serializers.CharField(),
        help_text="the distinct reasons this row's gaps cannot be measured, without the "
        "deployment each cell names; cells refer to them by number",
    )
    cells = CoverageCellSerializer(many=True)


class CoverageSerializer(serializers.Serializer[Any]):
    deployments = serializers.ListField(child=serializers.DictField())
    rows = CoverageRowSerializer(many=True)
    gaps = serializers.IntegerField()


class CoverageView(APIView):
    """Hardware x model x variant x backend rows, one column per deployment rank."""

    permission_classes = (AllowAny,)

    @extend_schema(
        summary="Coverage matrix",
        description="Rows: hardware x model x variant x backend; columns: every deployment "
        "(TP, DP, EP, rank, sequence parallel) any bundle covers. A cell is the latest table with "
        "its point count, measurement date and quality, or a gap (table null) with any open "
        "request for it.",
        responses={200: CoverageSerializer},
    )
    def get(self, request: Request) -> Response:
        return Response(coverage_matrix())


class CoverageRequestBodySerializer(serializers.Serializer[Any]):
    hardware = serializers.CharField(max_length=128)
    model = serializers.CharField(max_length=256)
    variant = serializers.CharField(max_length=128)
    backend = serializers.CharField(max_length=128, help_text="the matrix row's backend")
    tp = serializers.IntegerField(min_value=1)
    dp = serializers.IntegerField(min_value=1)
    rank = serializers.IntegerField(min_value=0)
    sequence_parallel = serializers.BooleanField(default=False)


class CoverageRequestSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    state = serializers.ChoiceField(choices=["open", "queued", "closed"])
    hardware = serializers.CharField()
    model = serializers.CharField()
    variant = serializers.CharField()
    backend = serializers.CharField()
    deployment = serializers.CharField()
    requested_by = serializers.CharField(allow_null=True)
    requesters = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    closed_at = serializers.DateTimeField(allow_null=True)
    job = serializers.IntegerField(allow_null=True)


def _request_body(made: Any) -> dict[str, Any]:
    return {
        "id": made.pk,
        "state": made.state,
        "hardware": made.hardware,
        "model": made.model,
        "variant": made.variant,
        "backend": made.backend,
        "deployment": made.deployment,
        "requested_by": made.requested_by.get_username() if made.requested_by else None,
        "requesters": made.requesters.count(),
        "created_at": made.created_at,
        "closed_at": made.closed_at,
        "job": made.job_id,
    }


class CoverageRequestsView(APIView):
    """Requests for gaps of the coverage matrix: list them, or ask for one (token)."""

    authentication_classes = (HashedTokenAuthentication, SessionAuthentication)
    permission_classes = (IsAuthenticatedOrReadOnly,)

    @extend_schema(
        summary="Coverage requests", responses={200: CoverageRequestSerializer(many=True)}
    )
    def get(self, request: Request) -> Response:
        from registry.coverage_models import CoverageRequest

        found = CoverageRequest.objects.select_related("requested_by").prefetch_related(
            "requesters"
        )[:500]
        return Response([_request_body(r) for r in found])

    @extend_schema(
        summary="Request a gap of the coverage matrix",
        description="Queues an acquisition job at once when a worker of the hardware's queue is "
        "online, else records an open request; a second ask for the same cell joins the open "
        "request (200). 400 when the cell already has a table, when its backend cannot measure "
        'it (`{"error": "not_measurable", "message": "not measurable by <backend>: <reason>"}`, '
        "the matrix cell's `not_measurable`) or the acquisition would refuse it, 503 when the "
        "broker does not answer.",
        request=CoverageRequestBodySerializer,
        responses={
            201: CoverageRequestSerializer,
            200: CoverageRequestSerializer,
            400: OpenApiResponse(description="{field: [message]} or {problems: [...]}"),
        },
    )
    def post(self, request: Request) -> Response:
        from registry.jobs import BrokerUnavailable, JobParameterError
        from registry.permissions import NotAllowed
        from registry.services.requests import NotMeasurable, request_cell

        body = CoverageRequestBodySerializer(data=request.data)
        if not body.is_valid():
            return Response(body.errors, status=400)
        try:
            made, created = request_cell(request.user, dict(body.validated_data))
        except JobParameterError as exc:
            return Response(exc.errors, status=400)
        except NotAllowed as exc:
            return Response({"error": "forbidden", "message": str(exc)}, status=403)
        except NotMeasurable as exc:
            return Response(
                {"error": "not_measurable", "message": str(exc), "problems": [str(exc)]}, status=400
            )
        except ValueError as exc:
            return Response({"problems": [str(exc)]}, status=400)
        except BrokerUnavailable as exc:
            return Response({"error": "broker_unavailable", "message": str(exc)}, status=503)
        return Response(_request_body(made), status=201 if created else 200)
