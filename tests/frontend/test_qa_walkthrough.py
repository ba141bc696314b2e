"""Dashboard details met walking the README (session 6 QA)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "path", ["/", "/coverage/", "/routing-profiles/", "/jobs/", "/compare/", "/accounts/login/"]
)
def test_every_page_names_its_icon(client: Client, path: str) -> None:
    """Without a declared icon a browser asks for /favicon.ico, a 404 in the console of every
    page; a data: URL (the CSP allows data: images) costs no request."""
    response = client.get(path)
    assert response.status_code == 200
    icon = re.search(r'<link rel="icon" href="([^"]*)"', response.content.decode())
    assert icon is not None, path
    assert icon.group(1).startswith("data:")
