"""Weight banks of vLLM sessions whose local experts are two unquantized tensors (R33).

Shared by ``vllm-modular`` and ``vllm-live``: independent clones of ``w13`` and ``w2`` that
keep the native layout (aliases, offsets, strides), and the bytes a clone must own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

__all__ = ["ScaledExpertBanks", "UnquantizedExpertBanks", "clone_banks", "unique_storage_bytes"]


def clone_banks(tensors: tuple[Any, ...], count: int) -> list[tuple[Any, ...]]:
    """``count`` independent copies of ``tensors``, keeping aliases, offsets and strides (R33).

    Tensors sharing one storage share one cloned storage in each bank, viewed at the same
    offsets with the same sizes and strides.
    """
    import torch

    banks: list[tuple[Any, ...]] = []
    for _ in range(count):
        storages: dict[int, Any] = {}
        bank = []
        for t in tensors:
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key not in storages:
                storages[key] = storage.clone()
            view = torch.empty(0, dtype=t.dtype, device=t.device)
            view.set_(storages[key], t.storage_offset(), t.size(), t.stride())
            bank.append(view)
        banks.append(tuple(bank))
    return banks


def unique_storage_bytes(tensors: tuple[Any, ...]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class UnquantizedExpertBanks:
    """Bank handling of sessions whose local experts are two unquantized tensors, w13 and w2.

    Such experts own no scales or other native per-weight state, so a conditioned clone owns
    exactly the weights (R33); clones keep aliases, offsets and strides (``clone_banks``).
    """

    w13: Any
    w2: Any
    device: Any
    _torch: Any
    banks: list[tuple[Any, ...]]

    def expert_weight_bytes(self) -> int:
        return unique_storage_bytes((self.w13, self.w2))

    def expert_bank_bytes(self) -> int:
        return self.expert_weight_bytes()

    def allocate_banks(self, count: int) -> None:
        self.banks = [(b[0], b[1]) for b in clone_banks((self.w13, self.w2), count)]

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            self._torch.cuda.synchronize()


class ScaledExpertBanks(UnquantizedExpertBanks):
    """Banks of sessions whose experts may carry weight scales (block FP8), R33.

    The scales are native per-weight state: a conditioned clone owns them too, and both the
    weight bytes and the bank bytes count them (a bank of FP8 weights without its scales
    would leave the scales cache resident). vLLM's modular experts read their scales from
    the quant config they were built with, so each bank gets its own experts object built on
    the bank's scales (``_bank_experts``).
    """

    w13_scale: Any
    w2_scale: Any
    bank_experts: list[Any]

    def _bank_experts(self, w13_scale: Any, w2_scale: Any) -> Any:
        raise NotImplementedError

    def _expert_tensors(self) -> tuple[Any, ...]:
        if self.w13_scale is None:
            return (self.w13, self.w2)
        return (self.w13, self.w2, self.w13_scale, self.w2_scale)

    def expert_weight_bytes(self) -> int:
        return unique_storage_bytes(self._expert_tensors())

    def expert_bank_bytes(self) -> int:
        return self.expert_weight_bytes()

    def allocate_banks(self, count: int) -> None:
        self.banks = clone_banks(self._expert_tensors(), count)
        self.bank_experts = (
            [self._bank_experts(bank[2], bank[3]) for bank in self.banks]
            if self.w13_scale is not None
            else []
        )
