"""Observing the acquisition host once: device, versions, and the cache the banks overflow."""

from __future__ import annotations

import platform
import re
import socket
from pathlib import Path

from acquisition.adapters.base import RuntimeInfo

__all__ = ["DeviceError", "probe_runtime"]

_SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


class DeviceError(RuntimeError):
    """The requested device is not usable here."""


def _cpu_cache() -> tuple[int, str]:
    """The largest cache level of CPU 0 from sysfs (the CPU's last-level cache)."""
    best = (0, "")
    for index in sorted(_SYSFS_CACHE.glob("index*")):
        try:
            size_text = (index / "size").read_text().strip()
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        match = re.fullmatch(r"(\d+)([KMG]?)", size_text)
        if not match:
            continue
        size = (
            int(match.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2)]
        )
        if size > best[0]:
            best = (size, f"sysfs cpu0 cache {index.name} (L{level}, {size_text})")
    return best


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_runtime(device: str, cache_bytes: int | None = None) -> RuntimeInfo:
    """Read the host; ``cache_bytes`` overrides the cache size (recorded as declared)."""
    import torch

    host = socket.gethostname()
    if device == "cuda":
        if not torch.cuda.is_available():
            return RuntimeInfo(
                device="cuda",
                device_name="unavailable",
                accelerator_available=False,
                torch_version=str(torch.__version__),
                cuda_version=torch.version.cuda,
                capability=None,
                cache_bytes=cache_bytes or 0,
                cache_source="declared --cache-bytes" if cache_bytes else "unavailable",
                total_memory=None,
                uuid=None,
                host=host,
            )
        props = torch.cuda.get_device_properties(0)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        uuid = getattr(props, "uuid", None)
        return RuntimeInfo(
            device="cuda",
            device_name=str(props.name),
            accelerator_available=True,
            torch_version=str(torch.__version__),
            cuda_version=torch.version.cuda,
            capability=(int(props.major), int(props.minor)),
            cache_bytes=cache_bytes if cache_bytes is not None else l2,
            cache_source=(
                "declared --cache-bytes"
                if cache_bytes is not None
                else "torch.cuda.get_device_properties(0).L2_cache_size"
            ),
            total_memory=int(props.total_memory),
            uuid=str(uuid) if uuid is not None else None,
            host=host,
        )
    if device != "cpu":
        raise DeviceError(f"unknown device {device!r}; choose cuda or cpu")
    size, source = _cpu_cache()
    return RuntimeInfo(
        device="cpu",
        device_name=_cpu_name(),
        accelerator_available=False,
        torch_version=str(torch.__version__),
        cuda_version=None,
        capability=None,
        cache_bytes=cache_bytes if cache_bytes is not None else size,
        cache_source="declared --cache-bytes" if cache_bytes is not None else (source or "unknown"),
        total_memory=None,
        uuid=None,
        host=host,
    )
