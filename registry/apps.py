from __future__ import annotations

from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Bundle registry"
    default_auto_field = "django.db.models.BigAutoField"
