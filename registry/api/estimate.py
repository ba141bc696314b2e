"""POST /api/v1/estimate: the MoE layer estimate of `python -m moetables estimate`, over REST.

The request goes through the lookup's door (`registry.lookup.http`: body reading, token,
throttle, JSON out). The serializers here document the request and answer for OpenAPI only; requests are checked
by `moetables.estimate_query` (one definition for the CLI and REST), so the two can never
disagree about what a well-formed estimate is.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.views import APIView

from moetables.lookup import RequestError
from moetables.routing import POLICIES
from registry.lookup.http import TOO_DEEP, answerer_headers, door, json_response, read_body
from registry.services.estimate import run_estimate

__all__ = ["EstimateDocumentation", "estimate"]


class EstimateRequestSerializer(serializers.Serializer[Any]):
    """Which bundle (as for a lookup), the deployment, one step or many, routing and links."""

    bundle = serializers.IntegerField(required=False, min_value=1)
    sha256 = serializers.RegexField(r"^[0-9a-f]{64}$", required=False)
    hardware = serializers.CharField(required=False)
    model = serializers.CharField(required=False)
    variant = serializers.CharField(required=False)
    backend = serializers.CharField(
        required=False,
        help_text="pin, as for a lookup: execution path (vllm-modular, ...) or kernel (TRITON); "
        "also in the query string",
    )
    vllm_version = serializers.CharField(
        required=False, help_text="pin: e.g. 0.26.0; also in the query string"
    )
    include_exploratory = serializers.BooleanField(
        required=False,
        default=False,
        help_text="a choice by hardware + model + variant skips exploratory bundles unless true",
    )
    tp = serializers.IntegerField(min_value=1)
    dp = serializers.IntegerField(min_value=1)
    sequence_parallel = serializers.BooleanField(default=False)
    tokens = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        required=False,
        help_text="one step: the padded token count of every DP rank (answer: one object)",
    )
    steps = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField(min_value=1)),
        required=False,
        help_text="many steps (answer: `answers`, one per step)",
    )
    policy = serializers.ChoiceField(choices=list(POLICIES), default="balanced")
    expert_counts = serializers.JSONField(
        required=False,
        help_text="histogram: the step's global per-expert pair counts (a list per step "
        "with `steps`)",
    )
    active_curve = serializers.JSONField(required=False, help_text="custom: [[N, A], ...]")
    load_shares = serializers.ListField(child=serializers.FloatField(), required=False)
    seed = serializers.IntegerField(min_value=0, default=0, help_text="random, captured policies")
    first_step = serializers.IntegerField(
        min_value=0,
        default=0,
        help_text="random, captured: step i of this request draws from the stream "
        "(seed, first_step + i), so a run asked in chunks gets the draws of one request",
    )
    profile = serializers.JSONField(
        required=False,
        help_text="captured: a published routing profile's id, or a profile inline "
        "({meta, step_tokens, counts})",
    )
    layer = serializers.IntegerField(
        min_value=0, required=False, help_text="captured: the profile's layer (default: all)"
    )
    profile_draw = serializers.ChoiceField(
        choices=["sample", "expectation"],
        default="sample",
        help_text="captured: a seeded draw at N, or the mean per-rank (A, M)",
    )
    mode = serializers.ChoiceField(choices=["eager", "graph"], default="eager")
    capture_sizes = serializers.ListField(
        child=serializers.IntegerField(min_value=1), required=False
    )
    events = serializers.BooleanField(
        default=True, help_text="include the per-rank trace events; false for smaller answers"
    )
    rank_expert_counts = serializers.BooleanField(
        default=False,
        help_text="add each rank's pairs per local expert (`expert_range`, `expert_counts`); "
        "histogram, round_robin and random policies only",
    )
    tile_cost_us = serializers.JSONField(
        required=False,
        help_text="issue 18: the charge for the expert-kernel row tiles the step's per-expert "
        'counts run beyond the table\'s balanced tiles: "auto" (the default, also for null: '
        "each rank's table's own tile model where the policy gives per-expert counts and every "
        'rank\'s table records one, else nothing, with a note), "table" (that model; refused '
        'for a rank without), "none" (the balanced-load answer), or microseconds per tile '
        "(a number >= 0; counting policies; docs/estimate.md)",
    )
    cluster = serializers.JSONField(
        required=False,
        help_text="a shipped cluster's name (clusters/<name>.yaml) or an inline moe-cluster "
        "description; without one, collectives carry bytes but no time and layer_us is null",
    )


class RankSerializer(serializers.Serializer[Any]):
    rank = serializers.IntegerField()
    dp_rank = serializers.IntegerField()
    tp_rank = serializers.IntegerField()
    tokens = serializers.IntegerField()
    local_rows = serializers.IntegerField()
    N = serializers.IntegerField()
    A = serializers.IntegerField()
    M = serializers.IntegerField()
    components = serializers.DictField(child=serializers.FloatField())
    compute_us = serializers.FloatField()
    wait_us = serializers.FloatField()
    transfer_us = serializers.FloatField(allow_null=True)
    end_us = serializers.FloatField()
    expert_range = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        help_text="with rank_expert_counts: the rank's global experts [start, stop)",
    )
    expert_counts = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        help_text="with rank_expert_counts: the rank's pairs per local expert",
    )


class CollectiveSerializer(serializers.Serializer[Any]):
    op = serializers.CharField()
    tensor = serializers.CharField()
    scope = serializers.CharField()
    ranks = serializers.ListField(child=serializers.IntegerField())
    bytes = serializers.IntegerField(help_text="nccl-tests size S")
    bytes_by_rank = serializers.ListField(child=serializers.IntegerField())
    equal_counts = serializers.BooleanField()
    vllm_call = serializers.CharField()
    kernels = serializers.ListField(child=serializers.CharField())
    launch = serializers.CharField(
        help_text="collectives sharing a launch run as one NCCL kernel (one latency); "
        "empty when launched alone",
    )
    start_us = serializers.FloatField()
    transfer_us = serializers.FloatField(allow_null=True)
    wait_us = serializers.FloatField()
    wait_by_rank = serializers.ListField(child=serializers.FloatField())


class EventSerializer(serializers.Serializer[Any]):
    rank = serializers.IntegerField()
    name = serializers.CharField()
    kind = serializers.CharField()
    start_us = serializers.FloatField()
    end_us = serializers.FloatField()
    wait_us = serializers.FloatField()
    transfer_us = serializers.FloatField(allow_null=True)
    bytes = serializers.IntegerField(allow_null=True)


class EstimateAnswerSerializer(serializers.Serializer[Any]):
    bundle = serializers.DictField()
    deployment = serializers.DictField()
    policy = serializers.CharField()
    mode = serializers.CharField()
    table_mode = serializers.CharField()
    tokens = serializers.ListField(child=serializers.IntegerField())
    padded_tokens = serializers.ListField(child=serializers.IntegerField())
    cluster = serializers.CharField(allow_null=True)
    ranks = RankSerializer(many=True)
    collectives = CollectiveSerializer(many=True)
    events = EventSerializer(many=True, required=False)
    layer_us = serializers.FloatField(allow_null=True)
    layer_compute_us = serializers.FloatField()
    critical_rank = serializers.IntegerField()
    notes = serializers.ListField(child=serializers.CharField())


class EstimateStepsAnswerSerializer(serializers.Serializer[Any]):
    bundle = serializers.DictField()
    answers = serializers.ListField(
        child=serializers.DictField(),
        help_text="one per step of `steps`: an answer as for `tokens` (without `bundle`), or "
        "`{error, message}`",
    )


class EstimateErrorSerializer(serializers.Serializer[Any]):
    error = serializers.CharField()
    message = serializers.CharField(required=False)
    problems = serializers.ListField(child=serializers.CharField(), required=False)


class EstimateDocumentation(APIView):
    """The time of one MoE layer in one step (or many): per rank rows, N, A, M, component
    times, compute, wait and transfer; the collectives with their bytes and NCCL kernels.

    The URL is served by ``estimate`` below (the one door, with the lookup's body reading,
    token, throttle and error statuses); drf-spectacular reads this class to describe it.
    """

    permission_classes = (AllowAny,)

    @extend_schema(
        operation_id="estimate",
        # The door reads application/json only (any other type is a 400).
        request={"application/json": EstimateRequestSerializer},
        responses={
            200: OpenApiResponse(
                PolymorphicProxySerializer(
                    component_name="EstimateResult",
                    serializers=[EstimateAnswerSerializer, EstimateStepsAnswerSerializer],
                    resource_type_field_name=None,
                ),
                description="one step (`tokens`): the estimate; many (`steps`): `answers`",
            ),
            400: OpenApiResponse(EstimateErrorSerializer, description="malformed request"),
            404: OpenApiResponse(EstimateErrorSerializer, description="no such bundle"),
            409: OpenApiResponse(EstimateErrorSerializer, description="stored bundle is corrupt"),
            422: OpenApiResponse(
                EstimateErrorSerializer,
                description="a rank's table is missing, or the step is outside measured "
                "support (the message names rank and component)",
            ),
        },
    )
    def post(self, request: Request) -> HttpResponse:
        """The estimate; the body's ``bundle`` and the X-Bundle-* headers say which bundle
        answered."""
        # Never routed here (the URL maps to the door itself); a caller that reaches this
        # class anyway gets the door's answer.
        return estimate(request._request)


@csrf_exempt
def estimate(request: HttpRequest) -> HttpResponse:
    """POST /api/v1/estimate through the lookup's door (`registry.lookup.http`): one reading
    of the body, one token and throttle check, JSON out by orjson."""
    refused = door(request, "Estimate")
    if refused is not None:
        return refused
    try:
        # Pins in the query string, as the lookup takes them (the same merge and refusals).
        pins = request.GET if request.META.get("QUERY_STRING") else None
        http_status, body = run_estimate(read_body(request), pins)
    except RequestError as exc:
        return json_response({"error": "invalid", "problems": exc.problems}, 400)
    except RecursionError:  # the repr of a value nested ~1,000 deep in a message
        return json_response({"error": "invalid", "problems": [TOO_DEEP]}, 400)
    bundle = body.get("bundle")
    headers = answerer_headers(bundle) if isinstance(bundle, dict) else None
    return json_response(body, http_status, headers)


estimate.one_door = True  # type: ignore[attr-defined]  # LookupMiddleware places it early
# The schema generator (drf-spectacular) documents the URL through the view it names.
estimate.cls = EstimateDocumentation  # type: ignore[attr-defined]
estimate.initkwargs = {}  # type: ignore[attr-defined]
