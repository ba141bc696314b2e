"""Filters of the bundle list. Table filters (tp, dp, ep, backend, kernel) must hold for one
table. ``backend`` is the execution path (adapter: vllm-modular, vllm-live, torch-reference),
``kernel`` the kernel backend vLLM resolved (TRITON, ...): two names, two filters."""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.db.models import Exists, OuterRef, Q, QuerySet

from registry.bundles.models import Bundle, DeploymentTable
from registry.choices import BundleLayout, BundleSource

__all__ = ["BundleFilterSet"]

TABLE_FIELDS = ("tp", "dp", "ep", "rank", "sequence_parallel", "backend", "kernel", "native")


def _noop(queryset: QuerySet[Any], name: str, value: Any) -> QuerySet[Any]:
    return queryset  # applied together in BundleFilterSet.filter_queryset


# The same no-op, typed per filter: drf-spectacular documents a method filter by the type of
# its method's ``value`` (Any gave the parameters no type at all).
def _noop_int(queryset: QuerySet[Any], name: str, value: int) -> QuerySet[Any]:
    return _noop(queryset, name, value)


def _noop_bool(queryset: QuerySet[Any], name: str, value: bool) -> QuerySet[Any]:
    return _noop(queryset, name, value)


def _noop_str(queryset: QuerySet[Any], name: str, value: str) -> QuerySet[Any]:
    return _noop(queryset, name, value)


class _StrictBooleanField(forms.Field):
    """true/false or 1/0; anything else is an error (Django's NullBooleanSelect reads '1' as
    unknown and drops the filter, so ?native=1 matched every bundle)."""

    def to_python(self, value: Any) -> bool | None:
        if value in (None, ""):
            return None
        text = str(value).strip().lower()
        if text in ("true", "1"):
            return True
        if text in ("false", "0"):
            return False
        raise forms.ValidationError(f"{value!r} is not true or false (nor 1 or 0)")


class StrictBooleanFilter(django_filters.BooleanFilter):
    field_class = _StrictBooleanField


class WholeNumberFilter(django_filters.NumberFilter):
    """A degree or rank: a whole number (NumberFilter reads decimals, and dp=1.5 listed no
    bundle instead of saying the value is wrong)."""

    field_class = forms.IntegerField


class BundleFilterSet(django_filters.FilterSet):
    q = django_filters.CharFilter(
        method="search", label="Search hardware, model, variant, backend, kernel"
    )
    hardware = django_filters.CharFilter()
    model = django_filters.CharFilter()
    variant = django_filters.CharFilter()
    vllm_version = django_filters.CharFilter()
    sha256 = django_filters.CharFilter()
    layout = django_filters.ChoiceFilter(choices=BundleLayout.choices)
    source = django_filters.ChoiceFilter(choices=BundleSource.choices)
    tp = WholeNumberFilter(method=_noop_int, label="A table with this TP degree", min_value=1)
    dp = WholeNumberFilter(method=_noop_int, label="A table with this DP degree", min_value=1)
    ep = WholeNumberFilter(method=_noop_int, label="A table with this EP degree", min_value=1)
    rank = WholeNumberFilter(method=_noop_int, label="A table for this EP rank", min_value=0)
    sequence_parallel = StrictBooleanFilter(method=_noop_bool)
    backend = django_filters.CharFilter(
        method=_noop_str, label="A table measured by this execution path (adapter)"
    )
    kernel = django_filters.CharFilter(method=_noop_str, label="A table with this kernel backend")
    native = StrictBooleanFilter(method=_noop_bool, label="A table run by vLLM's own kernels")

    class Meta:
        model = Bundle
        fields = ("hardware", "model", "variant", "vllm_version", "sha256", "layout", "source")

    def search(self, queryset: QuerySet[Bundle], name: str, value: str) -> QuerySet[Bundle]:
        value = value.strip()
        if not value:
            return queryset
        tables = DeploymentTable.objects.filter(bundle=OuterRef("pk")).filter(
            Q(backend__icontains=value) | Q(kernel__icontains=value)
        )
        return queryset.filter(
            Q(hardware__icontains=value)
            | Q(model__icontains=value)
            | Q(variant__icontains=value)
            | Exists(tables)
        )

    def filter_queryset(self, queryset: QuerySet[Bundle]) -> QuerySet[Bundle]:
        queryset = super().filter_queryset(queryset)
        wanted = {
            key: self.form.cleaned_data[key]
            for key in TABLE_FIELDS
            if self.form.cleaned_data.get(key) not in (None, "")
        }
        if wanted:
            # One Exists over one table: tp=2&dp=4 means a table deployed at TP2 x DP4.
            tables = DeploymentTable.objects.filter(bundle=OuterRef("pk"), **wanted)
            queryset = queryset.filter(Exists(tables))
        return queryset
