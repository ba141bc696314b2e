"""API v1: the shipped cluster descriptions, read-only (GET /api/v1/clusters/[<name>/]).

The names listed here are what the estimate's ``cluster`` field takes (POST /api/v1/estimate,
the dashboard's estimate page); the files are ``clusters/<name>.yaml`` (docs/cluster-format.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.services.clusters import (
    ClusterFault,
    cluster_detail,
    cluster_names,
    cluster_summaries,
)

if TYPE_CHECKING:
    from rest_framework.request import Request

__all__ = ["ClusterDetailView", "ClusterListView"]


class ClusterGroupSerializer(serializers.Serializer[Any]):
    link = serializers.CharField(help_text="the link class these ranks share")
    ranks = serializers.ListField(child=serializers.IntegerField(min_value=0))


class ClusterSummarySerializer(serializers.Serializer[Any]):
    name = serializers.CharField(help_text="the estimate's `cluster` value")
    url = serializers.URLField()
    version = serializers.IntegerField(allow_null=True, help_text="format version, 1 or 2")
    description = serializers.CharField(allow_blank=True)
    provenance = serializers.DictField(
        child=serializers.CharField(), help_text="hardware, software, command, measured_at"
    )
    ranks = serializers.ListField(
        child=serializers.IntegerField(min_value=0), help_text="every EP rank the groups hold"
    )
    link_classes = serializers.ListField(child=serializers.CharField())
    groups = ClusterGroupSerializer(many=True)
    sha256 = serializers.CharField(allow_null=True, help_text="of the file's bytes")
    error = serializers.CharField(
        allow_null=True,
        help_text="why the file does not validate (null when it does); the estimate refuses "
        "a cluster with an error",
    )


class ClusterListSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField()
    results = ClusterSummarySerializer(many=True)


class ClusterDetailSerializer(ClusterSummarySerializer):
    document = serializers.DictField(
        help_text="the whole validated description (schema moe-cluster), as the file holds it"
    )


class ClusterErrorSerializer(serializers.Serializer[Any]):
    error = serializers.ChoiceField(choices=["not_found", "invalid_cluster"])
    message = serializers.CharField()


def _url(request: Request, name: str) -> str:
    return request.build_absolute_uri(reverse("registry-api:cluster-detail", args=[name]))


@extend_schema(tags=["clusters"])
class ClusterListView(APIView):
    """The shipped cluster descriptions."""

    permission_classes = (AllowAny,)

    @extend_schema(
        operation_id="v1_clusters_list",
        summary="Cluster descriptions",
        description="Every `clusters/<name>.yaml` the registry ships: the names the estimate's "
        "`cluster` field accepts, each with its ranks, link classes and provenance.",
        responses={200: ClusterListSerializer},
    )
    def get(self, request: Request) -> Response:
        results = [{**c, "url": _url(request, c["name"])} for c in cluster_summaries()]
        return Response({"count": len(results), "results": results})


@extend_schema(tags=["clusters"])
class ClusterDetailView(APIView):
    """One shipped cluster description."""

    permission_classes = (AllowAny,)

    @extend_schema(
        operation_id="v1_clusters_retrieve",
        summary="One cluster description",
        responses={
            200: ClusterDetailSerializer,
            404: OpenApiResponse(ClusterErrorSerializer, description="no cluster of this name"),
            503: OpenApiResponse(
                ClusterErrorSerializer, description="the shipped file does not validate"
            ),
        },
    )
    def get(self, request: Request, name: str) -> Response:
        try:
            found = cluster_detail(name)
        except ClusterFault as exc:
            return Response(
                {"error": "invalid_cluster", "message": str(exc)},
                status=status.HTTP_503_SERVICE_UNAVAILABLE,
            )
        if found is None:
            return Response(
                {
                    "error": "not_found",
                    "message": f"no cluster named {name!r}; known are {cluster_names()}",
                },
                status=status.HTTP_404_NOT_FOUND,
            )
        return Response({**found, "url": _url(request, name)})
