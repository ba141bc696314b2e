"""Dashboard pages: thin views over registry queries and frontend.figures / frontend.pages."""

from __future__ import annotations

from functools import wraps
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from frontend import pages
from registry.bundles.models import Bundle, DeploymentTable
from registry.bundles.services.checkout import BlobDriftError
from registry.filtersets import BundleFilterSet

if TYPE_CHECKING:
    from collections.abc import Callable

    from django.http import HttpRequest

LIST_FIELDS = (
    "id",
    "hardware",
    "model",
    "variant",
    "layout",
    "vllm_version",
    "published_at",
    "sha256",
    "size",
    "targets",
    "source",
)


def home(request: HttpRequest) -> HttpResponse:
    """Bundles with filters and search, and recent acquisition jobs."""
    filterset = BundleFilterSet(request.GET or None, queryset=Bundle.objects.only(*LIST_FIELDS))
    choices = pages.filter_choices()
    values = {key: request.GET.get(key, "") for key in pages.FILTER_KEYS}
    # A filter the filterset cannot read would otherwise be dropped from the query: the page
    # showed every bundle under "tp=two". Such a request lists nothing and says why (400, as
    # GET /api/v1/bundles/ answers it).
    errors = dict(filterset.errors) if filterset.is_bound else {}
    invalid, unknown = pages.filter_problems(errors, values, choices)
    if invalid:
        bundles: list[Bundle] = []
    elif filterset.is_bound:
        bundles = list(filterset.qs[:200])
    else:
        bundles = list(filterset.queryset[:200])
    context = {
        "filterset": filterset,
        "bundles": bundles,
        "total": Bundle.objects.count(),
        "choices": choices,
        "values": values,
        "invalid": invalid,
        "unknown": unknown,
        "jobs": pages.recent_jobs(),
    }
    return render(request, "frontend/home.html", context, status=400 if invalid else 200)


def bundle_detail(request: HttpRequest, pk: int) -> HttpResponse:
    bundle = get_object_or_404(Bundle, pk=pk)
    tables = list(bundle.tables.all())
    return render(
        request,
        "frontend/bundle.html",
        {"bundle": bundle, "tables": tables, "summary": pages.bundle_summary(bundle, tables)},
    )


def _storage_safe(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A page that reads a bundle's files answers 503 naming the damaged file, never 500
    (issue 17, item 6)."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except BlobDriftError as exc:
            return HttpResponse(
                f"A stored file of this bundle is missing or damaged: {exc}",
                status=503,
                content_type="text/plain; charset=utf-8",
            )

    return wrapped


@_storage_safe
def table_detail(request: HttpRequest, pk: int) -> HttpResponse:
    table = get_object_or_404(DeploymentTable.objects.select_related("bundle"), pk=pk)
    context = pages.table_context(table, request.GET.get("m"), request.GET.get("mode"))
    return render(request, "frontend/table.html", context)


@_storage_safe
def table_lookup(request: HttpRequest, pk: int) -> HttpResponse:
    """The lookup playground's answer (an htmx fragment)."""
    table = get_object_or_404(DeploymentTable.objects.select_related("bundle"), pk=pk)
    context = pages.lookup_answer(table, request.GET)
    # htmx swaps the answer in; the load fields come back out of band, marked where refused.
    context["htmx"] = request.headers.get("HX-Request") == "true"
    context["values"] = {k: request.GET.get(k, "") for k in ("loads", "tile_cost_us")}
    return render(request, "frontend/_lookup.html", context, status=context.get("status", 200))


@_storage_safe
def compare(request: HttpRequest) -> HttpResponse:
    context = pages.compare_context(
        request.GET.get("a"), request.GET.get("b"), request.GET.getlist("also")
    )
    return render(request, "frontend/compare.html", context)


def coverage(request: HttpRequest) -> HttpResponse:
    """Hardware x model x variant x backend against every deployment: tables and gaps."""
    from registry.coverage_models import CoverageRequest
    from registry.services.coverage import coverage_matrix

    requests = CoverageRequest.objects.select_related("requested_by", "job").prefetch_related(
        "requesters"
    )[:100]
    return render(
        request, "frontend/coverage.html", {"matrix": coverage_matrix(), "requests": requests}
    )


@require_POST
@login_required
def coverage_request(request: HttpRequest) -> HttpResponse:
    """Ask for a gap of the coverage matrix (queued at once when a worker is online)."""
    from registry.jobs import BrokerUnavailable, JobParameterError
    from registry.permissions import NotAllowed
    from registry.services.requests import request_cell

    data = request.POST
    try:
        cell = {
            "hardware": data["hardware"],
            "model": data["model"],
            "variant": data["variant"],
            "backend": data["backend"],
            "tp": int(data["tp"]),
            "dp": int(data["dp"]),
            "rank": int(data["rank"]),
            "sequence_parallel": data["sequence_parallel"] == "1",
        }
        made, _ = request_cell(request.user, cell)
    except (KeyError, ValueError, NotAllowed) as exc:
        messages.error(request, f"cannot request this cell: {exc}")
    except JobParameterError as exc:
        messages.error(request, f"the acquisition would refuse this cell: {exc}")
    except BrokerUnavailable as exc:
        messages.error(request, f"the job queue does not answer: {exc}")
    else:
        if made.job_id:
            messages.success(request, f"Queued as job #{made.job_id}.")
        else:
            messages.success(
                request,
                f"Recorded request #{made.pk}: no worker for {cell['hardware']} is online, so "
                "it stays open until a job fills it.",
            )
    return redirect("frontend:coverage")
