"""``python -m acquisition routing MODEL --prompts FILE [--max-tokens T] [engine options]``.

Exit status: 0 profile written, 1 capture failed (checkpoints kept), 2 invalid command,
130 stopped (checkpoints kept; the same command resumes).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from acquisition.progress import ProgressReporter
from acquisition.routing_capture.engines import PromptError, RoutingEngine, read_prompts

__all__ = ["build_parser", "capture_options", "main"]

ROUTERS = ("native", "normal_routing", "uniform_random")
# What a resumed capture must share with its checkpoints besides the prompts, batches and
# max_tokens: every option that changes the weights, the numbers or the router the engine
# runs, or how the scheduler cuts steps (chunked prefill). Left out on purpose: where the
# profile goes, progress output, and the memory fraction (it changes neither).
_IDENTITY = {
    "torch": ("engine", "model_name", "zipf_s", "layers", "seed"),
    "vllm": (
        "engine",
        "model_name",
        "router",
        "seed",
        "load_format",
        "dtype",
        "max_model_len",
        "max_num_batched_tokens",
        "hf_overrides",
        "attention_backend",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m acquisition routing",
        description="Capture a routing profile: what every MoE layer's router chose, per step.",
    )
    p.add_argument("model", type=Path, help="model folder with config.json")
    p.add_argument(
        "--prompts",
        type=Path,
        required=True,
        help="JSON lines (prompt or prompt_token_ids) or one text prompt per line",
    )
    p.add_argument("--out", type=Path, help="profile file (default: <model name>.routing.npz)")
    p.add_argument(
        "--model-name",
        help="the checkpoint's name in the profile (default: the config's _name_or_path, "
        "else the model folder's name)",
    )
    p.add_argument("--max-tokens", type=int, default=16, help="new tokens per prompt")
    p.add_argument(
        "--batch-prompts",
        type=int,
        default=16,
        help="prompts per generate call (one checkpoint each)",
    )
    p.add_argument(
        "--engine",
        choices=("vllm", "torch"),
        default="vllm",
        help="vllm (GPU host) or torch (a small CPU MoE with a synthetic skewed router)",
    )
    p.add_argument(
        "--router",
        choices=ROUTERS,
        default="native",
        help="vllm: the model's router, or vLLM's routing simulator strategy",
    )
    p.add_argument("--zipf-s", type=float, default=1.2, help="torch: the gate's Zipf exponent")
    p.add_argument("--layers", type=int, help="torch: MoE layers (default: the config's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--load-format", default="auto", help="vllm: e.g. dummy (no weights)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--hf-overrides", default=None, help='vllm: JSON, e.g. {"num_hidden_layers": 4}')
    p.add_argument("--attention-backend", default=None, help="vllm: e.g. TRITON_ATTN")
    p.add_argument("--progress-json", type=Path, help="append JSON progress events here")
    p.add_argument("--no-progress-bar", action="store_true")
    p.add_argument("--stop-after", type=int, help=argparse.SUPPRESS)
    return p


def capture_options(args: argparse.Namespace) -> dict[str, object]:
    """The options of this command line that a resume must match (``_IDENTITY``)."""
    options: dict[str, object] = {name: getattr(args, name) for name in _IDENTITY[args.engine]}
    if args.hf_overrides is not None:
        options["hf_overrides"] = json.loads(args.hf_overrides)  # key order does not matter
    return options


def _engine(args: argparse.Namespace) -> RoutingEngine:
    if args.engine == "torch":
        from acquisition.routing_capture.torch_engine import TorchRoutingEngine

        return TorchRoutingEngine(
            args.model, zipf_s=args.zipf_s, layers=args.layers, seed=args.seed
        )
    from acquisition.routing_capture.vllm_engine import VllmRoutingEngine

    engine_args: dict[str, object] = {
        "load_format": args.load_format,
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "tensor_parallel_size": args.tensor_parallel_size,
        "seed": args.seed,
        "enable_prefix_caching": False,
    }
    if args.load_format == "dummy":
        engine_args.update(skip_tokenizer_init=True, generation_config="vllm")
    if args.hf_overrides:
        engine_args["hf_overrides"] = json.loads(args.hf_overrides)
    if args.attention_backend:
        engine_args["attention_backend"] = args.attention_backend
    return VllmRoutingEngine(args.model, engine_args, args.router)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[2:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    problems = []
    if not (args.model / "config.json").is_file():
        problems.append(f"{args.model}: no config.json")
    if args.model_name is not None and not 1 <= len(args.model_name) <= 200:
        problems.append("--model-name must be 1 to 200 characters")
    if args.max_tokens < 1:
        problems.append("--max-tokens must be at least 1")
    if args.batch_prompts < 1:
        problems.append("--batch-prompts must be at least 1")
    if args.tensor_parallel_size != 1:
        problems.append(
            "--tensor-parallel-size: the capture hooks the router in this process; capture "
            "at TP1 (routing does not depend on TP)"
        )
    if args.hf_overrides is not None:
        try:
            if not isinstance(json.loads(args.hf_overrides), dict):
                raise ValueError("not an object")
        except ValueError as exc:
            problems.append(f"--hf-overrides must be a JSON object ({exc})")
    if args.engine == "vllm" and "vllm" not in sys.modules and not importlib.util.find_spec("vllm"):
        problems.append("--engine vllm: vLLM is not installed here (on CPU: --engine torch)")
    if args.engine == "torch" and args.router != "native":
        problems.append("--router belongs to the vllm engine (torch uses --zipf-s)")
    try:
        prompts, digest = read_prompts(args.prompts)
    except PromptError as exc:
        problems.append(str(exc))
    else:
        text = sum(1 for prompt in prompts if prompt.token_ids is None)
        if args.engine == "vllm" and args.load_format == "dummy" and text:
            # Dummy weights start the engine without a tokenizer: say so before it starts.
            problems.append(
                f"{args.prompts}: {text} text prompts, but --load-format dummy runs without a "
                'tokenizer: give {"prompt_token_ids": [...]} lines'
            )
    if problems:
        for problem in problems:
            print(f"{parser.prog}: error: {problem}", file=sys.stderr)
        return 2
    out = args.out or Path(f"{args.model.resolve().name}.routing.npz")
    batches = -(-len(prompts) // args.batch_prompts)
    progress = ProgressReporter(args.progress_json, bar=not args.no_progress_bar, total=batches)
    from acquisition.routing_capture.capture import CaptureError, run_capture

    try:
        progress.event("build", f"starting the {args.engine} engine")
        engine = _engine(args)
        profile = run_capture(
            engine,
            prompts,
            digest,
            out,
            max_tokens=args.max_tokens,
            batch_prompts=args.batch_prompts,
            command="python -m acquisition routing " + shlex.join(argv),
            source=args.engine,
            progress=progress,
            stop_after=args.stop_after,
            model_name=args.model_name,
            options=capture_options(args),
        )
    except CaptureError as exc:
        progress.event("failed", str(exc), error=str(exc))
        print(f"{parser.prog}: capture failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.event("cancelled", "interrupted; the same command resumes")
        return 130
    finally:
        progress.close()
    if profile is None:
        return 130
    print(
        f"{out}: {profile.steps} steps, {len(profile.layers)} layers, "
        f"imbalance max/mean {profile.imbalance().max():.2f}"
    )
    return 0
