"""API shapes shared by the doors: problems, and the lookup request and answer (the bundle
shapes are in registry/bundles/api/serializers.py)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from registry.bundles.api.serializers import TargetSerializer

__all__ = [
    "LookupErrorSerializer",
    "LookupRequestSerializer",
    "LookupResponseSerializer",
    "ProblemsSerializer",
]


class ProblemsSerializer(serializers.Serializer[Any]):
    problems = serializers.ListField(child=serializers.CharField())


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "example": "power_law(1.2)"},
            {"type": "array", "items": {"type": "integer", "minimum": 0}},
        ],
        "description": "experts only (issue 18): 'balanced' (the table's answer, the default), "
        "'uniform', 'power_law(alpha)' (expected tiles with every active expert holding 1 to N "
        "pairs) or per-expert counts (A of them nonzero, adding up to M, none above N, at most "
        "the rank's local experts); any but balanced is charged at tile_cost_us, else at the "
        "table's own recorded cost for vLLM's block at N (bundle formats 3-5), else refused; "
        "a historical table answers balanced only (the answer is out_of_support)",
    }
)
class LoadsField(serializers.JSONField):
    """A load description: a string or a list of per-expert counts (documentation only)."""


class QuerySerializer(serializers.Serializer[Any]):
    """One query, as ``python -m moetables lookup`` reads it (documentation only)."""

    component = serializers.CharField(help_text="gate_routing, experts, finalize_copy, wrapper")
    mode = serializers.CharField(default="eager")
    tokens = serializers.IntegerField()
    activated_experts = serializers.IntegerField(required=False)
    local_assignments = serializers.IntegerField(required=False)
    loads = LoadsField(required=False)
    tile_cost_us = serializers.FloatField(
        required=False,
        min_value=0,
        max_value=1e6,
        help_text="us per row tile beyond the table's balanced ones (issue 18), charged where "
        "vLLM's block is at least the table's tile block (128 rows without a tile model); "
        "needs loads",
    )


class LookupRequestSerializer(serializers.Serializer[Any]):
    """Which bundle (id or sha256, or the best of hardware + model + variant for the target:
    covering it, vLLM's own kernels before reference ones, newest vLLM, newest measurement of
    the table), optional pins, the target and the queries. Unknown keys are refused (400).

    Documentation only: `moetables.lookup.queries.parse_request` checks requests, and
    each query is checked by moetables, so a bad query gets its own ``invalid`` answer
    instead of failing the batch.
    """

    bundle = serializers.CharField(required=False, help_text="a bundle id or sha256")
    sha256 = serializers.RegexField(r"^[0-9a-f]{64}$", required=False)
    hardware = serializers.CharField(required=False, max_length=128)
    model = serializers.CharField(required=False, max_length=256)
    variant = serializers.CharField(required=False, max_length=128)
    backend = serializers.CharField(
        required=False, help_text="pin: execution path (vllm-modular, ...) or kernel (TRITON)"
    )
    vllm_version = serializers.CharField(required=False, help_text="pin: e.g. 0.26.0")
    target = TargetSerializer()
    queries = QuerySerializer(many=True, required=False)
    include_exploratory = serializers.BooleanField(
        required=False,
        default=False,
        help_text="a lookup by hardware + model + variant skips exploratory bundles (B/2B "
        "tolerance above 3 %) unless this is true",
    )


class AnswerSerializer(serializers.Serializer[Any]):
    time_us = serializers.FloatField(required=False)
    error = serializers.ChoiceField(choices=["out_of_support", "invalid"], required=False)
    message = serializers.CharField(required=False)


class BundleRefSerializer(serializers.Serializer[Any]):
    """The bundle and table that answered (also in the X-Bundle-* response headers)."""

    id = serializers.IntegerField()
    sha256 = serializers.CharField()
    backend = serializers.CharField(help_text="execution path (adapter)")
    kernel = serializers.CharField(help_text="native kernel backend")
    native = serializers.BooleanField(help_text="vLLM's own kernels ran")
    vllm_version = serializers.CharField()


class LookupResponseSerializer(serializers.Serializer[Any]):
    bundle = BundleRefSerializer()
    target = TargetSerializer()
    answers = AnswerSerializer(many=True)


class LookupErrorSerializer(serializers.Serializer[Any]):
    error = serializers.CharField()
    message = serializers.CharField()
