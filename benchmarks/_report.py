"""Helpers the benchmark scripts share: machine load, units, plain-text tables, run metadata."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

ROOT = Path(__file__).resolve().parent.parent


def load() -> list[float]:
    """The 1/5/15-minute load averages, rounded (recorded next to every measurement)."""
    return [round(x, 2) for x in os.getloadavg()]


def git_sha(ref: str = "HEAD", tree: Path = ROOT) -> str:
    """The full commit id `ref` names in the repository at `tree`."""
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--verify", f"{ref}^{{commit}}"], check=True,
                          capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def ref_tree(ref: str, *, at: Path | None = None) -> Iterator[Path]:
    """A detached git worktree of revision `ref` of this repository, for measuring it in the same run.

    Args:
        ref: a commit, branch or tag.
        at: where to keep the worktree. A worktree already there at `ref`'s commit is reused
            (a second run skips the checkout); one at another commit is moved to `ref`. Kept after the
            block. Without `at`, a temporary worktree is made and removed after the block.

    Yields:
        The worktree's root (its `agentmem` and `integrations` go first on `PYTHONPATH`).
    """
    sha = git_sha(ref)
    if at is None:
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "ref"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), sha], check=True,
                           capture_output=True)
            try:
                yield tree
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False,
                               capture_output=True)
        return
    if (at / ".git").exists():
        if git_sha("HEAD", at) != sha:
            subprocess.run(["git", "-C", str(at), "checkout", "--detach", "--force", sha], check=True,
                           capture_output=True)
    else:
        at.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False, capture_output=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(at), sha], check=True,
                       capture_output=True)
    yield at


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{1e3 * x:.0f} ms" if x >= 0.01 else f"{1e3 * x:.1f} ms"


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A left-aligned text table with a dashed rule under the header."""
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A markdown (pipe) table, for results meant to be pasted into the docs."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def make_pool(cfg: dict[str, Any], **options: Any) -> Any:
    """A MemoryPool on ``cfg["model"]`` with ``cfg["threads"]`` threads (imported late: workers fork first)."""
    from agentmem import MemoryPool

    return MemoryPool(cfg.get("model"), n_threads=cfg["threads"], **options)


GPU_LAYERS_ENV = "AGENTMEM_N_GPU_LAYERS"  # read by PoolConfig(n_gpu_layers=None): agentmem.config


class _GpuLayers(argparse.Action):
    """Stores the count and exports it as `AGENTMEM_N_GPU_LAYERS`, so every pool of the run and every
    `agentmem serve` it starts offloads the same layers without each script threading the value through."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values < -1:
            parser.error(f"--n-gpu-layers must be >= -1 (-1 = every layer), got {values}")
        os.environ[GPU_LAYERS_ENV] = str(values)
        setattr(namespace, self.dest, values)


def add_gpu_layers(ap: argparse.ArgumentParser) -> None:
    """`--n-gpu-layers N` (the same for every variant of a benchmark): layers offloaded on a CUDA/Metal build."""
    ap.add_argument("--n-gpu-layers", type=int, action=_GpuLayers, default=None, metavar="N",
                    help=f"layers offloaded to the GPU by every pool of the run (-1 = all, 0 = CPU; "
                         f"default {GPU_LAYERS_ENV}, else 0); exported as {GPU_LAYERS_ENV} to servers it starts")


def gpu_layers() -> int:
    """The layer count this run's pools use (`--n-gpu-layers`, else `AGENTMEM_N_GPU_LAYERS`, else 0)."""
    return int(os.environ.get(GPU_LAYERS_ENV, "").strip() or 0)


def sections(ap: argparse.ArgumentParser, only: str, valid: Sequence[str]) -> list[str]:
    """The ``--only`` list, or an argparse error naming the unknown ones."""
    chosen = [s.strip() for s in only.split(",") if s.strip()]
    bad = sorted(set(chosen) - set(valid))
    if bad:
        ap.error(f"unknown section(s) {bad}; valid: {', '.join(valid)}")
    return chosen


def run_meta(script: str, model: str, args: argparse.Namespace, argv: list[str] | None, **extra: Any) -> dict[str, Any]:
    """What a results file records about the run: model, threads, offloaded layers, machine, load, the command."""
    return {
        "model": Path(model).name,
        "threads": args.threads,
        "n_gpu_layers": gpu_layers(),
        "quick": getattr(args, "quick", False),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_at_start": load(),
        **extra,
        "command": " ".join(["python", f"benchmarks/{script}", *(argv if argv is not None else sys.argv[1:])]),
    }
