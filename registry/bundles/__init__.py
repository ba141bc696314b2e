"""Bundles: the published bundle and its deployment tables (models), the plain functions that
publish, describe, check out, export and verify them (services), and their REST API (api).
Laid out like the jobs wing (registry/jobs/), one package per feature.
"""
