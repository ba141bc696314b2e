"""The one answer for a stored file that is missing or damaged, for every download door."""

from __future__ import annotations

import orjson
from django.http import HttpResponse
from rest_framework import status

__all__ = ["storage_fault"]


def storage_fault(message: str) -> HttpResponse:
    """A clear 503 naming the file, never a 500, a cut connection or the damaged bytes."""
    response = HttpResponse(
        orjson.dumps({"error": "storage_fault", "message": message}),
        status=status.HTTP_503_SERVICE_UNAVAILABLE,
        content_type="application/json",
    )
    response["Retry-After"] = "300"
    return response
