"""Reading memory for measured batch budgets (``SizeAwareSampler(max_atoms="auto")``).

A :class:`MemoryReader` says how far a probe raised the peak memory and how much is
free: :class:`CudaMemoryReader` for a CUDA device (PyTorch's allocator statistics),
:class:`ProcessMemoryReader` for the CPU (this process's resident pages, from
Linux's ``/proc``).  How the budget is found from the readings:
:mod:`alchemi_lit.data.memory_budget`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import torch

from ..core.errors import ConfigError
from ..core.heap import malloc_trim


class MemoryReader(ABC):
    """Where a probe's peak memory and the free memory are read (a device's or the
    process's).  ``resolution`` (bytes): growths below it are noise."""

    name = "memory"
    resolution = 2**20

    @abstractmethod
    def start(self) -> None:
        """Forget earlier peaks: :meth:`peak_growth` counts from here."""

    @abstractmethod
    def peak_growth(self) -> int:
        """Bytes the peak rose above the level at :meth:`start`."""

    @abstractmethod
    def available(self) -> int:
        """Bytes the run may still take."""

    def release(self) -> None:
        """Hand back what probing left cached (called once probing is done); a reader
        that caches nothing keeps this default."""
        return None


class CudaMemoryReader(MemoryReader):
    """A CUDA device through PyTorch's caching allocator: peaks from
    ``max_memory_allocated`` (reset before each probe), free memory from
    ``mem_get_info`` plus what the allocator holds cached but unused.  Memory a model
    takes outside PyTorch (Warp, JAX) is not seen: such a model cannot be probed."""

    name = "cuda"

    def __init__(self, device: torch.device | str | int | None = None) -> None:
        self.device = torch.device("cuda" if device is None else device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._base = 0

    def start(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._base = torch.cuda.memory_allocated(self.device)

    def peak_growth(self) -> int:
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device)) - self._base

    def available(self) -> int:
        free, _ = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return int(free + cached)

    def release(self) -> None:
        # what the probes left cached would otherwise starve other allocators (Warp)
        torch.cuda.empty_cache()


class ProcessMemoryReader(MemoryReader):
    """This process's resident memory on Linux.  Before each probe freed heap memory is
    returned to the system (glibc ``malloc_trim``) and the peak resident size is reset
    to the current one (``/proc/self/clear_refs``), so a probe's growth counts every
    page it touched, PyTorch's and the libraries' alike.  Free memory: ``MemAvailable``
    of ``/proc/meminfo``, or less where a cgroup limit says so.  ``getrusage``'s peak
    cannot be reset and ``tracemalloc`` sees Python objects only, hence ``/proc``."""

    name = "process"
    #: repeated probes of one batch differ by ~0.1-0.3 MiB (allocator bookkeeping)
    resolution = 2**18

    def __init__(self) -> None:
        self._base = 0
        try:
            _reset_peak()
            _status("VmHWM")
        except OSError as exc:
            raise ConfigError(
                f"max_atoms='auto' on CPU reads the process's peak memory from /proc/self "
                f"(Linux), which is not usable here ({exc}); give max_atoms a number"
            ) from None

    def start(self) -> None:
        malloc_trim()
        _reset_peak()
        self._base = _status("VmRSS")

    def peak_growth(self) -> int:
        return _status("VmHWM") - self._base

    def available(self) -> int:
        return host_memory_room()

    def release(self) -> None:
        malloc_trim()


def default_reader(device: torch.device) -> MemoryReader:
    """The reader for the run's device."""
    if device.type == "cuda":
        return CudaMemoryReader(device)
    if device.type == "cpu":
        return ProcessMemoryReader()
    raise ConfigError(
        f"max_atoms='auto' can measure CUDA devices and the CPU, not {device.type}; give "
        f"max_atoms a number"
    )


# ---------------------------------------------------------------------- Linux /proc
def _status(key: str) -> int:
    """A ``kB`` field of ``/proc/self/status``, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no {key} in /proc/self/status")


def _reset_peak() -> None:
    """Reset the peak resident size (VmHWM) to the current one (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no {key} in /proc/meminfo")


def host_memory_room() -> int:
    """Bytes of host memory this process may still take: ``MemAvailable``, or less
    under a container's limit (Linux; OSError elsewhere)."""
    return min(_meminfo("MemAvailable"), _cgroup_room())


def host_memory_total() -> int:
    """Bytes of host memory this process may use at most: ``MemTotal``, or a container's
    limit where lower (Linux; OSError elsewhere)."""
    return min(_meminfo("MemTotal"), _cgroup_room() + _cgroup_used())


def _cgroup_used() -> int:
    """Bytes this container uses (0 without a cgroup memory controller)."""
    root = Path("/sys/fs/cgroup")
    for usage in ("memory.current", "memory/memory.usage_in_bytes"):
        try:
            return int((root / usage).read_text().strip())
        except (OSError, ValueError):
            continue
    return 0


def _cgroup_room() -> int:
    """Bytes left under this container's memory limit (cgroup v2 or v1; no limit: huge)."""
    root = Path("/sys/fs/cgroup")
    for limit, usage in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        try:
            cap = (root / limit).read_text().strip()
            used = int((root / usage).read_text().strip())
        except (OSError, ValueError):
            continue
        if cap.isdigit():
            return max(int(cap) - used, 0)
    return 1 << 62
