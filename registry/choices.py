"""Closed vocabularies of the registry (netbox keeps them in choices.py too)."""

from __future__ import annotations

from django.db import models


class BundleLayout(models.TextChoices):
    CURRENT = "current", "current (per_tp[tp].moe_components in meta.yaml)"
    HISTORICAL = "historical", "historical standalone index (moe-components-v1)"


class BundleSource(models.TextChoices):
    UPLOAD = "upload", "uploaded over the API"
    IMPORT = "import", "imported from a path (manage.py import_bundle)"
    ACQUISITION = "acquisition", "published by an acquisition job"
