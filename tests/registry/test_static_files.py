"""The run command's static files: collected with compressed copies, plotly.js served gzipped
and cached for good, the dashboard's own files revalidated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.test import Client, override_settings


def test_it_serves_collected_plotly_compressed_with_a_long_lifetime(
    tmp_path: Path, settings: Any
) -> None:
    root = tmp_path / "static"
    settings.STATIC_ROOT = root
    call_command("collectstatic", "--noinput", "--verbosity", "0")
    plotly = root / "frontend" / "vendor" / "plotly-4.1.1.min.js"
    assert plotly.is_file() and plotly.with_name(plotly.name + ".gz").is_file()
    # The server as the run command starts it: collected files only (no finders).
    with override_settings(WHITENOISE_USE_FINDERS=False, STATIC_ROOT=root):
        client = Client()
        response = client.get(
            "/static/frontend/vendor/plotly-4.1.1.min.js", HTTP_ACCEPT_ENCODING="gzip"
        )
        assert response.status_code == 200
        assert response["Content-Encoding"] in ("gzip", "br")
        body = b"".join(response.streaming_content)  # type: ignore[attr-defined]
        assert len(body) < plotly.stat().st_size / 3
        assert "immutable" in response["Cache-Control"]
        assert "max-age=315360000" in response["Cache-Control"]
        own = client.get("/static/frontend/figures.js")
        assert "immutable" not in own["Cache-Control"]
