"""Routing profiles in the registry (issue 15 part 2): upload, list, download, delete with the
registry's permissions and upload checks; estimates by profile id; the profile pages."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from moetables.profiles import read_profile, write_profile
from tests.moetables.test_captured_estimate import qwen_like_profile

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


@pytest.fixture
def profile_bytes(tmp_path: Path) -> bytes:
    return write_profile(qwen_like_profile(), tmp_path / "q.routing.npz").read_bytes()


def _upload(api: APIClient, data: bytes, name: str = "q.routing.npz") -> Any:
    f = io.BytesIO(data)
    f.name = name
    return api.post("/api/v1/routing-profiles/", {"profile": f}, format="multipart")


def _client(name: str, staff: bool = False) -> APIClient:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(name, password="x", is_staff=staff)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return api


def test_it_publishes_lists_and_serves_a_profile(
    uploader: APIClient, api: APIClient, profile_bytes: bytes
) -> None:
    r = _upload(uploader, profile_bytes)
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["global_experts"], body["top_k"], body["layers"], body["steps"]) == (128, 8, 1, 40)
    assert body["created"] is True and body["published_by"] == "uploader"
    again = _upload(uploader, profile_bytes)
    assert again.status_code == 200 and again.json()["id"] == body["id"]
    listed = api.get("/api/v1/routing-profiles/").json()
    assert [p["id"] for p in listed["results"]] == [body["id"]]
    got = api.get(f"/api/v1/routing-profiles/{body['id']}/download")
    assert got.status_code == 200
    data = b"".join(got.streaming_content)
    assert data == profile_bytes and got["ETag"] == f'"{body["sha256"]}"'
    assert read_profile(data).steps == 40
    cached = api.get(
        f"/api/v1/routing-profiles/{body['id']}/download", HTTP_IF_NONE_MATCH=f'"{body["sha256"]}"'
    )
    assert cached.status_code == 304


def test_it_refuses_bad_uploads_with_the_field_named(
    uploader: APIClient, api: APIClient, profile_bytes: bytes
) -> None:
    assert _upload(api, profile_bytes).status_code == 401
    bad = _upload(uploader, b"PK\x03\x04 not really a zip")
    assert bad.status_code == 400
    assert "not a routing profile" in bad.json()["problems"][0]
    assert uploader.post("/api/v1/routing-profiles/", {}, format="multipart").status_code == 400
    # A corrupt count inside a well-formed archive: the checksum names the array.
    import numpy as np

    with np.load(io.BytesIO(profile_bytes)) as z:
        members = {k: z[k] for k in z.files}
    members["counts"] = members["counts"].copy()
    members["counts"][0, 0, 0] += 1
    buf = io.BytesIO()
    np.savez_compressed(buf, **members)
    r = _upload(uploader, buf.getvalue())
    assert r.status_code == 400 and "counts: checksum mismatch" in r.json()["problems"][0]


def test_it_lets_only_the_publisher_or_staff_delete(
    uploader: APIClient, api: APIClient, profile_bytes: bytes
) -> None:
    pk = _upload(uploader, profile_bytes).json()["id"]
    assert api.delete(f"/api/v1/routing-profiles/{pk}/").status_code == 401
    assert _client("mallory").delete(f"/api/v1/routing-profiles/{pk}/").status_code == 403
    assert uploader.delete(f"/api/v1/routing-profiles/{pk}/").status_code == 204
    assert api.get(f"/api/v1/routing-profiles/{pk}/").status_code == 404
    pk = _upload(uploader, profile_bytes).json()["id"]
    assert _client("root", staff=True).delete(f"/api/v1/routing-profiles/{pk}/").status_code == 204


def test_it_never_serves_a_damaged_or_missing_profile_file(
    uploader: APIClient, api: APIClient, profile_bytes: bytes
) -> None:
    """The download is immutable and named by its sha256: bytes that drifted in storage are a
    503 naming the profile, never sent under the published ETag (as bundle downloads)."""
    from registry.storage import blob_name, bundle_storage

    body = _upload(uploader, profile_bytes).json()
    path = Path(bundle_storage().path(blob_name(body["sha256"])))
    path.chmod(0o644)
    path.write_bytes(profile_bytes[:-1] + bytes([profile_bytes[-1] ^ 1]))
    got = api.get(f"/api/v1/routing-profiles/{body['id']}/download")
    assert got.status_code == 503 and got["Retry-After"] == "300"
    assert got.json()["error"] == "storage_fault"
    assert f"routing profile {body['id']}" in got.json()["message"]
    assert "no longer matches its sha256" in got.json()["message"]
    path.unlink()
    gone = api.get(f"/api/v1/routing-profiles/{body['id']}/download")
    assert gone.status_code == 503 and "missing from storage" in gone.json()["message"]


def test_it_keeps_bytes_a_bundle_also_holds_when_a_profile_goes(
    uploader: APIClient, profile_bytes: bytes, published: Any
) -> None:
    """Bundle files and profiles share one content-addressed store: deleting the profile
    leaves bytes that a bundle's manifest names, and removes bytes nothing names."""
    import hashlib

    from registry.manifest import FileRecord
    from registry.storage import blob_name, bundle_storage

    digest = hashlib.sha256(profile_bytes).hexdigest()
    pk = _upload(uploader, profile_bytes).json()["id"]
    record = FileRecord("notes/routing.txt", len(profile_bytes), digest).as_dict()
    published.manifest = [*published.manifest, record]
    published.save(update_fields=["manifest"])
    assert uploader.delete(f"/api/v1/routing-profiles/{pk}/").status_code == 204
    assert bundle_storage().exists(blob_name(digest))
    published.manifest = [r for r in published.manifest if r["sha256"] != digest]
    published.save(update_fields=["manifest"])
    pk = _upload(uploader, profile_bytes).json()["id"]
    assert uploader.delete(f"/api/v1/routing-profiles/{pk}/").status_code == 204
    assert not bundle_storage().exists(blob_name(digest))


def test_a_failed_publication_keeps_bytes_a_profile_holds(
    uploader: APIClient, profile_bytes: bytes
) -> None:
    import hashlib

    from registry.bundles.services.publish import sweep_unreferenced
    from registry.storage import blob_name, bundle_storage

    digest = hashlib.sha256(profile_bytes).hexdigest()
    assert _upload(uploader, profile_bytes).status_code == 201
    assert sweep_unreferenced([digest]) == []
    assert bundle_storage().exists(blob_name(digest))


def test_it_estimates_with_a_published_profile_by_id(
    uploader: APIClient, api: APIClient, profile_bytes: bytes
) -> None:
    from registry.bundles.services import publish_bundle

    bundle = publish_bundle(H200).bundle
    pk = _upload(uploader, profile_bytes).json()["id"]
    body = {
        "bundle": bundle.pk,
        "tp": 1,
        "dp": 2,
        "tokens": [32, 32],
        "policy": "captured",
        "profile": pk,
        "layer": 3,
        "events": False,
    }
    r = api.post("/api/v1/estimate", body, format="json")
    assert r.status_code == 200, r.content
    m = [rank["M"] for rank in r.json()["ranks"]]
    assert sum(m) == 512 and m[0] > m[1] + 100
    r = api.post("/api/v1/estimate", dict(body, profile=pk + 99), format="json")
    assert r.status_code == 400
    assert any(f"no published routing profile {pk + 99}" in p for p in r.json()["problems"])
    r = api.post("/api/v1/estimate", dict(body, profile="x"), format="json")
    assert r.status_code == 400


def test_it_draws_the_profile_pages(uploader: APIClient, client: Any, profile_bytes: bytes) -> None:
    pk = _upload(uploader, profile_bytes).json()["id"]
    listing = client.get("/routing-profiles/")
    assert (
        listing.status_code == 200 and f'href="/routing-profiles/{pk}/"' in listing.content.decode()
    )
    page = client.get(f"/routing-profiles/{pk}/?ep=4&layer=3")
    text = page.content.decode()
    assert page.status_code == 200
    for name in ("heatmap", "imbalance", "a_curve", "m_curve"):
        assert f'id="{name}" type="application/json"' in text
    assert "rank 3 captured" in text and "rank 0 balanced" in text
    assert "<script>" not in text  # CSP: figures come from JSON data, drawn by a static file
    assert client.get(f"/routing-profiles/{pk}/?ep=banana&layer=-1").status_code == 200
    assert client.get(f"/routing-profiles/{pk + 5}/").status_code == 404


def test_it_bins_many_step_sizes_for_the_curves() -> None:
    """Thousands of distinct N draw as at most 60 log-spaced points, each at its steps' mean."""
    import numpy as np

    from frontend.profiles import n_groups

    tokens = np.arange(1, 5001)
    group, ns = n_groups(tokens)
    assert ns.size <= 60 and group.shape == tokens.shape
    assert (np.diff(ns) > 0).all()
    for g in (0, ns.size - 1):
        assert ns[g] == round(tokens[group == g].mean())
    few = np.array([8, 8, 64, 300])
    group, ns = n_groups(few)
    assert ns.tolist() == [8, 64, 300] and group.tolist() == [0, 0, 1, 2]


def test_it_offers_published_profiles_on_the_estimate_page(
    uploader: APIClient, client: Any, profile_bytes: bytes
) -> None:
    from registry.bundles.services import publish_bundle

    bundle = publish_bundle(H200).bundle
    pk = _upload(uploader, profile_bytes).json()["id"]
    page = client.get(
        f"/bundles/{bundle.pk}/estimate",
        {
            "deployment": "1/2/0",
            "tokens": "32,32",
            "policy": "captured",
            "profile": str(pk),
            "layer": "3",
            "cluster": "",
        },
    )
    text = page.content.decode()
    assert page.status_code == 200 and 'id="estimate-answer"' in text, text[-2000:]
    assert "policy captured" in text
    page = client.get(
        f"/bundles/{bundle.pk}/estimate",
        {"deployment": "1/2/0", "tokens": "32,32", "policy": "captured", "profile": "999"},
    )
    assert "no published routing profile 999" in page.content.decode()


def test_it_never_fails_on_damaged_uploads(uploader: APIClient, profile_bytes: bytes) -> None:
    """Issue 17's rule for uploads: truncated, bit-flipped or random files are a 400 naming
    the problem, never a server error, and nothing is stored."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from registry.profile_models import RoutingProfileRecord

    @settings(
        max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(st.data())
    def check(data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(["truncate", "flip", "random"]))
        if kind == "truncate":
            blob = profile_bytes[: data.draw(st.integers(0, len(profile_bytes) - 1))]
        elif kind == "flip":
            at = data.draw(st.integers(0, len(profile_bytes) - 1))
            blob = profile_bytes[:at] + bytes([profile_bytes[at] ^ 0xFF]) + profile_bytes[at + 1 :]
        else:
            blob = data.draw(st.binary(max_size=2048))
        r = _upload(uploader, blob)
        if r.status_code == 201:  # a flip inside zip padding can leave the content intact
            assert kind == "flip"
            RoutingProfileRecord.objects.all().delete()
            return
        assert r.status_code == 400, r.content
        assert r.json()["problems"][0].startswith("profile")

    check()


def test_it_escapes_what_a_profile_says_about_itself(
    uploader: APIClient, client: Any, tmp_path: Path
) -> None:
    from moetables.profiles import RoutingProfile

    base = qwen_like_profile()
    hostile = RoutingProfile.create(
        model=dict(base.meta["model"], name="<script>alert(1)</script>"),
        workload=base.meta["workload"],
        step_tokens=base.step_tokens,
        counts=base.counts,
        command="</script><img src=x onerror=alert(2)>",
        router="<b>r</b>",
    )
    data = write_profile(hostile, tmp_path / "h.routing.npz").read_bytes()
    pk = _upload(uploader, data).json()["id"]
    for url in ("/routing-profiles/", f"/routing-profiles/{pk}/"):
        text = client.get(url).content.decode()
        assert (
            "<script>alert(1)" not in text and "<img src=x" not in text and "<b>r</b>" not in text
        )
        assert "&lt;script&gt;alert(1)" in text


def test_it_draws_the_busiest_rank_that_all_layers_averaging_would_flatten() -> None:
    """Two layers whose hot experts sit on opposite ranks: averaged over layers each rank looks
    balanced, while in every step one rank carries four times the other's pairs."""
    from frontend.profiles import profile_figures
    from moetables.profiles import RoutingProfile

    counts = np.zeros((4, 2, 8), dtype=np.int64)
    counts[:, 0, :4], counts[:, 0, 4:] = 8, 2  # layer 0: rank 0 hot (EP2: experts 0-3)
    counts[:, 1, :4], counts[:, 1, 4:] = 2, 8  # layer 1: rank 1 hot
    profile = RoutingProfile.create(
        model={"name": "two-layer", "global_experts": 8, "top_k": 2, "layers": [0, 1]},
        workload={"prompts_sha256": "0" * 64, "prompts": 1, "prompt_tokens": 1,
                  "generated_tokens": 1},
        step_tokens=[20] * 4, counts=counts, router="synthetic", source="synthetic",
    )  # fmt: skip
    traces = {t["name"]: t["y"] for t in profile_figures(profile, 2, None)["m_curve"]["data"]}
    assert traces["rank 0 captured"] == traces["rank 1 captured"] == [20.0]
    assert traces["busiest rank"] == [32.0]
    one = {t["name"]: t["y"] for t in profile_figures(profile, 2, 1)["m_curve"]["data"]}
    assert one["rank 1 captured"] == one["busiest rank"] == [32.0]
