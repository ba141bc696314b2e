"""Fakes that mimic the shapes of vLLM's MoE APIs, on CPU, for the vLLM adapter tests.

They copy the *interfaces* the adapters call (class hierarchy, keyword parameters, return
tuples, properties) with plain PyTorch arithmetic behind them, so the adapters' wiring,
admission and checks run without vLLM and without a GPU. ``LAUNCHES`` stands in for device
activity: every fake "kernel" appends its name, and ``activities(fn)`` returns what ``fn``
launched, as the CUDA profiler does on the GPU host.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

LAUNCHES: list[str] = []
# The fake trace being recorded (``fake_trace``) and the stream a fake kernel runs on.
TRACERS: list[FakeTrace] = []
MAIN_STREAM, SIDE_STREAM = 7, 8
STREAMS: list[int] = []
# Fake device time of one launch, in ns, by kernel name (10 ns for any other).
DURATIONS_NS = {"gemm": 300, "topk_softmax": 50, "fused_moe_kernel": 2000, "copy": 70}


# A Triton kernel stand-in the fake experts launch through, when a test installs one.
JIT_KERNELS: list[FakeJit] = []


class FakeAsyncCompileMode:
    """Triton's ``AsyncCompileMode`` (3.4+) in miniature: compiles submitted to an executor,
    each finalised into its kernel's cache when the mode exits."""

    active: ClassVar[FakeAsyncCompileMode | None] = None

    def __init__(self, executor: Any) -> None:
        self.executor = executor
        self.futures: dict[str, tuple[Any, Callable[[Any], None]]] = {}

    def submit(
        self, key: str, compile_fn: Callable[[], Any], finalize: Callable[[Any], None]
    ) -> Any:
        if key not in self.futures:
            self.futures[key] = (self.executor.submit(compile_fn), finalize)
        return self.futures[key][0]

    def __enter__(self) -> FakeAsyncCompileMode:
        if FakeAsyncCompileMode.active is not None:
            raise RuntimeError("Another AsyncCompileMode is already active")
        FakeAsyncCompileMode.active = self
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for future, finalize in self.futures.values():
                finalize(future.result())
        finally:
            FakeAsyncCompileMode.active = None


class FakeJit:
    """A Triton ``JITFunction`` stand-in: ``kernel[grid](...)`` compiles a key once (in the
    active async mode's pool if any), then launches ``fused_moe_kernel``; ``run(...,
    warmup=True)`` compiles without launching. ``compiles`` keeps (key, warmup, thread)."""

    def __init__(self, compile_wait: Callable[[], None] | None = None) -> None:
        self.device_caches: dict[int, tuple[dict[str, Any], None]] = {0: ({}, None)}
        self.compiles: list[tuple[str, bool, int]] = []
        self.launched: list[str] = []
        # ("compile" | "precompile" | "launch", key) in the order they happened.
        self.events: list[tuple[str, str]] = []
        self.compile_wait = compile_wait
        self._lock = threading.Lock()

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        key = f"{args}{sorted(kwargs.items())}"
        cache = self.device_caches[0][0]
        kernel = cache.get(key)
        if kernel is None:

            def compile_fn() -> str:
                if self.compile_wait is not None:
                    self.compile_wait()
                with self._lock:
                    self.compiles.append((key, warmup, threading.get_ident()))
                    self.events.append(("compile" if not warmup else "precompile", key))
                return key

            mode = FakeAsyncCompileMode.active
            if mode is not None:
                kernel = mode.submit(key, compile_fn, lambda k: cache.__setitem__(key, k))
            else:
                kernel = cache[key] = compile_fn()
        if not warmup:
            if hasattr(kernel, "result"):
                kernel = kernel.result()
            launch("fused_moe_kernel")
            self.launched.append(key)
            self.events.append(("launch", key))
        return kernel


def launch(name: str) -> None:
    LAUNCHES.append(name)
    if TRACERS:
        TRACERS[-1].launch(name, STREAMS[-1] if STREAMS else MAIN_STREAM)


class FakeTrace:
    """What ``vllm_ownership.trace`` hands back, built from the fake kernels' launches.

    A logical clock stands in for time: each range edge and each launch advances it, so
    launches fall strictly inside the ranges open around them, as on the GPU host.
    """

    def __init__(self) -> None:
        from acquisition.protocol.attribution import ProfiledWindow

        self.clock = 0
        self.window = ProfiledWindow()

    def _tick(self) -> int:
        self.clock += 10
        return self.clock

    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        from acquisition.protocol.attribution import TimedRange

        start = self._tick()
        try:
            yield
        finally:
            self.window.ranges.append(TimedRange(name, 1, start, self._tick()))

    def launch(self, name: str, stream: int) -> None:
        from acquisition.protocol.attribution import DeviceActivity, HostCall

        at = self._tick()
        correlation = len(self.window.launches) + 1
        self.window.launches.append(HostCall("cudaLaunchKernel", 1, at, at + 1, correlation))
        self.window.activities.append(
            DeviceActivity(name, 10_000 + at, DURATIONS_NS.get(name, 10), correlation, stream)
        )


def fake_trace(fn: Callable[[Any], Any]) -> Any:
    """``vllm_ownership.trace`` on CPU: run ``fn(capture)`` and return the recorded window."""
    tracer = FakeTrace()
    TRACERS.append(tracer)
    try:
        fn(tracer)
    finally:
        TRACERS.pop()
    return tracer.window


# The name the conservation tests use for the same stand-in.
trace = fake_trace


def activities(fn: Callable[[], Any]) -> list[str]:
    LAUNCHES.clear()
    fn()
    names = list(LAUNCHES)
    LAUNCHES.clear()
    return names


class MoEActivation(enum.Enum):
    SILU = "silu"
    RELU2_NO_MUL = "relu2_no_mul"

    @classmethod
    def from_str(cls, s: str) -> MoEActivation:
        for member in cls:
            if member.value == s:
                return member
        raise ValueError(f"Unknown MoE activation: {s!r}")

    @property
    def is_gated(self) -> bool:
        return self is MoEActivation.SILU


class FusedMoEActivationFormat(enum.Enum):
    Standard = ("standard",)
    BatchedExperts = ("batched_experts",)


@dataclass
class FusedMoEParallelConfig:
    tp_size: int
    pcp_size: int
    dp_size: int
    ep_size: int
    tp_rank: int
    pcp_rank: int
    dp_rank: int
    ep_rank: int
    sp_size: int
    use_ep: bool
    all2all_backend: str
    enable_eplb: bool

    @property
    def is_sequence_parallel(self) -> bool:
        return self.sp_size > 1

    @property
    def use_all2all_kernels(self) -> bool:
        return self.use_ep and (self.dp_size > 1 or self.is_sequence_parallel)

    @property
    def use_ag_rs_all2all_kernels(self) -> bool:
        return self.use_all2all_kernels and self.all2all_backend == "allgather_reducescatter"


class FusedMoEConfig:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)
        self.router_logits_dtype = kwargs["in_dtype"]
        self.hidden_dim_unpadded = kwargs["hidden_dim"]
        self.intermediate_size_per_partition = kwargs["intermediate_size"]
        self.intermediate_pad = None
        self.has_bias = False
        self.is_lora_enabled = False

    def __getattr__(self, name: str) -> Any:
        parallel = self.__dict__.get("moe_parallel_config")
        if parallel is not None and hasattr(parallel, name):
            return getattr(parallel, name)
        raise AttributeError(name)


class TopKWeightAndReduceNoOP:
    def apply(
        self,
        output: Any,
        fused_expert_output: Any,
        topk_weights: Any,
        topk_ids: Any,
        apply_router_weight_on_input: bool,
    ) -> Any:
        if output is None or output is fused_expert_output:
            return fused_expert_output
        launch("copy")
        output.copy_(fused_expert_output)
        return output


class TopKWeightAndReduceContiguous:
    """Weights and sums the (M, topk, K) expert output: more work than the no-op."""

    def apply(
        self,
        output: Any,
        fused_expert_output: Any,
        topk_weights: Any,
        topk_ids: Any,
        apply_router_weight_on_input: bool,
    ) -> Any:
        launch("moe_sum")
        return fused_expert_output


class FusedMoEPrepareAndFinalizeModular:
    activation_format = FusedMoEActivationFormat.Standard

    def topk_indices_dtype(self) -> Any:
        return None

    def prepare(
        self,
        a1: Any,
        topk_weights: Any,
        topk_ids: Any,
        num_experts: int,
        expert_map: Any,
        apply_router_weight_on_input: bool,
        quant_config: Any,
        defer_input_quant: bool = False,
    ) -> tuple[Any, ...]:
        a1q, a1q_scale = self.quantize(a1, quant_config)
        return a1q, a1q_scale, None, None, None

    def quantize(self, a1: Any, quant_config: Any) -> tuple[Any, Any]:
        """The activations and their scales as the experts read them (quantizing fakes override)."""
        return a1, None

    def finalize(
        self,
        output: Any,
        fused_expert_output: Any,
        topk_weights: Any,
        topk_ids: Any,
        apply_router_weight_on_input: bool,
        weight_and_reduce_impl: Any,
    ) -> None:
        weight_and_reduce_impl.apply(
            output=output,
            fused_expert_output=fused_expert_output,
            topk_weights=topk_weights,
            topk_ids=topk_ids,
            apply_router_weight_on_input=apply_router_weight_on_input,
        )


class NoDPEP(FusedMoEPrepareAndFinalizeModular):
    pass


class NaiveDPEP(FusedMoEPrepareAndFinalizeModular):
    def __init__(self, is_sequence_parallel: bool = False, num_dispatchers: int = 1) -> None:
        self.is_sequence_parallel = is_sequence_parallel
        self.num_dispatchers = num_dispatchers


class QuantizingPrepare(NoDPEP):
    """A prepare that quantizes: a new tensor and scales, and device work."""

    def prepare(self, a1: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        launch("quantize")
        return a1.clone(), torch.ones(1), None, None, None


class CopyingPrepare(NoDPEP):
    """A prepare that keeps the values but returns a copy (alias identity lost)."""

    def prepare(self, a1: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return a1.clone(), None, None, None, None


class LaunchingPrepare(NoDPEP):
    """Returns the input itself but launches a kernel on the way."""

    def prepare(self, a1: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        launch("sync_kernel")
        return a1, None, None, None, None


def make_moe_prepare_and_finalize_no_dp_ep(use_monolithic: bool) -> Any:
    return PREPARE_CLASSES["no_dp_ep"]()


def make_moe_prepare_and_finalize_naive_dp_ep(
    use_monolithic: bool, is_sequence_parallel: bool = False, num_dispatchers: int = 1
) -> Any:
    return PREPARE_CLASSES["naive_dp_ep"](
        is_sequence_parallel=is_sequence_parallel, num_dispatchers=num_dispatchers
    )


PREPARE_CLASSES: dict[str, type] = {"no_dp_ep": NoDPEP, "naive_dp_ep": NaiveDPEP}


class FusedMoEExpertsModular:
    def __init__(self, moe_config: Any, quant_config: Any) -> None:
        self.moe_config = moe_config
        self.quant_config = quant_config

    @staticmethod
    def activation_format() -> FusedMoEActivationFormat:
        return FusedMoEActivationFormat.Standard

    @property
    def expects_unquantized_inputs(self) -> bool:
        return False

    @property
    def a2_scale(self) -> Any:
        return None

    def moe_problem_size(self, a1: Any, w1: Any, w2: Any, topk_ids: Any) -> tuple[int, ...]:
        return w1.shape[0], a1.shape[0], w1.shape[1], a1.shape[1], topk_ids.shape[1]

    def finalize_weight_and_reduce_impl(self) -> Any:
        return TopKWeightAndReduceNoOP()

    def apply(
        self,
        output: Any,
        hidden_states: Any,
        w1: Any,
        w2: Any,
        topk_weights: Any,
        topk_ids: Any,
        activation: Any,
        global_num_experts: int,
        expert_map: Any,
        a1q_scale: Any,
        a2_scale: Any,
        workspace13: Any,
        workspace2: Any,
        expert_tokens_meta: Any,
        apply_router_weight_on_input: bool,
    ) -> None:
        self.compute(output, hidden_states, w1, w2, topk_weights, topk_ids, expert_map, a1q_scale)

    def compute(
        self,
        output: Any,
        hidden_states: Any,
        w1: Any,
        w2: Any,
        topk_weights: Any,
        topk_ids: Any,
        expert_map: Any,
        a1q_scale: Any,
    ) -> None:
        """The experts' arithmetic behind ``apply`` (quantized fakes override it)."""
        if JIT_KERNELS:
            # As vLLM's invoke_fused_moe_triton_kernel: a configuration from the rows, and
            # Triton's integer specialisation (divisible by 16) of the rows it is given.
            rows = int(hidden_states.shape[0])
            block_m = 16 if rows <= 2 else 64
            JIT_KERNELS[-1][(rows,)](rows % 16 == 0, BLOCK_SIZE_M=block_m)
        else:
            launch("fused_moe_kernel")
        moe_reference(output, hidden_states, w1, w2, topk_weights, topk_ids, expert_map)


class TritonExperts(FusedMoEExpertsModular):
    pass


class ContiguousExperts(FusedMoEExpertsModular):
    def finalize_weight_and_reduce_impl(self) -> Any:
        return TopKWeightAndReduceContiguous()


class BatchedExperts(FusedMoEExpertsModular):
    @staticmethod
    def activation_format() -> FusedMoEActivationFormat:
        return FusedMoEActivationFormat.BatchedExperts


class MonolithicExperts:
    @staticmethod
    def activation_format() -> FusedMoEActivationFormat:
        return FusedMoEActivationFormat.Standard


def moe_reference(
    output: Any,
    hidden: Any,
    w1: Any,
    w2: Any,
    topk_weights: Any,
    topk_ids: Any,
    expert_map: Any,
) -> Any:
    """A plain MoE: SiLU-and-mul experts, weighted sum over the top-k (remote ones skipped)."""
    ids = topk_ids.long()
    local = expert_map.long()[ids] if expert_map is not None else ids
    width = w2.shape[2]
    output.zero_()
    for slot in range(ids.shape[1]):
        for expert in torch.unique(local[:, slot]).tolist():
            if expert < 0:
                continue
            rows = (local[:, slot] == expert).nonzero().squeeze(1)
            up = hidden[rows] @ w1[expert].t()
            act = torch.nn.functional.silu(up[:, :width]) * up[:, width:]
            out = act @ w2[expert].t()
            weights = topk_weights[rows, slot].to(out.dtype).unsqueeze(1)
            output.index_add_(0, rows, out * weights)
    return output


class _Impl:
    def _allocate_buffers(
        self,
        out_dtype: Any,
        device: Any,
        m_chunk: int,
        m_full: int,
        n: int,
        k: int,
        top_k: int,
        global_num_experts: int,
        local_num_experts: int,
        expert_tokens_meta: Any,
        activation: Any,
    ) -> tuple[Any, Any, Any]:
        ws = torch.empty(m_full * top_k * max(n, k), dtype=out_dtype, device=device)
        return ws, torch.empty_like(ws), ws[: m_full * k].view(m_full, k)


class FusedMoEKernel:
    def __init__(self, prepare_finalize: Any, fused_experts: Any) -> None:
        self.prepare_finalize = prepare_finalize
        self.fused_experts = fused_experts
        self.impl = _Impl()
        self.is_monolithic = False

    def apply(
        self,
        hidden_states: Any,
        w1: Any,
        w2: Any,
        topk_weights: Any,
        topk_ids: Any,
        activation: Any,
        global_num_experts: int,
        expert_map: Any,
        apply_router_weight_on_input: bool,
        shared_experts: Any = None,
        shared_experts_input: Any = None,
    ) -> Any:
        a1q, a1q_scale = self.prepare_input(
            hidden_states,
            topk_weights,
            topk_ids,
            global_num_experts,
            expert_map,
            apply_router_weight_on_input,
        )
        output = torch.empty_like(hidden_states)
        fused_out = torch.empty_like(hidden_states)
        self.fused_experts.apply(
            output=fused_out,
            hidden_states=a1q,
            w1=w1,
            w2=w2,
            topk_weights=topk_weights,
            topk_ids=topk_ids,
            activation=activation,
            global_num_experts=global_num_experts,
            expert_map=expert_map,
            a1q_scale=a1q_scale,
            a2_scale=None,
            workspace13=None,
            workspace2=None,
            expert_tokens_meta=None,
            apply_router_weight_on_input=apply_router_weight_on_input,
        )
        self.prepare_finalize.finalize(
            output,
            fused_out,
            topk_weights,
            topk_ids,
            apply_router_weight_on_input,
            self.fused_experts.finalize_weight_and_reduce_impl(),
        )
        return output

    def prepare_input(
        self,
        hidden_states: Any,
        topk_weights: Any,
        topk_ids: Any,
        global_num_experts: int,
        expert_map: Any,
        apply_router_weight_on_input: bool,
    ) -> tuple[Any, Any]:
        """The experts' input and its scales: the unquantized kernel skips the prepare."""
        return hidden_states, None


class FusedTopKRouter:
    def __init__(self, top_k: int, global_num_experts: int, renormalize: bool = True) -> None:
        self.top_k = top_k
        self.global_num_experts = global_num_experts
        self.renormalize = renormalize
        self.routed_scaling_factor = 1.0
        self.routing_method_type = "Renormalize"

    def select_experts(
        self,
        hidden_states: Any,
        router_logits: Any,
        topk_indices_dtype: Any = None,
        *,
        input_ids: Any = None,
    ) -> tuple[Any, Any]:
        weights, ids = self._choose(torch.softmax(router_logits.float(), dim=-1))
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.routed_scaling_factor, ids.to(topk_indices_dtype or torch.int32)

    def _choose(self, scores: Any) -> tuple[Any, Any]:
        launch("topk_softmax")
        return tuple(torch.topk(scores, self.top_k, dim=-1))


class GroupedTopKRouter(FusedTopKRouter):
    """vLLM's grouped router: group scores, the kept groups masked in, then a top-k; the
    unfused path launches several small kernels where the fused top-k launches one."""

    def __init__(
        self,
        top_k: int,
        global_num_experts: int,
        renormalize: bool,
        num_expert_group: int,
        topk_group: int,
        routed_scaling_factor: float,
        e_score_correction_bias: Any,
    ) -> None:
        super().__init__(top_k, global_num_experts, renormalize)
        self.num_expert_group = num_expert_group
        self.topk_group = topk_group
        self.routed_scaling_factor = routed_scaling_factor
        self.e_score_correction_bias = e_score_correction_bias
        self.routing_method_type = "DeepSeekV3"

    def _choose(self, scores: Any) -> tuple[Any, Any]:
        for kernel in ("softmax", "group_max", "group_topk", "masked_fill", "topk"):
            launch(kernel)
        groups = scores.view(scores.shape[0], self.num_expert_group, -1)
        kept = torch.topk(groups.amax(dim=-1), self.topk_group, dim=-1).indices
        mask = torch.zeros_like(groups[..., 0]).scatter_(1, kept, 1.0)
        return tuple(torch.topk((groups * mask.unsqueeze(-1)).view_as(scores), self.top_k, dim=-1))


ROUTER_CALLS: list[dict[str, Any]] = []


def create_fused_moe_router(
    top_k: int,
    global_num_experts: int,
    renormalize: bool = True,
    use_grouped_topk: bool = False,
    num_expert_group: int | None = None,
    topk_group: int | None = None,
    scoring_func: str = "softmax",
    routed_scaling_factor: float = 1.0,
    e_score_correction_bias: Any = None,
) -> Any:
    ROUTER_CALLS.append(
        {
            "use_grouped_topk": use_grouped_topk,
            "num_expert_group": num_expert_group,
            "topk_group": topk_group,
            "routed_scaling_factor": routed_scaling_factor,
            "e_score_correction_bias": e_score_correction_bias,
        }
    )
    if use_grouped_topk:
        # vLLM's factory raises the same where the groups are missing.
        if num_expert_group is None or topk_group is None:
            raise ValueError("num_expert_group and topk_group must be provided")
        return GroupedTopKRouter(
            top_k,
            global_num_experts,
            renormalize,
            num_expert_group,
            topk_group,
            routed_scaling_factor,
            e_score_correction_bias,
        )
    return FusedTopKRouter(top_k, global_num_experts, renormalize)


class ReplicatedLinear(torch.nn.Module):
    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        params_dtype: Any = None,
        quant_config: Any = None,
        prefix: str = "",
        *,
        return_bias: bool = True,
        disable_tp: bool = False,
    ) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(
            torch.empty(output_size, input_size, dtype=params_dtype), requires_grad=False
        )
        self.return_bias = return_bias
        self.quant_method = None

    def forward(self, x: Any) -> Any:
        launch("gemm")
        out = torch.nn.functional.linear(x, self.weight)
        return out if not self.return_bias else (out, None)


class UnquantizedLinearMethod:
    def apply(self, layer: Any, x: Any, bias: Any = None) -> Any:
        launch("gemm")
        return torch.nn.functional.linear(x, layer.weight, bias)


def determine_expert_map(ep_size: int, ep_rank: int, global_num_experts: int) -> tuple:
    if ep_size == 1:
        return global_num_experts, None, None
    base, remainder = divmod(global_num_experts, ep_size)
    local = base + (1 if ep_rank < remainder else 0)
    start = ep_rank * base + min(ep_rank, remainder)
    mapping = torch.full((global_num_experts,), -1, dtype=torch.int32)
    mapping[start : start + local] = torch.arange(local, dtype=torch.int32)
    return local, mapping, None


@dataclass
class _ParallelDefaults:
    all2all_backend: str = "allgather_reducescatter"


class VllmConfig:
    def __init__(self) -> None:
        self.parallel_config = _ParallelDefaults()


@contextlib.contextmanager
def set_current_vllm_config(config: Any) -> Iterator[None]:
    yield


_WORKSPACE: dict[str, Any] = {}


def modular_namespace(**overrides: Any) -> dict[str, Any]:
    """Objects by the dotted names of ``MODULAR_SYMBOLS`` (and ``vllm`` itself)."""
    fm = "vllm.model_executor.layers.fused_moe"
    namespace: dict[str, Any] = {
        "vllm": object(),
        f"{fm}.modular_kernel:FusedMoEKernel": FusedMoEKernel,
        f"{fm}.modular_kernel:FusedMoEPrepareAndFinalizeModular": FusedMoEPrepareAndFinalizeModular,
        f"{fm}.modular_kernel:FusedMoEExpertsModular": FusedMoEExpertsModular,
        f"{fm}.modular_kernel:FusedMoEActivationFormat": FusedMoEActivationFormat,
        f"{fm}.prepare_finalize.no_dp_ep:make_moe_prepare_and_finalize_no_dp_ep": (
            make_moe_prepare_and_finalize_no_dp_ep
        ),
        f"{fm}.prepare_finalize.naive_dp_ep:make_moe_prepare_and_finalize_naive_dp_ep": (
            make_moe_prepare_and_finalize_naive_dp_ep
        ),
        f"{fm}.topk_weight_and_reduce:TopKWeightAndReduceNoOP": TopKWeightAndReduceNoOP,
        f"{fm}.expert_map_manager:determine_expert_map": determine_expert_map,
        f"{fm}.oracle.unquantized:select_unquantized_moe_backend": lambda cfg: (
            "TRITON",
            TritonExperts,
        ),
        f"{fm}.oracle.unquantized:convert_to_unquantized_kernel_format": (
            lambda backend, cfg, w13, w2: (w13.contiguous(), w2.contiguous())
        ),
        f"{fm}.config:FusedMoEConfig": FusedMoEConfig,
        f"{fm}.config:FusedMoEParallelConfig": FusedMoEParallelConfig,
        f"{fm}.config:FUSED_MOE_UNQUANTIZED_CONFIG": object(),
        f"{fm}.activation:MoEActivation": MoEActivation,
        f"{fm}.router.router_factory:create_fused_moe_router": create_fused_moe_router,
        "vllm.model_executor.layers.linear:UnquantizedLinearMethod": UnquantizedLinearMethod,
        "vllm.v1.worker.workspace:init_workspace_manager": lambda device: _WORKSPACE.update(
            device=device
        ),
        "vllm.v1.worker.workspace:is_workspace_manager_initialized": lambda: "device" in _WORKSPACE,
        "vllm.config:VllmConfig": VllmConfig,
        "vllm.config:set_current_vllm_config": set_current_vllm_config,
        "vllm:LLM": None,
        "vllm.forward_context:set_forward_context": None,
    }
    namespace.update(overrides)
    return namespace


def resolver(namespace: dict[str, Any]) -> Callable[[str], Any]:
    def resolve(dotted: str) -> Any:
        if dotted not in namespace:
            raise AttributeError(dotted)
        value = namespace[dotted]
        if isinstance(value, ImportError):
            raise value
        return value

    return resolve


# -- a fake in-process engine for the live adapter -----------------------------------------


class UnquantizedMethod:
    """The quant method of an unquantized layer: holds the modular kernel."""

    def __init__(self, kernel: Any) -> None:
        self.moe_kernel = kernel
        self.unquantized_backend = "TRITON"

    @property
    def is_monolithic(self) -> bool:
        return self.moe_kernel.is_monolithic

    @property
    def topk_indices_dtype(self) -> Any:
        return self.moe_kernel.prepare_finalize.topk_indices_dtype()

    def apply(
        self,
        layer: Any,
        x: Any,
        topk_weights: Any,
        topk_ids: Any,
        shared_experts: Any,
        shared_experts_input: Any,
    ) -> Any:
        return self.moe_kernel.apply(
            hidden_states=x,
            w1=layer.w13_weight,
            w2=layer.w2_weight,
            topk_weights=topk_weights,
            topk_ids=topk_ids,
            activation=layer.activation,
            global_num_experts=layer.global_num_experts,
            expert_map=layer.expert_map,
            apply_router_weight_on_input=layer.apply_router_weight_on_input,
        )


class RoutedExperts(torch.nn.Module):
    def __init__(self, experts: int, hidden: int, width: int, kernel: Any) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(7)
        self.w13_weight = torch.nn.Parameter(
            torch.randn(experts, 2 * width, hidden, generator=generator) / hidden**0.5,
            requires_grad=False,
        )
        self.w2_weight = torch.nn.Parameter(
            torch.randn(experts, hidden, width, generator=generator) / width**0.5,
            requires_grad=False,
        )
        self.quant_method = UnquantizedMethod(kernel)
        self.activation = MoEActivation.SILU
        self.global_num_experts = experts
        self.expert_map = None
        self.apply_router_weight_on_input = False

    def forward_modular(
        self,
        x: Any,
        topk_weights: Any,
        topk_ids: Any,
        shared_experts: Any = None,
        shared_experts_input: Any = None,
    ) -> Any:
        return self.quant_method.apply(
            self, x, topk_weights, topk_ids, shared_experts, shared_experts_input
        )


class MoERunner(torch.nn.Module):
    def __init__(self, experts: int, top_k: int, hidden: int, width: int) -> None:
        super().__init__()
        parallel = FusedMoEParallelConfig(1, 1, 1, 1, 0, 0, 0, 0, 1, False, "x", False)
        self.moe_config = FusedMoEConfig(
            num_experts=experts,
            experts_per_token=top_k,
            hidden_dim=hidden,
            intermediate_size=width,
            in_dtype=torch.float32,
            moe_parallel_config=parallel,
        )
        self.router = FusedTopKRouter(top_k, experts)
        self.gate = ReplicatedLinear(hidden, experts, bias=False, params_dtype=torch.float32)
        with torch.no_grad():
            self.gate.weight.copy_(
                torch.randn(experts, hidden, generator=torch.Generator().manual_seed(3))
            )
        kernel = FusedMoEKernel(NoDPEP(), TritonExperts(self.moe_config, object()))
        self.routed_experts = RoutedExperts(experts, hidden, width, kernel)
        self.eplb_state = None
        self._fse_fuse_gate = False

    def forward(self, hidden: Any) -> Any:
        assert CONTEXT, "the MoE forward needs a forward context"
        logits, _ = self.gate(hidden)
        weights, ids = self.router.select_experts(hidden_states=hidden, router_logits=logits)
        return self.routed_experts.forward_modular(x=hidden, topk_weights=weights, topk_ids=ids)


class SparseMoeBlock(torch.nn.Module):
    """The parent block: its own work is a scale of the routed output (the wrapper)."""

    def __init__(self, runner: MoERunner) -> None:
        super().__init__()
        self.experts = runner

    def forward(self, hidden: Any) -> Any:
        out = self.experts(hidden)
        launch("wrapper_scale")
        return out * 0.5


class SharedExpertMLP(torch.nn.Module):
    """Qwen2MoeMLP with its expert gate: SiLU-and-mul MLP, scaled by sigmoid(gate(x))."""

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(11)
        self.gate_up_proj = torch.nn.Parameter(
            torch.randn(2 * width, hidden, generator=generator) / hidden**0.5,
            requires_grad=False,
        )
        self.down_proj = torch.nn.Parameter(
            torch.randn(hidden, width, generator=generator) / width**0.5, requires_grad=False
        )
        self.expert_gate = ReplicatedLinear(hidden, 1, bias=False, params_dtype=torch.float32)
        with torch.no_grad():
            self.expert_gate.weight.copy_(torch.randn(1, hidden, generator=generator))
        self.width = width

    def forward(self, x: Any) -> Any:
        launch("shared_gate_up")
        up = x @ self.gate_up_proj.t()
        launch("shared_act_and_mul")
        act = torch.nn.functional.silu(up[:, : self.width]) * up[:, self.width :]
        launch("shared_down")
        out = act @ self.down_proj.t()
        gate, _ = self.expert_gate(x)
        launch("sigmoid_mul")
        return torch.sigmoid(gate) * out


class SharedExpertRunner(MoERunner):
    """vLLM 0.26.0's MoERunner with shared experts: the gate lives on the parent block; the
    shared expert runs before the router (large batches) or after the routed kernel on a
    side stream (up to ``side_stream_tokens``), and its output is added to the routed one."""

    side_stream_tokens = 8

    def __init__(self, shared: SharedExpertMLP, *args: Any) -> None:
        super().__init__(*args)
        del self.gate
        self.gate = None
        self._shared_layer = shared

    def forward(self, hidden: Any, router_logits: Any) -> Any:  # type: ignore[override]
        assert CONTEXT, "the MoE forward needs a forward context"
        side = hidden.shape[0] <= self.side_stream_tokens
        shared = None if side else self._shared_layer(hidden)
        weights, ids = self.router.select_experts(hidden_states=hidden, router_logits=router_logits)
        fused = self.routed_experts.forward_modular(
            x=hidden, topk_weights=weights, topk_ids=ids, shared_experts=None
        )
        if side:
            STREAMS.append(SIDE_STREAM)
            try:
                shared = self._shared_layer(hidden)
            finally:
                STREAMS.pop()
        launch("add")
        return shared + fused


class Qwen2MoeBlock(torch.nn.Module):
    """Qwen2MoeSparseMoeBlock's shape: router gate, shared expert (with its own gate) and the
    runner that executes both the shared and the routed experts."""

    def __init__(
        self, experts: int = 4, top_k: int = 2, hidden: int = 16, width: int = 8, shared: int = 12
    ) -> None:
        super().__init__()
        self.gate = ReplicatedLinear(hidden, experts, bias=False, params_dtype=torch.float32)
        with torch.no_grad():
            self.gate.weight.copy_(
                torch.randn(experts, hidden, generator=torch.Generator().manual_seed(3))
            )
        self.shared_expert = SharedExpertMLP(hidden, shared)
        self.shared_expert_gate = self.shared_expert.expert_gate
        self.experts = SharedExpertRunner(self.shared_expert, experts, top_k, hidden, width)

    def forward(self, hidden: Any) -> Any:
        logits, _ = self.gate(hidden)
        return self.experts(hidden, logits)


class Layer(torch.nn.Module):
    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.mlp = block


class TinyModel(torch.nn.Module):
    def __init__(self, experts: int = 4, top_k: int = 2, hidden: int = 16, width: int = 8):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [Layer(SparseMoeBlock(MoERunner(experts, top_k, hidden, width)))]
        )


class TinyQwen2MoeModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer(Qwen2MoeBlock())])


CONTEXT: list[Any] = []


@contextlib.contextmanager
def set_forward_context(attn_metadata: Any, vllm_config: Any, num_tokens: int | None = None):
    CONTEXT.append(num_tokens)
    try:
        yield
    finally:
        CONTEXT.pop()


class _LlmEngine:
    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.vllm_config = _EngineConfig(kwargs)


class _EngineConfig:
    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.scheduler_config = type(
            "S",
            (),
            {
                "max_num_batched_tokens": kwargs["max_num_batched_tokens"],
                "max_num_seqs": kwargs["max_num_seqs"],
            },
        )()
        self.model_config = type(
            "M",
            (),
            {
                # vLLM derives 2,048 where neither the arguments nor the config say
                "max_model_len": kwargs.get("max_model_len", 2048),
                "enforce_eager": True,
                "dtype": torch.float32,
            },
        )()


class FakeLLM:
    """``vllm.LLM`` as the live adapter uses it: constructed with engine arguments,
    ``apply_model`` running a function on the in-process model."""

    created: ClassVar[list[dict[str, Any]]] = []
    # The model the engine builds; tests of other block shapes replace it.
    model_class: ClassVar[Callable[[], torch.nn.Module]] = TinyModel

    def __init__(self, **kwargs: Any) -> None:
        FakeLLM.created.append(kwargs)
        self.llm_engine = _LlmEngine(kwargs)
        self.model = type(self).model_class()

    def apply_model(self, func: Callable[[Any], Any]) -> list[Any]:
        return [func(self.model)]


def live_namespace(**overrides: Any) -> dict[str, Any]:
    namespace = modular_namespace()
    namespace["vllm:LLM"] = FakeLLM
    namespace["vllm.forward_context:set_forward_context"] = set_forward_context
    namespace.update(overrides)
    return namespace


def fake_runtime(device: str = "cpu", available: bool = False, limits: Any = None) -> Any:
    """The RuntimeInfo of a machine without vLLM or a GPU, as the adapters' tests see it."""
    from acquisition.adapters.base import RuntimeInfo

    return RuntimeInfo(
        device=device,
        device_name="fake",
        accelerator_available=available,
        torch_version=str(torch.__version__),
        cuda_version=None,
        capability=None,
        cache_bytes=1 << 16,
        cache_source="test",
        total_memory=None,
        uuid=None,
        host="test",
        limits=limits,
    )
