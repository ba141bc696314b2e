"""JSON bodies with a bounded nesting depth, the same on every path (issue 17, item 8).

The lookup's short path reads bodies with orjson, which refuses nesting past 1024 levels;
DRF's JSONParser (json) raised RecursionError (a 500) somewhat earlier. Here json's
RecursionError falls back to orjson: a body orjson reads is read the same on both paths, and
one it refuses is a 400 on both. Anything else that recurses too deep while answering (the
``repr`` of a 1,000-deep value in an error message) is a 400 too, through the handler below.
"""

from __future__ import annotations

import io
from typing import Any

import orjson
from rest_framework import status
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

__all__ = ["TOO_DEEP", "BoundedJSONParser", "exception_handler"]

TOO_DEEP = "the JSON body is nested too deeply (at most 1024 levels)"


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        data = stream.read() if stream is not None else b""
        try:
            return super().parse(io.BytesIO(data), media_type, parser_context)
        except RecursionError:
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                raise ParseError(TOO_DEEP) from None


def exception_handler(exc: Exception, context: Any) -> Response | None:
    if isinstance(exc, RecursionError):
        return Response({"detail": TOO_DEEP}, status=status.HTTP_400_BAD_REQUEST)
    return drf_exception_handler(exc, context)
