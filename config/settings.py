"""Settings, all from the environment, with defaults that run on one machine with no servers.

Defaults: SQLite at ``var/db.sqlite3``, bundle files under ``var/blobs`` (content-addressed),
an embedded Celery broker on the filesystem under ``var/celery``, an in-process cache.
Production sets ``DATABASE_URL`` (PostgreSQL), ``CELERY_BROKER_URL`` and ``REDIS_URL`` (Redis),
``DJANGO_SECRET_KEY``, ``DJANGO_ALLOWED_HOSTS`` and ``DJANGO_DEBUG=0``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("REGISTRY_VAR_DIR", BASE_DIR / "var")).resolve()


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


def _list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEBUG = _flag("DJANGO_DEBUG", False)
# DJANGO_DEBUG=0 written out declares a production deployment (docs/registry.md,
# "Production settings"); left unset, this is a laptop or a test run.
PRODUCTION = os.environ.get("DJANGO_DEBUG", "").strip().lower() in {"0", "false", "no", "off"}
_DEVELOPMENT_KEY = "insecure-development-key-set-DJANGO_SECRET_KEY-in-production"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "") or _DEVELOPMENT_KEY
if PRODUCTION and (
    SECRET_KEY in (_DEVELOPMENT_KEY, "change-me-in-production") or len(SECRET_KEY) < 50
):
    # A production process never runs on a public default key (issue 17, item 9): sessions
    # and password-reset links signed with it could be forged by anyone.
    raise ImproperlyConfigured(
        "DJANGO_DEBUG=0 (production) needs DJANGO_SECRET_KEY: at least 50 random characters, "
        "e.g. python -c 'import secrets; print(secrets.token_urlsafe(50))'"
    )
ALLOWED_HOSTS = _list("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")
CSRF_TRUSTED_ORIGINS = _list("DJANGO_CSRF_TRUSTED_ORIGINS", "")

# Behind TLS (the default in production; DJANGO_HTTPS=0 for a plain-HTTP test stack): HTTPS
# only, HSTS, cookies never sent in clear, and the proxy's X-Forwarded-Proto trusted.
HTTPS = _flag("DJANGO_HTTPS", PRODUCTION)
SECURE_SSL_REDIRECT = HTTPS
SECURE_HSTS_SECONDS = _int("DJANGO_HSTS_SECONDS", 31_536_000) if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS and _flag("DJANGO_HSTS_PRELOAD", True)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HTTPS else None
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "registry",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # A strict Content-Security-Policy on every response, the lookup's included.
    "config.security.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # The lookup's one door, placed early (registry/lookup/http.py).
    "registry.lookup.http.LookupMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'db.sqlite3'}",
        conn_max_age=_int("DATABASE_CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # SQLite cannot create the folder of its file; a fresh checkout has no var/ yet.
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # WAL lets the web workers read while an import writes; the timeout waits out a writer.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
    }
    # Tests start real Celery workers, which must see the test database: a file, not memory
    # (one per test process, so that a killed run's leftover -wal file never meets a new one).
    DATABASES["default"]["TEST"] = {
        "NAME": str(Path(tempfile.gettempdir()) / f"moe-registry-test-{os.getpid()}.sqlite3")
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CACHES = {
    "default": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": os.environ["REDIS_URL"],
        }
        if os.environ.get("REDIS_URL")
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# Static files (the Swagger UI sidecar, the admin) are served from the apps too, so a
# checkout works before or without collectstatic. The run command collects them first (with
# gzip and brotli copies) and sets REGISTRY_COLLECTED_STATIC=1: then only the collected files
# are served, compressed for clients that accept it.
WHITENOISE_USE_FINDERS = os.environ.get("REGISTRY_COLLECTED_STATIC", "") != "1"
# Vendored libraries carry their version in the file name (plotly-4.1.1.min.js): a new version
# is a new URL, so browsers may keep them for good (max-age 10 years, immutable).
WHITENOISE_IMMUTABLE_FILE_TEST = r"/vendor/[^/]+-\d+\.\d+\.\d+(\.min)?\.(js|css)$"

# Bundle files live in the "bundles" storage under their sha256; swapping the backend for
# object storage later changes this entry only (warehouse-style storage behind an interface).
STORAGES = {
    "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": VAR_DIR / "media"},
    },
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
    "bundles": {
        "BACKEND": "registry.storage.ContentAddressedStorage",
        "OPTIONS": {"location": VAR_DIR / "blobs"},
    },
}

# Registry limits and working folders.
REGISTRY: dict[str, Any] = {
    # Checked-out bundle trees that lookups read (a cache rebuilt from the blobs).
    "CHECKOUT_DIR": VAR_DIR / "checkouts",
    # Where uploads are unpacked and validated before anything is stored.
    "STAGING_DIR": VAR_DIR / "staging",
    "MAX_ARCHIVE_BYTES": _int("REGISTRY_MAX_ARCHIVE_BYTES", 256 * 1024 * 1024),
    "MAX_UNPACKED_BYTES": _int("REGISTRY_MAX_UNPACKED_BYTES", 1024 * 1024 * 1024),
    "MAX_FILES": _int("REGISTRY_MAX_FILES", 10_000),
    # Bytes of bundles one account may have published over HTTP (sum of their sizes; a bundle
    # already published by anyone costs nothing). 0: no quota. Staff are not counted.
    "USER_QUOTA_BYTES": _int("REGISTRY_USER_QUOTA_BYTES", 4 * 1024 * 1024 * 1024),
    "MAX_LOOKUP_QUERIES": _int("REGISTRY_MAX_LOOKUP_QUERIES", 100_000),
    "LOOKUP_CACHE_BUNDLES": _int("REGISTRY_LOOKUP_CACHE_BUNDLES", 32),
    # Acquisition jobs (docs/jobs.md): each job's work folder is JOBS_DIR/job-<id>.
    "JOBS_DIR": VAR_DIR / "jobs",
    # Folders whose model folders (config.json) a job may name besides the catalog ids.
    "JOB_MODEL_ROOTS": _list("REGISTRY_JOB_MODEL_ROOTS", ""),
    # The longest a job may run; the Redis visibility timeout is longer (see below).
    "JOB_TIME_LIMIT_S": _int("REGISTRY_JOB_TIME_LIMIT", 24 * 3600),
    # A running job not written by its worker for this long has lost its worker.
    "JOB_STALE_S": _int("REGISTRY_JOB_STALE_S", 120),
    # The orphan sweep (Celery beat, registry.jobs.sweep) runs this often; 0 schedules none.
    "JOB_SWEEP_S": _int("REGISTRY_JOB_SWEEP_S", 60),
    # A job that loses its worker after this many starts is failed, not sent again.
    "JOB_MAX_ATTEMPTS": _int("REGISTRY_JOB_MAX_ATTEMPTS", 3),
    # Request rates (N/second|minute|hour|day), per user or client address; empty: no limit.
    # Lookups are off by default (simulators call them per step); the rest are on.
    "LOOKUP_THROTTLE": os.environ.get("REGISTRY_LOOKUP_THROTTLE") or None,
    "UPLOAD_THROTTLE": os.environ.get("REGISTRY_UPLOAD_THROTTLE", "60/hour") or None,
    "JOB_THROTTLE": os.environ.get("REGISTRY_JOB_THROTTLE", "120/hour") or None,
    # Failed sign-ins per (client address, user name); past it, even the right password is
    # refused until the period has passed (registry/signin.py).
    "SIGNIN_THROTTLE": os.environ.get("REGISTRY_SIGNIN_THROTTLE", "5/minute") or None,
}

FILE_UPLOAD_TEMP_DIR = None
# Lookup batches of 100,000 queries are a few MB of JSON.
DATA_UPLOAD_MAX_MEMORY_SIZE = _int("DJANGO_DATA_UPLOAD_MAX_MEMORY_SIZE", 64 * 1024 * 1024)

# Every password check goes through the sign-in throttle (registry/signin.py).
AUTHENTICATION_BACKENDS = ["registry.signin.ThrottledModelBackend"]

# People sign in on the dashboard's own page (django.contrib.auth views) to queue jobs.
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Tokens are stored hashed (registry/tokens.py).
        "registry.tokens.HashedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticatedOrReadOnly"],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "registry.api.pagination.BundlePagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    # Rates live in REGISTRY (read per request by registry/api/throttles.py), not here.
    # Deeply nested JSON is a 400 on every path, never a RecursionError (issue 17, item 8).
    "DEFAULT_PARSER_CLASSES": [
        "registry.api.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "EXCEPTION_HANDLER": "registry.api.parsers.exception_handler",
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "MoE component timing registry",
    "DESCRIPTION": (
        "Published bundles of measured Mixture-of-Experts component timings: browse, download, "
        "upload, and exact lookups inside measured support."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI and ReDoc assets come from the sidecar package: no network needed.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # --isolate-targets and --moe-kernel-steps share one choice set: one enum, one name.
    "ENUM_NAME_OVERRIDES": {"AutoOnOffEnum": "acquisition.options.schema.AUTO_ON_OFF"},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "registry.api.schema.add_error_responses",
    ],
}

# Celery: an embedded filesystem broker by default (no server to run); Redis in production.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
CELERY_RESULT_BACKEND = os.environ.get(
    "CELERY_RESULT_BACKEND", f"file://{VAR_DIR / 'celery' / 'results'}"
)
CELERY_BROKER_TRANSPORT_OPTIONS = (
    {
        "data_folder_in": str(VAR_DIR / "celery" / "queue"),
        "data_folder_out": str(VAR_DIR / "celery" / "queue"),
        "processed_folder": str(VAR_DIR / "celery" / "processed"),
        # broadcast (pidbox) messages: kombu's default is ./control, inside the checkout
        "control_folder": str(VAR_DIR / "celery" / "control"),
        "store_processed": False,
    }
    if CELERY_BROKER_URL.startswith("filesystem://")
    # acks_late: an unacknowledged job message comes back after the visibility timeout, which
    # must outlast the longest job or a running job would be delivered to a second worker.
    else {"visibility_timeout": REGISTRY["JOB_TIME_LIMIT_S"] + 3600}
)
CELERY_TASK_ALWAYS_EAGER = _flag("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_TASK_DEFAULT_QUEUE = "default"
# Celery beat's record of the last runs (config/celery.py schedules the orphan sweep).
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celery" / "beat-schedule")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("DJANGO_LOG_LEVEL", "INFO")},
    "loggers": {"django.request": {"level": "ERROR"}},
}
