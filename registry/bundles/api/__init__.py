"""The bundles REST API: the bundle viewset and its serializers (routed by registry/api/urls.py)."""
