"""Checked options resolved into a request and one point plan per target (pure: no torch),
with `OptionError` naming the field at fault."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from acquisition.catalog import CatalogError, resolve_model, variant_for_dtype
from acquisition.deployments import DegreeError, select_deployments, select_ranks, targets_for
from acquisition.options.measurable import backend_target_problem
from acquisition.options.schema import NON_FIELD, AcquisitionOptions, OptionError
from acquisition.plan import (
    CaptureSizes,
    CudagraphMode,
    PointPlan,
    build_plan,
    derived_capture_sizes,
)
from acquisition.plan.kernel import (
    KERNEL_STEPS_RULE,
    KERNEL_STEPS_RULE_V3,
    KERNEL_STEPS_RULE_V4,
    KernelSteps,
    KernelStepsError,
)
from acquisition.protocol.measure import ProtocolSettings
from acquisition.request import AcquisitionRequest
from moetables.bundle import EXPERTS
from moetables.geometry import ExpertGeometry, MoeTarget

__all__ = [
    "DEFAULT_KERNEL_STEPS_RULE",
    "command_line",
    "default_components",
    "kernel_steps_for",
    "plan_target",
    "prepare",
    "target_key",
]


def prepare(
    options: AcquisitionOptions, command_line: str = ""
) -> tuple[AcquisitionRequest, list[PointPlan]]:
    """Resolve checked options into a request and one plan per target; no torch involved.

    Raises `OptionError` naming the field at fault.
    """
    if options.force:
        raise OptionError(
            "force",
            "--force is rejected: resume the original acquisition, or "
            "choose another --out-root for a new measurement",
        )
    try:
        model = resolve_model(options.model)
    except CatalogError as exc:
        raise OptionError("model", str(exc)) from exc
    dtype = options.dtype if options.dtype != "auto" else model.dtype
    if dtype is None:
        raise OptionError("dtype", f"{model.name}: config.json names no torch_dtype; pass --dtype")
    try:
        variant = variant_for_dtype(dtype, model.quantization)
    except CatalogError as exc:
        raise OptionError("dtype", str(exc)) from exc
    try:
        deployments = select_deployments(
            options.command, options.tp, options.tp_refresh, options.dp, options.ep
        )
        targets = select_ranks(targets_for(model, deployments), options.ranks)
    except DegreeError as exc:
        raise OptionError(exc.field, str(exc)) from exc
    if options.max_num_seqs > options.max_num_batched_tokens:
        raise OptionError(
            "max_num_seqs",
            f"--max-num-seqs {options.max_num_seqs} exceeds --max-num-batched-tokens "
            f"{options.max_num_batched_tokens}; vLLM refuses such limits",
        )
    settings = ProtocolSettings(
        rounds=options.rounds,
        iterations=options.iterations,
        warmup_cycles=options.warmup_cycles,
        tolerance=options.quality_tolerance,
        attempts=options.control_attempts,
        batch_points=options.profile_batch,
        precompile_workers=options.triton_precompile_workers,
    )
    if options.cudagraph_capture_sizes:
        bad = [s for s in options.cudagraph_capture_sizes if s < 1]
        if bad:
            raise OptionError(
                "cudagraph_capture_sizes", f"--cudagraph-capture-sizes must be positive, got {bad}"
            )
        captures = CaptureSizes(
            tuple(sorted(set(options.cudagraph_capture_sizes))), "target_option"
        )
    else:
        captures = derived_capture_sizes(options.max_num_seqs, options.max_num_batched_tokens)
    request = AcquisitionRequest(
        command=options.command,
        model=model,
        hardware=options.hardware,
        dtype=dtype,
        variant=variant,
        out_root=options.out_root,
        backend=options.backend,
        device=options.device,
        settings=settings,
        max_num_batched_tokens=options.max_num_batched_tokens,
        max_num_seqs=options.max_num_seqs,
        grid_factor=options.grid_factor,
        kernel_steps=options.kernel_steps,
        cudagraph_mode=CudagraphMode(options.cudagraph_mode),
        captures=captures,
        cache_bytes=options.cache_bytes,
        command_line=command_line,
        engine_attention_backend=options.engine_attention_backend,
        engine_kv_cache_bytes=options.engine_kv_cache_bytes,
    )
    if options.only_target is not None:
        targets = [t for t in targets if target_key(t) == options.only_target]
        if not targets:
            raise OptionError(
                "only_target", f"{options.only_target!r} is not one of the command's targets"
            )
    if options.backend != "auto":
        # A named backend that cannot measure a selected target would fail at admission on
        # the GPU host; say so now, as a job's validation and the coverage requests do.
        for target in targets:
            problem = backend_target_problem(options.backend, model, target)
            if problem is not None:
                raise OptionError(
                    "backend", f"{options.backend} cannot measure {target_key(target)}: {problem}"
                )
    try:
        plans = [plan_target(request, target, default_components(target)) for target in targets]
    except KernelStepsError as exc:
        raise OptionError("kernel_steps", str(exc)) from exc
    except ValueError as exc:
        raise OptionError(NON_FIELD, str(exc)) from exc
    return request, plans


def command_line(argv: Sequence[str]) -> str:
    return shlex.join(["python", "-m", "acquisition", *argv])


def default_components(target: MoeTarget) -> tuple[str, ...]:
    """The modular component set (R22, R23), until an admitted adapter names its own."""
    if target.dp > 1:
        return ("gate_routing", EXPERTS, "finalize_copy")
    return ("gate_routing", EXPERTS)


# The rule `auto` and `on` plan: v4, measured on the H200 (bundles/H200-vllm-modular-f2k4 and
# H200-vllm-live-f2k4, docs/benchmarks.md "Rule v4"): the v2/v3 tables mis-answer v4's new A-side
# points by a median 4-5 %, p95 20-22 %, max 31-32 %
# (docs/evidence/h200-kernel-steps/kernel_step_holdout_v4.txt), while v4's own segment-aware
# leave-one-out between bends has p95 2.7 % (kernel_step_loo_v4.md there). `v2` (the previous
# default, which the f2k tables were planned with) and `v3` stay explicit choices.
DEFAULT_KERNEL_STEPS_RULE = KERNEL_STEPS_RULE_V4
_KERNEL_STEPS_RULES = {
    "auto": DEFAULT_KERNEL_STEPS_RULE,
    "on": DEFAULT_KERNEL_STEPS_RULE,
    "v2": KERNEL_STEPS_RULE,
    "v3": KERNEL_STEPS_RULE_V3,
    "v4": KERNEL_STEPS_RULE_V4,
}

# Backends whose experts run vLLM's TritonExperts (auto selects only these, `select_backend`).
_TRITON_BACKENDS = ("auto", "vllm-modular", "vllm-live")


def kernel_steps_for(request: AcquisitionRequest, geometry: ExpertGeometry) -> KernelSteps | None:
    """The kernel-step rule of a target (issue 20), or None where it is off.

    ``auto`` and ``on`` plan `DEFAULT_KERNEL_STEPS_RULE` (v4); ``v2``, ``v3``, ``v4`` name a rule.
    ``auto``: on for the vLLM backends where the kernel's configuration is modelled (H200,
    bf16/fp16 and block FP8), off elsewhere; ``on`` raises `KernelStepsError` where it is not
    modelled. The model's quantization decides the config file (``dtype=fp8_w8a8,
    block_shape=[128,128]``), not the activations' dtype.
    """
    if request.kernel_steps == "off":
        return None
    if request.kernel_steps == "auto" and request.backend not in _TRITON_BACKENDS:
        return None
    rule = _KERNEL_STEPS_RULES.get(request.kernel_steps)
    if rule is None:
        known = ", ".join(_KERNEL_STEPS_RULES)
        raise KernelStepsError(f"kernel steps {request.kernel_steps!r} is not off, {known}")
    try:
        return KernelSteps.for_target(
            rule=rule,
            hardware=request.hardware,
            dtype=request.dtype,
            local_experts=geometry.local_experts,
            global_experts=geometry.global_experts,
            top_k=geometry.top_k,
            width=request.model.expert_intermediate_size,
            quantization=request.model.quantization,
            weight_block=request.model.weight_block_size,
        )
    except KernelStepsError:
        if request.kernel_steps in ("on", "v2", "v3", "v4"):
            raise
        return None


def plan_target(
    request: AcquisitionRequest, target: MoeTarget, components: Sequence[str]
) -> PointPlan:
    model = request.model
    geometry = ExpertGeometry.for_target(model.global_experts, model.top_k, target)
    return build_plan(
        target,
        geometry,
        components,
        max_num_batched_tokens=request.max_num_batched_tokens,
        max_num_seqs=request.max_num_seqs,
        factor=request.grid_factor,
        mode=request.cudagraph_mode,
        captures=request.captures,
        kernel=kernel_steps_for(request, geometry),
    )


def target_key(target: MoeTarget) -> str:
    """A target's name on a command line (``--only-target``), e.g. ``tp1/dp8_ep8_rank7_sp0``."""
    return f"tp{target.tp}/{target.deployment}"
