"""Jobs pages: queue an acquisition (signed-in users), follow it live, cancel it.

Everything that decides anything is `registry.jobs` (docs/jobs.md): validation is the CLI's own
through `queue_job`, so the form refuses exactly what the API refuses, field by field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from registry.jobs import (
    AcquisitionJob,
    BrokerUnavailable,
    JobParameterError,
    JobStateError,
    job_parameter_fields,
)
from registry.permissions import NotAllowed, can_cancel_job, can_retry_job, can_view_job_details
from registry.services.authorized import cancel_job_as, queue_job_as, retry_job_as
from registry.services.requests import waiting_for_worker

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse


def _form_fields(data: Any, errors: dict[str, list[str]]) -> list[dict[str, Any]]:
    fields = []
    for f in job_parameter_fields():
        default = f["default"]
        shown = ",".join(str(v) for v in default) if isinstance(default, list) else default
        value = data.get(f["name"]) if data is not None else None
        fields.append(
            {
                **f,
                "value": value if value is not None else ("" if shown is None else str(shown)),
                "errors": errors.get(f["name"], []),
            }
        )
    return fields


def _params(data: Any) -> dict[str, str]:
    """Form strings as queue_job takes them; an empty box means the parameter's default."""
    names = {f["name"] for f in job_parameter_fields()}
    return {k: v.strip() for k, v in data.items() if k in names and v.strip()}


def job_list(request: HttpRequest) -> HttpResponse:
    jobs = AcquisitionJob.objects.select_related("result_bundle", "created_by").order_by("-id")[
        :100
    ]
    return render(request, "frontend/jobs.html", {"jobs": jobs})


@login_required
def job_new(request: HttpRequest) -> HttpResponse:
    errors: dict[str, list[str]] = {}
    status = 200
    if request.method == "POST":
        try:
            job = queue_job_as(request.user, _params(request.POST))
        except NotAllowed as exc:
            return HttpResponseForbidden(str(exc))
        except JobParameterError as exc:
            errors, status = exc.errors, 400
        except BrokerUnavailable as exc:
            errors, status = {"__all__": [f"the job queue does not answer: {exc}"]}, 503
        else:
            return redirect("frontend:job", pk=job.pk)
    fields = _form_fields(request.POST if request.method == "POST" else None, errors)
    return render(
        request,
        "frontend/job_new.html",
        {"fields": fields, "form_errors": errors.get("__all__", [])},
        status=status,
    )


def _job_context(request: HttpRequest, job: AcquisitionJob) -> dict[str, Any]:
    """The job and what this visitor may see and do with it (registry.permissions)."""
    details = can_view_job_details(request.user, job)
    try:
        command = job.command_line
    except (KeyError, TypeError):  # parameters of a row not made by queue_job
        command = ""
    if not details and job.work_dir:
        command = command.replace(job.work_dir, "<work_dir>")
    return {
        "job": job,
        "command_line": command,
        "can_cancel": can_cancel_job(request.user, job),
        "can_retry": job.state in ("failed", "cancelled") and can_retry_job(request.user, job),
        "can_view_details": details,
        "waiting": waiting_for_worker(job),
    }


def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(AcquisitionJob.objects.select_related("result_bundle"), pk=pk)
    return render(request, "frontend/job.html", _job_context(request, job))


def job_progress(request: HttpRequest, pk: int) -> HttpResponse:
    """The live part of a job page (an htmx fragment, polled while the job is active)."""
    job = get_object_or_404(AcquisitionJob.objects.select_related("result_bundle"), pk=pk)
    return render(request, "frontend/_job_progress.html", _job_context(request, job))


@require_POST
@login_required
def job_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(AcquisitionJob, pk=pk)
    try:
        cancel_job_as(request.user, job)
    except NotAllowed as exc:
        return HttpResponseForbidden(str(exc))
    except JobStateError as exc:
        messages.error(request, str(exc))
    return redirect("frontend:job", pk=pk)


@require_POST
@login_required
def job_retry(request: HttpRequest, pk: int) -> HttpResponse:
    """Queue a failed or cancelled job again, as ``POST /api/v1/jobs/{id}/retry`` does."""
    job = get_object_or_404(AcquisitionJob, pk=pk)
    try:
        retry_job_as(request.user, job)
    except NotAllowed as exc:
        return HttpResponseForbidden(str(exc))
    except JobStateError as exc:
        messages.error(request, str(exc))
    except BrokerUnavailable as exc:
        messages.error(request, f"the job queue does not answer: {exc}")
    return redirect("frontend:job", pk=pk)
