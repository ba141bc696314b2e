"""What a simulator author meets walking the README end to end (session 6 QA): refusals that
name the problem whole, name lookups that say what exists, and an OpenAPI schema that says
what the one door takes and gives (R31-R33: the API documents and validates what it answers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from registry.bundles.services import publish_bundle

if TYPE_CHECKING:
    from rest_framework.test import APIClient

    from registry.bundles.models import Bundle

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "bundles/H200/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507"


@pytest.fixture
def published(db: None) -> Bundle:
    return publish_bundle(H200).bundle


def _post(api: APIClient, path: str, body: dict[str, Any]) -> Any:
    return api.post(path, json.dumps(body), content_type="application/json")


def test_an_estimate_refusal_keeps_each_problem_whole(api: APIClient, published: Bundle) -> None:
    """A problem whose own text holds '; ' stays one problem, not two fragments."""
    response = _post(
        api,
        "/api/v1/estimate",
        {"bundle": published.pk, "tp": 1, "dp": 2, "tokens": [5, 300], "tile_cost_us": "table"},
    )
    assert response.status_code == 400
    assert response.json()["problems"] == [
        "tile_cost_us: the balanced policy gives no per-expert counts to tile; "
        "histogram, round_robin, random, captured do"
    ]
    response = _post(
        api, "/api/v1/estimate", {"bundle": published.pk, "tp": 1, "dp": 2, "tokens": [5], "x": 1}
    )
    problems = response.json()["problems"]
    assert len(problems) == 2, problems
    assert problems[0].startswith("unknown field(s) ['x']; known are [")
    assert problems[1] == "step 0: needs one token count per DP rank (2), got 1"


def _schema(api: APIClient) -> dict[str, Any]:
    response = api.get("/api/schema/", headers={"accept": "application/vnd.oai.openapi+json"})
    assert response.status_code == 200
    schema: dict[str, Any] = response.json()
    return schema


def _resolved(schema: dict[str, Any], node: Any) -> Any:
    """The schema node with every $ref inlined and OpenAPI's nullable as JSON Schema's."""
    if isinstance(node, list):
        return [_resolved(schema, item) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _resolved(schema, schema["components"]["schemas"][node["$ref"].split("/")[-1]])
    out = {k: _resolved(schema, v) for k, v in node.items() if k != "nullable"}
    return {"anyOf": [out, {"type": "null"}]} if node.get("nullable") else out


@pytest.mark.parametrize("path", ["/api/v1/lookup/", "/api/v1/estimate/"])
def test_the_schema_offers_only_the_body_the_door_reads(api: APIClient, path: str) -> None:
    """The one door reads application/json only (any other type is a 400), so Swagger UI
    must not offer form encodings for these two operations."""
    body = _schema(api)["paths"][path]["post"]["requestBody"]
    assert list(body["content"]) == ["application/json"]


def test_the_estimate_schema_documents_the_lookup_pins(api: APIClient, published: Bundle) -> None:
    """docs/registry.md: the estimate names its bundle as a lookup does, with the same pins;
    the request schema lists them, and the door takes them."""
    schema = _schema(api)
    ref = schema["paths"]["/api/v1/estimate/"]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]["$ref"]
    fields = set(schema["components"]["schemas"][ref.split("/")[-1]]["properties"])
    assert {"backend", "vllm_version", "include_exploratory"} <= fields
    body: dict[str, Any] = {"hardware": "H200", "model": MODEL, "variant": "bf16", "tp": 1, "dp": 2}
    body |= {"tokens": [5, 300], "backend": "vllm-modular", "include_exploratory": False}
    assert _post(api, "/api/v1/estimate", body).status_code == 200


def test_an_estimate_of_many_steps_matches_its_schema(api: APIClient, published: Bundle) -> None:
    """With ``steps`` the answer is {bundle, answers}: the documented 200 must admit it (and
    still describe the one-step answer)."""
    import jsonschema  # type: ignore[import-untyped]  # schemathesis brings it

    schema = _schema(api)
    answer = _resolved(
        schema,
        schema["paths"]["/api/v1/estimate/"]["post"]["responses"]["200"]["content"][
            "application/json"
        ]["schema"],
    )
    base = {"bundle": published.pk, "tp": 1, "dp": 2, "events": False}
    many = _post(api, "/api/v1/estimate", base | {"steps": [[5, 300], [1, 10**6]]})
    assert many.status_code == 200
    assert [sorted(a)[:2] for a in many.json()["answers"][1:]] == [["error", "message"]]
    jsonschema.validate(many.json(), answer)
    one = _post(api, "/api/v1/estimate", base | {"tokens": [5, 300]})
    jsonschema.validate(one.json(), answer)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"bundle": one.json()["bundle"]}, answer)


REFERENCE = REPO / "bundles/H200-torch-reference/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"


def test_the_estimate_takes_query_string_pins_as_the_lookup_does(
    api: APIClient, published: Bundle
) -> None:
    """docs/registry.md: the estimate names its bundle as a lookup does, with the same pins,
    and the lookup takes pins in the query string too; a pin there was silently ignored
    (the estimate answered from another bundle than the one pinned)."""
    reference = publish_bundle(REFERENCE).bundle
    body: dict[str, Any] = {"hardware": "H200", "model": MODEL, "variant": "bf16", "tp": 1, "dp": 2}
    body |= {"tokens": [5, 300], "events": False}
    plain = _post(api, "/api/v1/estimate", body)
    assert plain.json()["bundle"]["id"] == published.pk
    lookup: dict[str, Any] = {k: body[k] for k in ("hardware", "model", "variant")}
    lookup |= {"target": {"tp": 1, "dp": 2, "rank": 0}, "queries": []}
    for path in ("/api/v1/lookup", "/api/v1/estimate"):
        sent = lookup if path.endswith("lookup") else body
        pinned = _post(api, path + "?backend=torch-reference", sent)
        assert pinned.status_code == 200, pinned.content
        assert pinned.json()["bundle"]["id"] == reference.pk, path
        assert pinned["X-Bundle-Backend"] == "torch-reference"
        wrong = _post(api, path + "?backend=torch-reference", sent | {"backend": "vllm-modular"})
        assert wrong.status_code == 400
        assert (
            "the body says 'vllm-modular' and the query string 'torch-reference'"
            in (wrong.json()["problems"][0])
        )
        unknown = _post(api, path + "?backnd=torch-reference", sent)
        assert unknown.status_code == 400
        assert "unknown parameter 'backnd'" in unknown.json()["problems"][0]


def test_the_job_example_of_docs_jobs_md_is_accepted(db: None) -> None:
    """The curl example a user copies from docs/jobs.md queues a job (it lacked the dtype that
    OLMoE's config.json does not name, so it was a 400)."""
    import re

    from registry.jobs.parameters import validate_parameters

    text = (REPO / "docs/jobs.md").read_text()
    example = re.search(r"-d '(\{.*?\})' http://127\.0\.0\.1:8000/api/v1/jobs/", text, re.S)
    assert example is not None
    params = validate_parameters(json.loads(example.group(1)))
    assert params["model"] == "allenai/OLMoE-1B-7B-0924"


FP8 = REPO / "bundles/H200-vllm-modular-fp8-f2/Qwen/Qwen3-30B-A3B-Instruct-2507-FP8/fp8"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        (("h200", MODEL, "bf16"), "no bundle of hardware 'h200'; published hardware: 'H200'"),
        (
            ("H200", "Qwen/Qwen3-30B-A3B", "bf16"),
            "no bundle of model 'Qwen/Qwen3-30B-A3B' on 'H200'; models there: "
            f"'{MODEL}', '{MODEL}-FP8'",
        ),
        (
            ("H200", MODEL, "fp8"),
            f"no bundle of variant 'fp8' of '{MODEL}' on 'H200'; variants there: 'bf16'; "
            f"'fp8' is published for '{MODEL}-FP8'",
        ),
    ],
)
def test_a_name_nobody_published_is_answered_with_the_names_there_are(
    api: APIClient, published: Bundle, name: tuple[str, str, str], says: str
) -> None:
    """Finding the right bundle for a target (hardware, model, variant: the FP8 checkpoint is
    its own model name): a near miss says what is published instead of only 'no match'."""
    publish_bundle(FP8)
    body: dict[str, Any] = dict(zip(("hardware", "model", "variant"), name, strict=True))
    body |= {"target": {"tp": 1, "dp": 2, "rank": 0}, "queries": []}
    response = _post(api, "/api/v1/lookup", body)
    assert response.status_code == 404
    message = response.json()["message"]
    assert message.startswith("no published bundle matches: ")
    assert says in message, message
    estimate: dict[str, Any] = {k: body[k] for k in ("hardware", "model", "variant")}
    estimate |= {"tp": 1, "dp": 2, "tokens": [5, 300]}
    response = _post(api, "/api/v1/estimate", estimate)
    assert response.status_code == 404 and says in response.json()["message"]


def test_a_name_of_only_exploratory_bundles_says_how_to_ask(
    api: APIClient, published: Bundle
) -> None:
    type(published).objects.filter(pk=published.pk).update(exploratory=True)
    body: dict[str, Any] = {"hardware": "H200", "model": MODEL, "variant": "bf16"}
    body |= {"target": {"tp": 1, "dp": 2, "rank": 0}, "queries": []}
    response = _post(api, "/api/v1/lookup", body)
    assert response.status_code == 404
    assert response.json()["message"] == (
        'no published bundle matches: its bundles are exploratory: ask with "include_exploratory"'
        ": true"
    )
    assert _post(api, "/api/v1/lookup", body | {"include_exploratory": True}).status_code == 200


def test_a_file_that_is_no_profile_is_named_once(db: None) -> None:
    """The upload's problem names its field once ('profile: profile: ...' before)."""
    import io

    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    user = get_user_model().objects.create_user("uploader", password="x")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    f = io.BytesIO(b"# not a profile\n")
    f.name = "README.md"
    response = api.post("/api/v1/routing-profiles/", {"profile": f}, format="multipart")
    assert response.status_code == 400
    assert response.json()["problems"] == ["profile: not a routing profile (an .npz zip archive)"]


SP_AT_TP1 = "target.sequence_parallel is only meaningful where tp > 1 and dp > 1 (tp=1 dp=2)"


def test_sequence_parallelism_without_tp_is_a_400_as_in_process(
    api: APIClient, published: Bundle
) -> None:
    """In process this target is a QueryError; over REST, named by id it was a 500 (the
    no-coverage explanation opened the deployment and met the QueryError), by name a 422
    listing every table: now both doors refuse it the same way, as malformed."""
    from moetables import ComponentTables
    from moetables.errors import QueryError

    with pytest.raises(QueryError) as refused:
        ComponentTables(H200).deployment(1, 2, 0, True)
    assert str(refused.value) == SP_AT_TP1
    target = {"tp": 1, "dp": 2, "rank": 0, "sequence_parallel": True}
    by_name = {"hardware": "H200", "model": MODEL, "variant": "bf16"}
    for named in ({"bundle": published.pk}, by_name):
        response = _post(api, "/api/v1/lookup", named | {"target": target, "queries": []})
        assert response.status_code == 400, response.content
        assert response.json()["problems"] == [SP_AT_TP1]
        body = named | {"tp": 1, "dp": 2, "sequence_parallel": True, "tokens": [5, 300]}
        response = _post(api, "/api/v1/estimate", body)
        assert response.status_code == 400, response.content
        assert response.json()["problems"] == [SP_AT_TP1]


def test_an_infinite_tile_cost_is_refused_by_the_estimate_as_by_the_lookup(
    api: APIClient, published: Bundle
) -> None:
    """JSON's 1e309 reads as inf: the lookup refused it (a finite number), the estimate took it
    and answered null experts and NaN waits (in process: inf)."""
    from moetables import ComponentTables
    from moetables.errors import QueryError

    with pytest.raises(QueryError, match="tile_cost_us must be a finite number >= 0"):
        ComponentTables(H200).estimate([5, 300], tp=1, dp=2, policy="random", tile_cost_us=1e309)
    body = {"bundle": published.pk, "tp": 1, "dp": 2, "tokens": [5, 300], "policy": "random"}
    response = api.post(
        "/api/v1/estimate",
        json.dumps(body)[:-1] + ', "tile_cost_us": 1e309}',
        content_type="application/json",
    )
    assert response.status_code == 400, response.content
    assert response.json()["problems"] == [
        "tile_cost_us: must be a finite number >= 0 (at most 1,000,000 us) or one of "
        "['auto', 'table', 'none'], got inf"
    ]


def test_an_inline_profile_problem_names_its_field_once(api: APIClient, published: Bundle) -> None:
    body = {"bundle": published.pk, "tp": 1, "dp": 2, "tokens": [5, 300], "policy": "captured"}
    response = _post(api, "/api/v1/estimate", body | {"profile": {"meta": {}}})
    assert response.status_code == 400
    assert response.json()["problems"] == ["profile: field(s) ['step_tokens', 'counts'] missing"]


def test_every_documented_error_answer_has_its_body(api: APIClient) -> None:
    """DRF's 400/401/403/404/429 always carry a JSON body; where a view listed the status with
    no body (DELETE a profile's 401/403/404, a table's 404), the schema said 'No response body'
    while the answer was {"detail": ...}."""
    schema = _schema(api)
    bare = [
        f"{method.upper()} {path} {code}"
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if method in {"get", "post", "put", "patch", "delete"}
        for code, response in operation["responses"].items()
        if code in {"400", "401", "403", "404", "429"} and "content" not in response
    ]
    assert not bare, bare
    delete = schema["paths"]["/api/v1/routing-profiles/{id}/"]["delete"]["responses"]["403"]
    assert delete["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorDetail"
    }
    assert delete["description"] == "the user may not do this"


def test_a_boolean_filter_it_cannot_read_is_refused_not_ignored(
    api: APIClient, published: Bundle
) -> None:
    """?native=1 (or yes, maybe) matched every bundle: Django's NullBooleanSelect reads only
    true/false (and its own '2'/'3'), and an unreadable value dropped the filter silently."""
    publish_bundle(REFERENCE)
    count = {
        value: api.get("/api/v1/bundles/", {"native": value}).json().get("count")
        for value in ("true", "1", "false", "0")
    }
    assert count == {"true": 1, "1": 1, "false": 1, "0": 1}
    for key in ("native", "sequence_parallel"):
        response = api.get("/api/v1/bundles/", {key: "maybe"})
        assert response.status_code == 400
        assert response.json() == {key: ["'maybe' is not true or false (nor 1 or 0)"]}


def test_the_table_filters_are_typed_in_the_schema(api: APIClient) -> None:
    """The table filters (tp, dp, ep, rank, native, sequence_parallel, backend, kernel) were
    documented without a type (schema {}): Swagger UI offered a free-text box for a boolean."""
    parameters = {
        p["name"]: p["schema"]
        for p in _schema(api)["paths"]["/api/v1/bundles/"]["get"]["parameters"]
    }
    assert {k: parameters[k].get("type") for k in ("tp", "dp", "ep", "rank")} == dict.fromkeys(
        ("tp", "dp", "ep", "rank"), "integer"
    )
    assert parameters["native"] == parameters["sequence_parallel"] == {"type": "boolean"}
    assert parameters["backend"] == parameters["kernel"] == {"type": "string"}


def test_an_unknown_profile_id_is_one_problem(api: APIClient, published: Bundle) -> None:
    body = {"bundle": published.pk, "tp": 1, "dp": 2, "tokens": [64, 64], "policy": "captured"}
    response = _post(api, "/api/v1/estimate", body | {"profile": 999})
    assert response.status_code == 400
    assert response.json()["problems"] == ["profile: no published routing profile 999"]


@pytest.mark.parametrize("path", ["a%0Ab", "%0A", "tp1/x%0D%0Ay.csv"])
def test_a_file_path_with_a_line_break_is_the_documented_json_404(
    api: APIClient, published: Bundle, path: str
) -> None:
    """The schema documents the files door's 404 as JSON; a path with a line break used to miss
    the URL pattern and get Django's HTML 404 (found by the schema fuzz, R44)."""
    response = api.get(f"/api/v1/bundles/{published.pk}/files/{path}")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert "has no file" in response.json()["detail"]
