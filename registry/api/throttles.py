"""Request rates configured by environment, read per request (issue 17, items 8 and 9).

DRF's throttles read their rates once, from ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` at
import; these read ``settings.REGISTRY[<key>]`` on every request, so a deployment's
environment (and a test's settings) is what counts. A rate is ``N/second|minute|hour|day``;
unset or empty turns the throttle off.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle

__all__ = ["JobThrottle", "LookupThrottle", "SettingRateThrottle", "UploadThrottle"]


class SettingRateThrottle(SimpleRateThrottle):
    """Per user (or client address) rate from ``settings.REGISTRY[setting]``."""

    setting = ""

    def __init__(self) -> None:  # SimpleRateThrottle would read the rate at import-time settings
        pass

    def allow_request(self, request: Any, view: Any) -> bool:
        self.rate = settings.REGISTRY.get(self.setting)
        if not self.rate:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request: Any, view: Any) -> str:
        user = getattr(request, "user", None)
        ident = user.pk if user is not None and user.is_authenticated else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


class LookupThrottle(SettingRateThrottle):
    """POST /api/v1/lookup; env ``REGISTRY_LOOKUP_THROTTLE`` (e.g. ``200/second``)."""

    scope = "lookup"
    setting = "LOOKUP_THROTTLE"


class UploadThrottle(SettingRateThrottle):
    """POST /api/v1/bundles/; env ``REGISTRY_UPLOAD_THROTTLE`` (e.g. ``60/hour``)."""

    scope = "upload"
    setting = "UPLOAD_THROTTLE"

    def allow_request(self, request: Any, view: Any) -> bool:
        return request.method != "POST" or super().allow_request(request, view)


class JobThrottle(SettingRateThrottle):
    """POST /api/v1/jobs/ (queue, cancel, retry); env ``REGISTRY_JOB_THROTTLE``."""

    scope = "jobs"
    setting = "JOB_THROTTLE"

    def allow_request(self, request: Any, view: Any) -> bool:
        return request.method != "POST" or super().allow_request(request, view)
