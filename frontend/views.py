from __future__ import annotations

from typing import TYPE_CHECKING

from django.shortcuts import render

from registry.models import Bundle

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse


def landing(request: HttpRequest) -> HttpResponse:
    """What the registry holds, with the links a newcomer needs."""
    bundles = Bundle.objects.only(
        "id", "hardware", "model", "variant", "layout", "vllm_version", "published_at", "sha256"
    ).order_by("-published_at", "-id")[:50]
    return render(
        request,
        "frontend/landing.html",
        {"bundles": bundles, "total": Bundle.objects.count()},
    )
