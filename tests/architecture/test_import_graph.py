"""The import graph of the project's packages: one way, no circle (design.md, "Architecture").

Read from the source with `ast`, so an import inside a function counts as much as one at the
top (a circle of lazy imports is still a circle); imports under ``if TYPE_CHECKING:`` do not
run and are left out.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("moetables", "acquisition", "registry", "frontend", "config")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "migrations" not in path.parts:
                found[_module_name(path)] = path
    return found


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(tree: ast.AST, here: str, is_package: bool) -> Iterator[str]:
    """Every module name an import statement of ``tree`` names (outside TYPE_CHECKING)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))


def _project_module(name: str) -> str | None:
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = set()
        for imported in _imported(tree, name, path.name == "__init__.py"):
            target = _project_module(imported)
            # A module importing its own package's __init__ (for a sibling) is not an edge back.
            if target is not None and target != name and not name.startswith(f"{target}."):
                targets.add(target)
        graph[name] = targets
    return graph


GRAPH = _edges()


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_it_finds_a_circle_when_there_is_one() -> None:
    """The detector itself: a planted circle is found, a chain is not."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_it_has_no_import_circle_among_the_projects_modules() -> None:
    assert _circles(GRAPH) == []


def _violations(package: str, allowed: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for name, path in MODULES.items():
        if name != package and not name.startswith(f"{package}."):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for imported in _imported(tree, name, path.name == "__init__.py"):
            top = imported.split(".")[0]
            if top in forbidden and not imported.startswith(allowed):
                bad.append(f"{name} imports {imported}")
    return sorted(set(bad))


@pytest.mark.parametrize(
    ("package", "allowed", "forbidden"),
    [
        # The pure core: no Django, no torch, no vLLM, nothing of the project above it.
        (
            "moetables",
            (),
            (
                "django",
                "rest_framework",
                "celery",
                "torch",
                "vllm",
                "acquisition",
                "registry",
                "frontend",
                "config",
            ),
        ),
        # The GPU side runs without Django.
        (
            "acquisition",
            (),
            ("django", "rest_framework", "celery", "registry", "frontend", "config"),
        ),
        # The registry and the pages import one module of acquisition: its options schema.
        ("registry", ("acquisition.options",), ("acquisition", "frontend", "torch", "vllm")),
        ("frontend", ("acquisition.options",), ("acquisition", "torch", "vllm")),
    ],
)
def test_it_points_imports_one_way(
    package: str, allowed: tuple[str, ...], forbidden: tuple[str, ...]
) -> None:
    assert _violations(package, allowed, forbidden) == []


def test_it_keeps_the_apps_off_the_project_celery_module() -> None:
    """Tasks are sent by name through ``celery.current_app``; only config makes the app."""
    for package in ("registry", "frontend"):
        bad = [v for v in _violations(package, (), ("config",)) if "config.celery" in v]
        assert bad == []


def test_it_keeps_bundle_services_below_the_api() -> None:
    """The bundle feature reads like the jobs wing (issue 12): its models and services are plain
    code the API, commands, tasks and pages call, so they import no API module themselves."""
    below = ("registry.bundles.models", "registry.bundles.services")
    bad = [
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        if name.startswith(below)
        for target in targets
        if target.startswith(("registry.api", "registry.bundles.api", "frontend"))
    ]
    assert bad == []
    assert "registry.bundles.models" in MODULES
    assert "registry.bundles.models" in GRAPH["registry.models"]


def test_it_imports_no_private_name_across_modules() -> None:
    """A name with a leading underscore belongs to its module: another module that needs it
    gets a public name (the jobs wing once imported ``runner._artifacts`` and ``_tail``)."""
    bad = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.module is None or node.level:
                continue
            if _project_module(node.module) is None:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    bad.append(f"{name} imports {node.module}.{alias.name}")
    assert bad == []
