"""Who may do what, decided here once for the API, the dashboard and the admin (issue 17, item 2).

Plain functions of (user, object): the views ask them and never decide by themselves, so a
rule cannot hold on one door and not on another (the web cancel once let anyone cancel any
job while the API refused). Every function answers False for an anonymous or inactive user
unless reading is public.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from registry.bundles.models import Bundle
    from registry.jobs.models import AcquisitionJob
    from registry.profile_models import RoutingProfileRecord

__all__ = [
    "NotAllowed",
    "can_cancel_job",
    "can_delete_bundle",
    "can_delete_routing_profile",
    "can_grant_namespace",
    "can_publish_under",
    "can_queue_job",
    "can_retry_job",
    "can_upload",
    "can_view_job_details",
    "is_staff",
]


class NotAllowed(PermissionError):
    """The user may not do this; the message says what is needed (HTTP 403)."""


def _active(user: Any) -> bool:
    return bool(
        user is not None
        and getattr(user, "is_authenticated", False)
        and getattr(user, "is_active", False)
    )


def is_staff(user: Any) -> bool:
    return _active(user) and bool(user.is_staff)


def _owns_job(user: Any, job: AcquisitionJob) -> bool:
    return _active(user) and job.created_by_id is not None and job.created_by_id == user.pk


def can_queue_job(user: Any) -> bool:
    """Any signed-in (or token) user may queue an acquisition."""
    return _active(user)


def can_cancel_job(user: Any, job: AcquisitionJob) -> bool:
    """The job's creator or staff."""
    return is_staff(user) or _owns_job(user, job)


def can_retry_job(user: Any, job: AcquisitionJob) -> bool:
    """The job's creator or staff."""
    return is_staff(user) or _owns_job(user, job)


def can_view_job_details(user: Any, job: AcquisitionJob) -> bool:
    """Server-side details (the work folder on the worker host, the exact command with its
    paths): the creator and staff. Everyone sees a job's state, progress, log and result."""
    return is_staff(user) or _owns_job(user, job)


def can_upload(user: Any) -> bool:
    """Any active user with a token; where, is `can_publish_under`'s question."""
    return _active(user)


def can_delete_routing_profile(user: Any, profile: RoutingProfileRecord) -> bool:
    """Its publisher or staff: a profile is an input to estimates, not a measurement others
    build tables on, so its owner may withdraw it."""
    return is_staff(user) or (
        _active(user) and profile.published_by_id is not None and profile.published_by_id == user.pk
    )


def can_delete_bundle(user: Any, bundle: Bundle | None = None) -> bool:
    """Only staff: a published bundle is immutable and others may depend on its id and hash."""
    return is_staff(user)


def can_grant_namespace(user: Any) -> bool:
    return is_staff(user)


def can_publish_under(user: Any, hardware: str, model: str) -> bool:
    """Whether ``user`` may publish a bundle named ``hardware``/``model`` (issue 17, item 7).

    Staff always; otherwise the namespace's owner and its grantees, or anyone while nobody
    has published under it yet (the first publisher then owns it). ``user`` None stands for
    the server itself (``manage.py import_bundle``), which may publish anywhere.
    """
    from registry.namespaces import Namespace

    if user is None or is_staff(user):
        return True
    if not _active(user):
        return False
    namespace = Namespace.objects.filter(hardware=hardware, model=model).first()
    if namespace is None:
        return True
    if namespace.owner_id == user.pk:
        return True
    return namespace.grants.filter(user_id=user.pk).exists()
