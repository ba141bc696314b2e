"""Routes of API v1, spelled out: a trailing slash is optional, and file paths keep their
dots (a router's format suffixes would read ``meta.yaml`` as a request for YAML)."""

from __future__ import annotations

from django.urls import re_path

from registry.api.clusters import ClusterDetailView, ClusterListView
from registry.api.estimate import estimate
from registry.api.jobs import JobViewSet
from registry.api.profiles import RoutingProfileViewSet
from registry.api.quality import (
    ConservationView,
    CoverageRequestsView,
    CoverageView,
    StabilityView,
)
from registry.api.views import ApiRootView, LookupDocumentation
from registry.bundles.api.views import BundleViewSet
from registry.lookup.http import lookup

app_name = "registry-api"

# The schema generator (drf-spectacular) documents the lookup's URL through the view it names.
lookup.cls = LookupDocumentation  # type: ignore[attr-defined]
lookup.initkwargs = {}  # type: ignore[attr-defined]

urlpatterns = [
    re_path(r"^$", ApiRootView.as_view(), name="api-root"),
    re_path(
        r"^bundles/?$",
        BundleViewSet.as_view({"get": "list", "post": "create"}),
        name="bundle-list",
    ),
    re_path(
        r"^bundles/(?P<pk>[0-9]+)/?$",
        BundleViewSet.as_view({"get": "retrieve"}),
        name="bundle-detail",
    ),
    re_path(
        r"^bundles/(?P<pk>[0-9]+)/download/?$",
        BundleViewSet.as_view({"get": "download"}),
        name="bundle-download",
    ),
    re_path(
        r"^bundles/(?P<pk>[0-9]+)/export/(?P<fmt>[a-z]+)/?$",
        BundleViewSet.as_view({"get": "export"}),
        name="bundle-export",
    ),
    re_path(
        # Any character, newlines included: a path that names no file is the view's JSON 404,
        # never the URL resolver's HTML one (the schema documents JSON).
        r"^bundles/(?P<pk>[0-9]+)/files/(?P<path>[\s\S]+)$",
        BundleViewSet.as_view({"get": "files"}),
        name="bundle-files",
    ),
    re_path(
        r"^routing-profiles/?$",
        RoutingProfileViewSet.as_view({"get": "list", "post": "create"}),
        name="routing-profile-list",
    ),
    re_path(
        r"^routing-profiles/(?P<pk>[0-9]+)/?$",
        RoutingProfileViewSet.as_view({"get": "retrieve", "delete": "destroy"}),
        name="routing-profile-detail",
    ),
    re_path(
        r"^routing-profiles/(?P<pk>[0-9]+)/download/?$",
        RoutingProfileViewSet.as_view({"get": "download"}),
        name="routing-profile-download",
    ),
    re_path(r"^lookup/?$", lookup, name="lookup"),
    re_path(r"^estimate/?$", estimate, name="estimate"),
    re_path(r"^clusters/?$", ClusterListView.as_view(), name="cluster-list"),
    re_path(
        # The estimate's own rule for a cluster name (registry.services.estimate._NAME).
        r"^clusters/(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,99})/?$",
        ClusterDetailView.as_view(),
        name="cluster-detail",
    ),
    re_path(
        r"^tables/(?P<pk>[0-9]+)/stability/?$", StabilityView.as_view(), name="table-stability"
    ),
    re_path(
        r"^tables/(?P<pk>[0-9]+)/conservation/?$",
        ConservationView.as_view(),
        name="table-conservation",
    ),
    re_path(r"^coverage/?$", CoverageView.as_view(), name="coverage"),
    re_path(r"^coverage/requests/?$", CoverageRequestsView.as_view(), name="coverage-requests"),
    re_path(r"^jobs/?$", JobViewSet.as_view({"get": "list", "post": "create"}), name="job-list"),
    re_path(r"^jobs/(?P<pk>[0-9]+)/?$", JobViewSet.as_view({"get": "retrieve"}), name="job-detail"),
    re_path(
        r"^jobs/(?P<pk>[0-9]+)/cancel/?$", JobViewSet.as_view({"post": "cancel"}), name="job-cancel"
    ),
    re_path(
        r"^jobs/(?P<pk>[0-9]+)/retry/?$", JobViewSet.as_view({"post": "retry"}), name="job-retry"
    ),
    re_path(
        r"^jobs/(?P<pk>[0-9]+)/artifacts/(?P<name>[^/]+)$",
        JobViewSet.as_view({"get": "artifact"}),
        name="job-artifact",
    ),
]
