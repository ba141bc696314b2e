"""The one upload door of the API: a multipart file handed to a publishing service, and the
service's refusals turned into the documented answers (400 problems, 403, 413 quota)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from rest_framework import status
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from registry.bundles.services.publish import PublishError, QuotaExceeded
from registry.permissions import NotAllowed

if TYPE_CHECKING:
    from rest_framework.request import Request

T = TypeVar("T")


def publish_field(
    request: Request, field: str, what: str, publish: Callable[..., T]
) -> T | Response:
    """``publish(upload, published_by=user)`` on the multipart ``field``, or the refusal."""
    upload = request.FILES.get(field)
    if upload is None:
        return Response(
            {"problems": [f"send {what} as the multipart field '{field}'"]},
            status=status.HTTP_400_BAD_REQUEST,
        )
    try:
        return publish(upload, published_by=request.user)
    except NotAllowed as exc:
        raise PermissionDenied(str(exc)) from None
    except QuotaExceeded as exc:
        return Response({"problems": exc.problems}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    except PublishError as exc:
        return Response({"problems": exc.problems}, status=status.HTTP_400_BAD_REQUEST)
