"""REST API v1 (netbox layout: serializers, views, urls)."""
