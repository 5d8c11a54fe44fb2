"""Every entry point of agentmem loads llama.cpp's native libraries before numpy initialises.

Regression test for issue #31: on a CUDA build of llama-cpp-python, a process that imported
numpy before libllama/libggml were loaded segfaulted at its first model load
(llama-cpp-python #1581), and `import agentmem` imported numpy first. Each entry point runs in
a fresh interpreter with a meta-path hook that, when numpy is first looked up, reads
`/proc/self/maps` for libllama; the test fails when numpy came first.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps (Linux)")

# argv: kind ("module" | "script"), target. Prints one "@@{json}" line.
HARNESS = r"""
import json, os, runpy, sys

def llama_mapped():
    with open("/proc/self/maps") as f:
        return any("libllama" in line.rsplit("/", 1)[-1] for line in f)

numpy_seen = {}

class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and not numpy_seen:
            numpy_seen["llama_mapped"] = llama_mapped()
        return None

sys.meta_path.insert(0, Spy())
kind, target = sys.argv[1], sys.argv[2]
out = {"numpy_at_start": "numpy" in sys.modules}
try:
    if kind == "module":
        __import__(target)
    else:
        sys.path.insert(0, os.path.dirname(target))
        sys.argv = [target]
        runpy.run_path(target, run_name="__import_order_probe__")
except ImportError as exc:
    out["import_error"] = f"{type(exc).__name__}: {exc}"
out["numpy_seen"] = bool(numpy_seen)
out["llama_before_numpy"] = numpy_seen.get("llama_mapped")
out["llama_mapped"] = llama_mapped()
print("@@" + json.dumps(out))
"""

MODULES = ["agentmem", "agentmem.cli", "agentmem.server.__main__", "agentmem.errors", "agentmem.codec",
           "agentmem_langchain", "agentmem_autogen", "agentmem_maf"]
SCRIPTS = sorted(str(p.relative_to(ROOT)) for d in ("examples", "benchmarks") for p in (ROOT / d).glob("*.py")
                 if not p.name.startswith("_"))


def _probe(kind: str, target: str) -> dict:
    env = {"PYTHONPATH": f"{ROOT}{':' + str(ROOT / 'integrations')}", "PATH": "/usr/bin:/bin",
           "AGENTMEM_THREADS": "1", "HOME": str(Path.home())}
    cp = subprocess.run([sys.executable, "-c", HARNESS, kind, str(ROOT / target) if kind == "script" else target],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    lines = [ln for ln in cp.stdout.splitlines() if ln.startswith("@@")]
    assert cp.returncode == 0 and lines, f"{target}: rc={cp.returncode}\n{cp.stderr[-3000:]}"
    return json.loads(lines[-1][2:])


def _check(target: str, res: dict) -> None:
    """numpy, when the import pulled it in, came after libllama."""
    assert not res["numpy_at_start"], f"{target}: numpy imported at interpreter start-up"
    if res["numpy_seen"]:
        assert res["llama_before_numpy"], f"{target}: numpy was imported before libllama was loaded ({res})"


@pytest.mark.parametrize("module", MODULES)
def test_module_loads_llama_before_numpy(module: str) -> None:
    res = _probe("module", module)
    if "import_error" in res and not res["numpy_seen"]:
        pytest.skip(f"{module}: an optional dependency is missing ({res['import_error']})")
    _check(module, res)
    assert "import_error" not in res, f"{module}: {res['import_error']}"
    assert res["llama_mapped"], f"{module}: libllama never loaded ({res})"


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_loads_llama_before_numpy(script: str) -> None:
    """Examples and benchmarks import their modules only (their `main` is behind `__main__`).

    Scripts that import agentmem lazily (in `main`, after forking workers) load neither here;
    those that import numpy at the top must have imported agentmem (or llama_cpp) before it.
    """
    res = _probe("script", script)
    _check(script, res)
    if "import_error" in res:
        pytest.skip(f"{script}: an optional dependency is missing ({res['import_error']})")


def test_harness_sees_the_wrong_order(tmp_path: Path) -> None:
    """The probe can fail: a script importing numpy before llama_cpp is reported as such."""
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy\nimport llama_cpp\n")
    res = _probe("script", str(bad))
    assert res["numpy_seen"] and res["llama_before_numpy"] is False
    with pytest.raises(AssertionError, match="numpy was imported before libllama"):
        _check("bad.py", res)


def test_numpy_first_is_recorded() -> None:
    """An application that imported numpy before agentmem is seen (the guard of native_first acts on it)."""
    code = ("import numpy, agentmem\nfrom agentmem.engine import native_first as n\n"
            "print(n.ORDER.numpy_first, n.ORDER.llama_cpp_first)")
    cp = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert cp.stdout.split("\n")[0] == "('numpy',) False"
