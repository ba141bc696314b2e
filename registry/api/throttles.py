from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle


class LookupThrottle(SimpleRateThrottle):
    """Per user (or client address) rate of lookup requests; off unless a rate is configured.

    The rate is read per request from ``settings.REGISTRY["LOOKUP_THROTTLE"]`` (env
    ``REGISTRY_LOOKUP_THROTTLE``, e.g. ``200/second``), not frozen at import as DRF's are.
    """

    scope = "lookup"

    def __init__(self) -> None:  # SimpleRateThrottle would read the rate at import-time settings
        pass

    def allow_request(self, request: Any, view: Any) -> bool:
        self.rate = settings.REGISTRY.get("LOOKUP_THROTTLE")
        if not self.rate:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request: Any, view: Any) -> str:
        user = getattr(request, "user", None)
        ident = user.pk if user is not None and user.is_authenticated else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}
