"""POST /api/v1/lookup: the one door, from HTTP bytes to `registry.lookup.services` and back.

Every lookup request goes through ``lookup`` below, whatever it carries (a cookie, a token,
a throttle, a malformed body): one reading of the body, one check of the envelope
(`moetables.lookup.queries`), one mapping of typed errors to statuses:

    RequestError (malformed body, envelope or pins)   400 {"error": "invalid", "problems": [...]}
    NoSuchBundle                                       404 {"error": "not_found", "message"}
    NoCoverage (no bundle has a table for the target)  422 {"error": "no_coverage", "message"}
    CorruptBundle (stored files fail their checksums)  409 {"error": "corrupt_bundle", "message"}
    StorageFault (a stored blob is missing)            503 {"error": "storage_fault", "message"}
    a bad token                                        401; throttled: 429 with Retry-After

``LookupMiddleware`` only places the door early: it calls ``lookup`` for the lookup's path
before the session, CSRF, authentication and message middleware, which do nothing for it (the
lookup reads no session or user, and is CSRF-exempt; tokens are read here). That saves about
0.3 ms of a 0.4-0.7 ms request (docs/benchmarks.md), which is what keeps one query per
request above 1,000 requests/s on two cores. Security headers, host validation and
X-Frame-Options come from the middleware listed before it, as for any request.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, get_script_prefix, resolve, reverse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.exceptions import AuthenticationFailed

from moetables.lookup import RequestError
from registry.api.throttles import LookupThrottle
from registry.lookup.services import Answerer, LookupFailure, parse_lookup, run_lookup
from registry.tokens import HashedTokenAuthentication

__all__ = [
    "ANSWERER_HEADERS",
    "LookupMiddleware",
    "door",
    "json_response",
    "lookup",
    "read_body",
]

ALLOW = "POST, OPTIONS"
STATUSES = {"not_found": 404, "no_coverage": 422, "corrupt_bundle": 409, "storage_fault": 503}
# Who answered, in headers too, so that a simulator can record it without parsing the body.
ANSWERER_HEADERS = {
    "X-Bundle-Id": "id",
    "X-Bundle-Sha256": "sha256",
    "X-Bundle-Backend": "backend",
    "X-Bundle-Kernel": "kernel",
    "X-Bundle-Vllm-Version": "vllm_version",
}
# A run of 19 digits (every digit made "0", then searched: ten times faster than a regular
# expression): maybe an integer beyond int64, which orjson reads as a float and json as an
# int. A float with that many digits merely takes the json path too.
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_NUMBER = b"0" * 19
_JSON_TYPES = ("application/json",)
# As registry.api.parsers words it (not imported: this module loads with the middleware,
# before DRF's settings, which import that module).
TOO_DEEP = "the JSON body is nested too deeply (at most 1024 levels)"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_body(request: HttpRequest) -> Any:
    """The JSON body, read as Python's json reads it (orjson where both agree, which is
    nearly always and five times faster). RequestError says why a body is unreadable.

    orjson refuses what json refuses (NaN, Infinity, a BOM, invalid UTF-8) and also lone
    surrogates, 1e400 and nesting past 1,024 levels; those, and bodies that may hold integers
    beyond int64 (orjson reads them as floats), are read by json.
    """
    content_type = request.content_type or ""
    if content_type not in _JSON_TYPES and not content_type.endswith("+json"):
        raise RequestError([f"send the body as application/json, not {content_type!r}"])
    try:
        body = request.body
    except RequestDataTooBig:
        raise RequestError(
            [f"the body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes"]
        ) from None
    charset = (request.content_params or {}).get("charset", "utf-8").lower()
    if charset in ("utf-8", "utf8") and _LONG_NUMBER not in body.translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(body.decode(charset), parse_constant=_reject_constant)
    except (LookupError, UnicodeDecodeError) as exc:
        raise RequestError([f"the body cannot be decoded as {charset}: {exc}"]) from None
    except RecursionError:
        # json recurses out somewhat before orjson's 1,024 levels: what orjson reads stands
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise RequestError([TOO_DEEP]) from None
    except ValueError as exc:
        raise RequestError([f"the body is not valid JSON: {exc}"]) from None


def json_response(body: Any, status: int, headers: dict[str, str] | None = None) -> HttpResponse:
    """A door's answer: JSON written by orjson, with the methods it allows."""
    return HttpResponse(
        orjson.dumps(body),
        content_type="application/json",
        status=status,
        headers={"Allow": ALLOW, **headers} if headers else {"Allow": ALLOW},
    )


def _ascii(value: Any) -> str:
    return str(value).encode("ascii", "backslashreplace").decode("ascii").replace("\n", " ")


@functools.lru_cache(maxsize=256)  # a handful of bundles answer; their headers never change
def _answerer_headers(answerer: Answerer) -> dict[str, str]:
    fields = answerer.as_dict()
    return {header: _ascii(fields[key]) for header, key in ANSWERER_HEADERS.items()}


def _credentials(request: HttpRequest) -> HttpResponse | None:
    """Read a token (for per-user throttling) and apply the throttle; a response refuses."""
    user = None
    if "HTTP_AUTHORIZATION" in request.META:
        auth = HashedTokenAuthentication()
        try:
            found = auth.authenticate(request)  # type: ignore[arg-type]
        except AuthenticationFailed as exc:
            return json_response(
                {"detail": str(exc.detail)},
                401,
                {"WWW-Authenticate": auth.authenticate_header(request) or "Token"},  # type: ignore[arg-type]
            )
        user = found[0] if found else None
    if settings.REGISTRY.get("LOOKUP_THROTTLE"):
        request.user = user  # type: ignore[assignment]  # what the throttle counts by
        throttle = LookupThrottle()
        if not throttle.allow_request(request, None):
            wait = throttle.wait()
            seconds = max(1, int(wait or 0) + (1 if wait and wait % 1 else 0))
            return json_response(
                {"detail": f"Request was throttled. Expected available in {seconds} seconds."},
                429,
                {"Retry-After": str(seconds)},
            )
    return None


def door(request: HttpRequest, name: str) -> HttpResponse | None:
    """What every door checks before reading a body: OPTIONS, the method, a token, the
    throttle (the lookup's and the estimate's requests count against one rate). A response
    refuses (or answers OPTIONS); None lets the request in."""
    if request.method == "OPTIONS":
        return json_response(
            {"name": name, "renders": ["application/json"], "parses": ["application/json"]}, 200
        )
    if request.method != "POST":
        return json_response({"detail": f'Method "{request.method}" not allowed.'}, 405)
    if "HTTP_AUTHORIZATION" in request.META or settings.REGISTRY.get("LOOKUP_THROTTLE"):
        return _credentials(request)
    return None


def answerer_headers(bundle: dict[str, Any]) -> dict[str, str]:
    """The X-Bundle-* headers of an answer's ``bundle`` (who answered)."""
    return {
        header: _ascii(bundle[key]) for header, key in ANSWERER_HEADERS.items() if key in bundle
    }


@csrf_exempt
def lookup(request: HttpRequest) -> HttpResponse:
    """POST /api/v1/lookup: one answer per query (``{"time_us": t}`` or ``{"error": code,
    "message": why}``), from the bundle that ``registry.lookup.services.choose_bundle`` picks.
    """
    refused = door(request, "Lookup")
    if refused is not None:
        return refused
    try:
        pins = request.GET if request.META.get("QUERY_STRING") else None
        lookup_request = parse_lookup(read_body(request), pins)
        answerer, body = run_lookup(lookup_request)
    except RequestError as exc:
        return json_response({"error": "invalid", "problems": exc.problems}, 400)
    except LookupFailure as exc:
        headers = {"Retry-After": "300"} if exc.code == "storage_fault" else None
        return json_response(
            {"error": exc.code, "message": exc.message}, STATUSES[exc.code], headers
        )
    except RecursionError:  # the repr of a value nested ~1,000 deep in a message
        return json_response({"error": "invalid", "problems": [TOO_DEEP]}, 400)
    return json_response(body, 200, _answerer_headers(answerer))


lookup.one_door = True  # type: ignore[attr-defined]  # LookupMiddleware places it early


# The doors LookupMiddleware places early, by URL name.
DOORS = ("registry-api:lookup", "registry-api:estimate")


class LookupMiddleware:
    """Places the doors early: a request for the lookup's or the estimate's path goes to its
    door (a function marked ``one_door``) before the middleware listed after this one (see
    the module's docstring); every other request goes on as usual."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.paths: dict[str, Callable[[HttpRequest], HttpResponse]] | None = None

    def _door_paths(self) -> dict[str, Callable[[HttpRequest], HttpResponse]]:
        """The paths the URL conf routes to a door (with and without the slash)."""
        paths = {}
        for name in DOORS:
            # reverse() writes the script prefix; request.path_info has none
            path = "/" + reverse(name).removeprefix(get_script_prefix()).strip("/")
            for candidate in (path, path + "/"):
                try:
                    func = resolve(candidate).func
                except Resolver404:
                    continue
                if getattr(func, "one_door", False):
                    paths[candidate] = func
        return paths

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if self.paths is None:
            self.paths = self._door_paths()
        found = self.paths.get(request.path_info)
        if found is not None:
            return found(request)
        return self.get_response(request)
