from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination


class BundlePagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = 1000
