"""How many CPU threads llama.cpp gets when nobody says: `default_threads()`.

llama.cpp's worker threads spin while they wait for each other, so more threads
than there are free CPUs does not degrade gently, it collapses: on a 2-core machine
with a busy neighbour the demo took 6 min 44 s with 2 threads and 36 s with 1, the
README snippet 89 s against 3 s (issue #13). The rule, in order:

1. An explicit `n_threads` (`PoolConfig`, `ContextParams`) wins; this module is
   only asked when it is `0`.
2. `AGENTMEM_THREADS`, when set, is the count (a positive integer; anything else
   raises `ConfigError` naming the variable).
3. Otherwise: the physical cores this process may run on (CPU affinity and a cgroup
   CPU quota respected; SMT siblings count once), less what else is running (the
   1-minute load average taken from the logical CPUs, rounded to the nearest whole
   CPU), never below 1.

Example:
    >>> threads_for(physical=4, logical=8, load1=0.2)   # quiet: every physical core
    4
    >>> threads_for(physical=2, logical=2, load1=1.8)   # a busy neighbour on 2 cores
    1
    >>> threads_for(physical=8, logical=16, load1=12.4)  # 3.6 logical CPUs free
    4
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

from agentmem.errors import ConfigError

__all__ = ["ENV_VAR", "default_threads", "threads_for"]

logger = logging.getLogger(__name__)

ENV_VAR = "AGENTMEM_THREADS"
"""Environment variable that sets the thread count when `n_threads` is 0."""

_SYS_CPU = Path("/sys/devices/system/cpu")
_CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
_last_logged: tuple[int, str] | None = None


def threads_for(*, physical: int, logical: int, load1: float) -> int:
    """The rule of step 3: physical cores, less the CPUs the load average says are taken.

    Args:
        physical: physical cores available to this process (>= 1).
        logical: logical CPUs available to this process (>= `physical`).
        load1: the 1-minute load average (runnable tasks, machine-wide).

    Returns:
        A thread count in `[1, physical]`.
    """
    physical = max(1, physical)
    free = max(logical, physical) - max(0.0, load1)
    return max(1, min(physical, math.floor(free + 0.5)))


def default_threads() -> int:
    """The thread count for `n_threads=0`: `AGENTMEM_THREADS`, else `threads_for` on this machine.

    The first choice (and any later different one) is logged at INFO on
    `agentmem.engine.threads`.

    Returns:
        A thread count >= 1.

    Raises:
        ConfigError: `AGENTMEM_THREADS` is set but is not a positive integer.
    """
    raw = os.environ.get(ENV_VAR, "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"{ENV_VAR} must be a positive integer, got {raw!r}")
        _log_choice(n, f"{ENV_VAR}={raw}")
        return n
    cpus = _usable_cpus()
    logical = len(cpus)
    physical = _physical_cores(cpus)
    quota = _cpu_quota()
    if quota is not None:
        logical = min(logical, quota)
        physical = min(physical, quota)
    load1 = _load1()
    n = threads_for(physical=physical, logical=logical, load1=load1)
    _log_choice(n, f"{physical} physical core(s), {logical} logical, load average {load1:.2f}; {ENV_VAR} overrides")
    return n


def _log_choice(n: int, why: str) -> None:
    global _last_logged
    if _last_logged is None or _last_logged[0] != n:
        logger.info("llama.cpp threads: %d (%s)", n, why)
    _last_logged = (n, why)


# -- readings (small functions so tests can replace them) ------------------------------


def _usable_cpus() -> set[int]:
    """Logical CPU ids this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return set(range(os.cpu_count() or 1))


def _physical_cores(cpus: set[int]) -> int:
    """Distinct (package, core) pairs among `cpus`; without topology files, half the SMT-capable count."""
    cores: set[tuple[str, str]] = set()
    for cpu in cpus:
        topo = _SYS_CPU / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            return _physical_fallback(len(cpus))
    return max(1, len(cores))


def _physical_fallback(logical: int) -> int:
    # No sysfs (macOS, Windows): llama-cpp-python's own default, half the logical CPUs.
    return max(1, logical // 2) if logical > 1 else 1


def _cpu_quota() -> int | None:
    """CPUs allowed by a cgroup v2 quota (`cpu.max`), rounded up; `None` without a quota."""
    try:
        quota, period = _CGROUP_CPU_MAX.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(1, math.ceil(int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def _load1() -> float:
    """The 1-minute load average (0.0 where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0
