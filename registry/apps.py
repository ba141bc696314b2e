from __future__ import annotations

from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Bundle registry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connects the sign-in throttle's failure counter (user_login_failed).
        # and the hashing of new API tokens (pre_save/post_save of authtoken's Token).
        from registry import signin, tokens  # noqa: F401
