"""Capability probes of the vLLM adapters: live API shapes, never version strings (R29).

Fakes mimic each shape the finalization-deferral attributes take across vLLM releases:
absent (0.26.0), the effective boolean as a property or a plain attribute, the request as a
flag (0.28) or a method (0.31), and shapes nobody audited.
"""

from __future__ import annotations

from typing import Any

import pytest

from acquisition.adapters.vllm_capabilities import (
    MODULAR_SYMBOLS,
    check_parameters,
    deferral_reasons,
    model_reasons,
    probe_surface,
    read_deferred_finalize,
)
from acquisition.catalog import resolve_model


class NoDeferral:
    """vLLM 0.26.0: neither attribute exists; deferral does not exist."""


class EffectiveProperty:
    def __init__(self, deferred: bool) -> None:
        self._deferred = deferred

    @property
    def use_deferred_moe_finalize(self) -> bool:
        return self._deferred


class RequestFlag:
    """0.28 shape: the request is a flag, the effective boolean a property."""

    def __init__(self, requested: bool, effective: bool) -> None:
        self.defer_moe_finalize = requested
        self._effective = effective

    @property
    def use_deferred_moe_finalize(self) -> bool:
        return self._effective


class RequestMethod:
    """0.31 shape: the request is a method, the effective boolean a property."""

    def __init__(self, effective: bool) -> None:
        self._effective = effective

    def defer_moe_finalize(self) -> bool:
        return True  # truthy, yet meaningless for execution

    @property
    def use_deferred_moe_finalize(self) -> bool:
        return self._effective


class RequestOnly:
    def defer_moe_finalize(self) -> None:
        return None


class EffectiveMethod:
    def use_deferred_moe_finalize(self) -> bool:
        return False


class EffectiveNone:
    use_deferred_moe_finalize = None


class RequestInteger:
    defer_moe_finalize = 1
    use_deferred_moe_finalize = False


def test_it_admits_a_vllm_without_deferred_finalization() -> None:
    reading = read_deferred_finalize(NoDeferral())
    assert (reading.effective_api, reading.request_api) == ("absent", "absent")
    assert reading.reasons() == []


@pytest.mark.parametrize("deferred", [False, True])
def test_it_reads_the_effective_boolean_property(deferred: bool) -> None:
    reading = read_deferred_finalize(EffectiveProperty(deferred), "layer")
    assert reading.effective_api == "bool"
    assert reading.deferred is deferred
    assert bool(reading.reasons()) is deferred
    if deferred:
        assert "deferred finalization" in reading.reasons()[0]


def test_it_ignores_the_truthiness_of_a_request_flag() -> None:
    # R29: defer_moe_finalize=True is a request; the effective boolean says no deferral.
    reading = read_deferred_finalize(RequestFlag(requested=True, effective=False))
    assert reading.request_api == "flag"
    assert reading.reasons() == []


def test_it_declines_when_the_flag_is_false_but_execution_is_deferred() -> None:
    reading = read_deferred_finalize(RequestFlag(requested=False, effective=True))
    assert reading.deferred is True
    assert reading.reasons()


def test_it_ignores_a_request_method_and_reads_the_effective_boolean() -> None:
    reading = read_deferred_finalize(RequestMethod(effective=False))
    assert reading.request_api == "method"
    assert reading.reasons() == []
    assert read_deferred_finalize(RequestMethod(effective=True)).reasons()


def test_it_declines_a_request_without_the_effective_boolean() -> None:
    reasons = read_deferred_finalize(RequestOnly(), "kernel").reasons()
    assert len(reasons) == 1
    assert "unknown capability API" in reasons[0]
    assert "cannot be read" in reasons[0]


@pytest.mark.parametrize("obj", [EffectiveMethod(), EffectiveNone()])
def test_it_declines_an_effective_attribute_that_is_not_a_boolean(obj: Any) -> None:
    reading = read_deferred_finalize(obj)
    assert reading.effective_api.startswith("unknown:")
    assert "unknown capability API" in reading.reasons()[0]


def test_it_declines_a_request_of_an_unknown_shape() -> None:
    reading = read_deferred_finalize(RequestInteger())
    assert reading.request_api == "unknown:int"
    assert "neither the request flag nor the request method" in reading.reasons()[0]


def test_it_reads_classes_before_anything_is_built() -> None:
    assert read_deferred_finalize(EffectiveProperty).effective_api == "property"
    assert read_deferred_finalize(RequestMethod).request_api == "method"
    assert read_deferred_finalize(NoDeferral).reasons() == []


def test_it_collects_reasons_and_readings_of_every_owner() -> None:
    reasons, readings = deferral_reasons(
        {"kernel": NoDeferral(), "experts": EffectiveProperty(True), "absent": None}
    )
    assert [r["owner"] for r in readings] == ["kernel", "experts"]
    assert len(reasons) == 1 and reasons[0].startswith("deferred finalization: experts")


def test_it_names_every_missing_symbol() -> None:
    def resolve(dotted: str) -> Any:
        if dotted.endswith(":FusedMoEKernel"):
            raise AttributeError(dotted)
        if "workspace" in dotted:
            raise ImportError("No module named 'vllm.v1.worker.workspace'")
        return object()

    surface = probe_surface(MODULAR_SYMBOLS, resolve)
    assert not surface.complete
    assert any("FusedMoEKernel does not exist" in m for m in surface.missing)
    assert sum("cannot be imported" in m for m in surface.missing) == 2


def test_it_checks_keyword_parameters_of_live_callables() -> None:
    def apply(output: Any, hidden_states: Any) -> None: ...

    def anything(**kwargs: Any) -> None: ...

    assert check_parameters("apply", apply, ["output", "hidden_states"]) == []
    reasons = check_parameters("apply", apply, ["output", "workspace13"])
    assert reasons == ["unsupported API: apply takes no parameter(s) workspace13"]
    assert check_parameters("anything", anything, ["workspace13"]) == []


def test_it_declines_checkpoints_the_adapters_cannot_measure() -> None:
    gpt_oss = resolve_model("openai/gpt-oss-20b")
    assert any("biased experts" in r for r in model_reasons(gpt_oss, quantized_allowed=True))
    qwen = resolve_model("Qwen/Qwen3-30B-A3B-Instruct-2507")
    assert model_reasons(qwen, quantized_allowed=False) == []
