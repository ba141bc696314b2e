"""API v1: a table's quality evidence (stability, conservation) and the coverage matrix."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from moetables.errors import BundleError
from registry.models import DeploymentTable
from registry.services.coverage import coverage_matrix
from registry.services.quality import conservation_payload, stability_payload

if TYPE_CHECKING:
    from rest_framework.request import Request

__all__ = ["ConservationView", "CoverageView", "StabilityView"]


class QualitySerializer(serializers.Serializer[Any]):
    label = serializers.ChoiceField(choices=["method", "exploratory"])
    tolerance = serializers.FloatField()
    max_relative_change = serializers.FloatField(allow_null=True)


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
    source = serializers.CharField(
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
    source = serializers.CharField()
    absent = serializers.CharField(allow_null=True, help_text="why no forward was traced")
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


class CoverageRowSerializer(serializers.Serializer[Any]):
    hardware = serializers.CharField()
    model = serializers.CharField()
    variant = serializers.CharField()
    backend = serializers.CharField()
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
