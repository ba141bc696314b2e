from __future__ import annotations

from django.urls import path

from frontend import estimate, jobs, profiles, views

app_name = "frontend"

urlpatterns = [
    path("", views.home, name="home"),
    path("bundles/<int:pk>/", views.bundle_detail, name="bundle"),
    path("bundles/<int:pk>/estimate", estimate.estimate_page, name="estimate"),
    path("tables/<int:pk>/", views.table_detail, name="table"),
    path("tables/<int:pk>/lookup", views.table_lookup, name="table-lookup"),
    path("compare/", views.compare, name="compare"),
    path("jobs/", jobs.job_list, name="jobs"),
    path("jobs/new", jobs.job_new, name="job-new"),
    path("jobs/<int:pk>/", jobs.job_detail, name="job"),
    path("jobs/<int:pk>/progress", jobs.job_progress, name="job-progress"),
    path("jobs/<int:pk>/cancel", jobs.job_cancel, name="job-cancel"),
    path("jobs/<int:pk>/retry", jobs.job_retry, name="job-retry"),
    path("coverage/", views.coverage, name="coverage"),
    path("routing-profiles/", profiles.profile_list, name="routing-profiles"),
    path("routing-profiles/<int:pk>/", profiles.profile_detail, name="routing-profile"),
    path("coverage/request", views.coverage_request, name="coverage-request"),
]
