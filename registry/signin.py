"""Sign-in throttling for every password door: the dashboard, the admin, DRF sessions
(issue 17, item 9: 30 wrong passwords, then the right one worked).

An authentication backend in front of Django's own: once a (client address, user name) pair
has failed ``REGISTRY["SIGNIN_THROTTLE"]`` times (e.g. ``5/minute``) within the period, every
attempt of that pair is refused, the right password included, until the period has passed.
Failures are counted from Django's ``user_login_failed`` signal, in the cache (Redis in
production, so every web worker counts the same).
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.signals import user_login_failed
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver
from rest_framework.throttling import SimpleRateThrottle

__all__ = ["ThrottledModelBackend", "signin_rate"]


def signin_rate() -> tuple[int, int] | None:
    """(attempts, seconds) of REGISTRY["SIGNIN_THROTTLE"], or None when off."""
    rate = settings.REGISTRY.get("SIGNIN_THROTTLE")
    if not rate:
        return None
    count, seconds = SimpleRateThrottle.parse_rate(None, rate)  # type: ignore[arg-type]
    assert count is not None and seconds is not None
    return count, seconds


def _key(request: Any, username: Any) -> str:
    address = request.META.get("REMOTE_ADDR", "") if request is not None else ""
    name = str(username or "").strip().lower()
    digest = hashlib.sha256(f"{address}\0{name}".encode("utf-8", "replace")).hexdigest()
    return f"signin-failures:{digest}"


class ThrottledModelBackend(ModelBackend):
    """Django's ModelBackend, refusing a throttled (address, user name) before the password."""

    def authenticate(
        self, request: Any, username: Any = None, password: Any = None, **kwargs: Any
    ) -> Any:
        rate = signin_rate()
        if username is None:
            username = kwargs.get(self._username_field())
        if rate is not None and cache.get(_key(request, username), 0) >= rate[0]:
            # PermissionDenied stops Django trying the other backends: no user.
            raise PermissionDenied("too many failed sign-ins; try again later")
        return super().authenticate(request, username=username, password=password, **kwargs)

    @staticmethod
    def _username_field() -> str:
        from django.contrib.auth import get_user_model

        return str(get_user_model().USERNAME_FIELD)


@receiver(user_login_failed)
def _count_failure(
    sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any
) -> None:
    rate = signin_rate()
    if rate is None:
        return
    key = _key(request, credentials.get("username"))
    if cache.add(key, 1, timeout=rate[1]):
        return
    try:
        cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.add(key, 1, timeout=rate[1])
