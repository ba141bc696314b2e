"""``python -m acquisition routing MODEL --prompts FILE``: capture a routing profile.

A serving engine runs a prompt set (prefill and decode); a hook on every MoE layer's router
(``set_capture_fn``, the logical top-k ids of each forward) counts per step and layer the pairs
each expert got, and the counts become a routing profile (`moetables.profiles`). The engine
sits behind a seam (`engines.RoutingEngine`): vLLM on a GPU host (`vllm_engine`), or a small
torch MoE with a synthetic skewed (Zipf-like) router on CPU (`torch_engine`), which exercises
the same hook, writer, resume and progress.
"""

from __future__ import annotations
