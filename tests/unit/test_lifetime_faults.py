"""Lifetime faults: `close()` at any moment, storage faults, corrupt schemas, disconnects (#23 findings 5, 6, 8, 11).

* Finding 5: `MemoryPool.close()` while another thread tokenizes a huge prompt, prefills or
  holds a suspended stream: run in a subprocess (a SIGSEGV/abort fails the test instead of
  killing pytest), several times, each bounded by a timeout.
* Finding 6: the archive's storage full (SQLite's `PRAGMA max_page_count`, a real
  `SQLITE_FULL`; and, when the tests run as root, a real `ENOSPC` on a 2 MiB tmpfs):
  `ArchiveFullError`, 507 `insufficient_storage`, `/health` `degraded`, nothing stored lost,
  writes work again once space frees.
* Finding 8: bytes that are not UTF-8 in the archive's schema text: a one-line
  `ArchiveError` naming the file (library), exit 2 with one line (CLI).
* Finding 11: a client that disconnects before the first token, or during a non-streaming
  call, stops the pool's work at the next prefill chunk or decode step (real HTTP, uvicorn
  in a thread; the decode calls are timed to count what ran after the disconnect).
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from agentmem import MemoryPool
from agentmem.archive import Archive
from agentmem.cli import main as cli_main
from agentmem.errors import ArchiveError, ArchiveFullError, CallCancelledError, PoolClosedError

REPO = Path(__file__).resolve().parents[2]
HI = [{"role": "user", "content": "hi"}]


def _script(code: str, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter (the repo importable); a crash shows as a negative return code."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout_s,
                          env=env, cwd=str(REPO))


# ---------------------------------------------------------------------------------------- finding 5

_CLOSE_DURING_TOKENIZE = r"""
import json, sys, threading, time
from agentmem import MemoryPool
model, close_timeout = sys.argv[1], float(sys.argv[2])
pool = MemoryPool(model, n_ctx=512, resident_agents=1, n_threads=1, prefetch=False)
engine = pool.engine()  # its native handles, read after close
huge = [{"role": "user", "content": "word " * 400000}]
out = {}
def call(name, fn):
    try:
        fn()
        out[name] = "ok"
    except Exception as exc:
        out[name] = type(exc).__name__
threads = [threading.Thread(target=call, args=("chat", lambda: pool.chat("a", huge, max_tokens=4))),
           threading.Thread(target=call, args=("count_tokens", lambda: pool.count_tokens(huge)))]
for t in threads:
    t.start()
time.sleep(0.05)
t0 = time.perf_counter()
pool.close() if close_timeout == 30.0 else pool.close(timeout_s=close_timeout)  # the default: as on main
out["close_s"] = time.perf_counter() - t0
for t in threads:
    t.join(60)
out["model_freed"] = engine.model._closed
try:
    pool.chat("a", [{"role": "user", "content": "hi"}], max_tokens=1)
except Exception as exc:
    out["after"] = type(exc).__name__
print(json.dumps(out))
"""


@pytest.mark.parametrize("close_timeout", [30.0, 0.0], ids=["close-waits", "last-call-frees"])
def test_close_while_another_thread_tokenizes_a_huge_prompt(tiny_model_path: Path, close_timeout: float) -> None:
    """#23 finding 5: `close()` 50 ms into `chat`/`count_tokens` on `"word " * 400000` freed the model
    mid-tokenize (abort or SIGSEGV in 5 of 6 runs). Now close waits for the tokenize (or, with a
    zero timeout, the last call out frees the handles) and the calls fail with typed errors."""
    for _ in range(3):
        p = _script(_CLOSE_DURING_TOKENIZE, str(tiny_model_path), str(close_timeout))
        assert p.returncode == 0, f"rc={p.returncode}\n{p.stderr[-2000:]}"
        out = json.loads(p.stdout.strip().splitlines()[-1])
        assert out["chat"] in ("PoolClosedError", "ContextOverflowError"), out
        assert out["count_tokens"] in ("ok", "PoolClosedError"), out
        assert out["model_freed"] is True and out["after"] == "PoolClosedError", out
        if close_timeout == 0.0:
            assert out["close_s"] < 0.5, out  # did not wait: the last call freed the pool


_CLOSE_DURING_PREFILL = r"""
import json, sys, threading, time
from agentmem import MemoryPool
from agentmem.archive import Archive
model, archive = sys.argv[1], sys.argv[2]
pool = MemoryPool(model, n_ctx=2048, resident_agents=2, n_threads=1, n_batch=32, prefetch=False, archive_path=archive)
real = pool.engine().ctx.decode_run
def slow(*a, **k):  # a prefill chunk takes 10 ms: the close lands inside the prefill
    time.sleep(0.01)
    return real(*a, **k)
pool.engine().ctx.decode_run = slow
out = {}
suspended = pool.chat_stream("held", [{"role": "user", "content": "hi"}], max_tokens=200)
out["first_piece"] = isinstance(next(suspended), str)  # then left suspended, agent busy
def prefill():
    try:
        pool.chat("long", [{"role": "user", "content": "hello world " * 300}], max_tokens=4)
        out["long"] = "ok"
    except Exception as exc:
        out["long"] = type(exc).__name__
t = threading.Thread(target=prefill)
t.start()
time.sleep(0.15)
t0 = time.perf_counter()
pool.close()
out["close_s"] = time.perf_counter() - t0
t.join(30)
try:
    next(suspended)
except Exception as exc:
    out["suspended_next"] = type(exc).__name__
suspended.close()
with Archive(archive, readonly=True) as arc:
    out["stored"] = sorted(a.agent_id for a in arc.list_agents())
print(json.dumps(out))
"""


def test_close_cancels_a_prefill_and_frees_a_suspended_stream(tiny_model_path: Path, tmp_path: Path) -> None:
    """#23 finding 5: close while one thread prefills a long prompt and another stream is suspended
    mid-generation: the prefill stops at its next chunk with `PoolClosedError`, the suspended stream
    is closed (its agent released and stored in the archive), and nothing crashes."""
    for i in range(3):
        p = _script(_CLOSE_DURING_PREFILL, str(tiny_model_path), str(tmp_path / f"a{i}.db"))
        assert p.returncode == 0, f"rc={p.returncode}\n{p.stderr[-2000:]}"
        out = json.loads(p.stdout.strip().splitlines()[-1])
        assert out["first_piece"] and out["long"] == "PoolClosedError", out
        assert out["suspended_next"] == "PoolClosedError", out
        assert out["close_s"] < 5, out
        assert "held" in out["stored"], out  # the suspended stream's agent was released, then stored


def test_cancel_stops_a_stream_at_the_next_decode_step(tiny_model_path: Path) -> None:
    """#23 finding 11 (library side): `ChatStream.cancel()` from another thread ends the call with
    `CallCancelledError` at its next decode step; the agent is usable at once."""
    with MemoryPool(str(tiny_model_path), n_ctx=1024, resident_agents=2, n_threads=1, prefetch=False) as pool:
        s = pool.chat_stream("a", HI, max_tokens=200)
        next(s)
        s.cancel()
        with pytest.raises(CallCancelledError):
            for _ in range(3):
                next(s)
        s.close()
        assert pool.chat("a", HI, max_tokens=2).usage.completion_tokens == 2
    with pytest.raises(PoolClosedError):
        pool.chat("a", HI)


# ---------------------------------------------------------------------------------------- finding 6

def _fill_archive(pool: MemoryPool) -> None:
    """Make the archive's database full: no page beyond those it has (a real `SQLITE_FULL`)."""
    conn = pool.engine()._core.archive._conn  # the pool's own connection: max_page_count is per connection
    n = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {n}")


def _free_archive(pool: MemoryPool) -> None:
    pool.engine()._core.archive._conn.execute("PRAGMA max_page_count = 1073741823")


def test_a_full_archive_raises_archive_full_and_loses_nothing(tiny_model_path: Path, tmp_path: Path) -> None:
    """#23 finding 6 (library): a commit into a full archive raises `ArchiveFullError` (an
    `ArchiveError`), `storage_fault` says so, the agent keeps its KV in RAM, what was stored stays
    readable, and a commit after space frees writes it."""
    path = tmp_path / "a.db"
    with MemoryPool(str(tiny_model_path), n_ctx=2048, resident_agents=2, n_threads=1, archive_path=str(path)) as pool:
        pool.chat("kept", [{"role": "user", "content": "hello world " * 40}], max_tokens=4)
        pool.commit("kept")
        _fill_archive(pool)
        msgs = [{"role": "user", "content": "other text " * 80}]
        pool.chat("new", msgs, max_tokens=4)
        with pytest.raises(ArchiveFullError, match="storage is full"):
            pool.commit("new")
        assert pool.storage_fault and "full" in pool.storage_fault
        assert pool.chat("new", msgs, max_tokens=4).kv == "reused"  # still in RAM
        with Archive(path, readonly=True) as arc:
            assert [a.agent_id for a in arc.list_agents()] == ["kept"] and arc.get_ledger("kept").n_tokens > 0
        _free_archive(pool)
        assert pool.commit("new") and pool.storage_fault is None
    with Archive(path, readonly=True) as arc:
        assert sorted(a.agent_id for a in arc.list_agents()) == ["kept", "new"]


@pytest.fixture
def serving_full(tiny_model_path: Path, tmp_path: Path) -> Iterator[Any]:
    pytest.importorskip("fastapi")
    from agentmem.server import ServerSettings, create_app
    from tests.fixtures.serving import ServerThread

    pool = MemoryPool(str(tiny_model_path), n_ctx=2048, resident_agents=2, n_threads=1,
                      archive_path=str(tmp_path / "srv.db"))
    app = create_app(pool, settings=ServerSettings(durability="call", default_max_tokens=4))
    with ServerThread(app) as srv:
        srv.pool = pool
        yield srv
    pool.close()


def test_server_full_archive_is_507_and_health_degraded(serving_full: Any) -> None:
    """#23 finding 6 (server, `--durability call`): a full archive made every call a 500 "internal
    error (ArchiveError)" while /health said ok. Now: 507 `insufficient_storage`, /health 200
    `degraded`, and once space frees the next call commits and /health is ok again."""
    import httpx

    pool = serving_full.pool
    with httpx.Client(base_url=serving_full.base_url, timeout=30) as http:
        body = {"messages": HI, "user": "a"}
        assert http.post("/v1/chat/completions", json=body).status_code == 200
        _fill_archive(pool)
        big = {"messages": [{"role": "user", "content": "other text " * 80}], "user": "b"}
        r = http.post("/v1/chat/completions", json=big)
        assert r.status_code == 507, r.text
        assert r.json()["error"]["code"] == "insufficient_storage"
        h = http.get("/health")
        assert h.status_code == 200 and h.json()["status"] == "degraded", h.text
        assert http.get("/agents/a").json()["tokens"] > 0  # the archive still reads
        _free_archive(pool)
        assert http.post("/v1/chat/completions", json=big).status_code == 200
        assert http.get("/health").json() == {"status": "ok"}
    with Archive(pool.config.archive_path, readonly=True) as arc:
        assert sorted(a.agent_id for a in arc.list_agents()) == ["a", "b"]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (root only; skipped elsewhere)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a tmpfs")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_real_enospc_on_a_full_filesystem(tiny_model_path: Path, tmpfs: Path) -> None:
    """#23 finding 6 with a real full filesystem (ENOSPC on a 2 MiB tmpfs, filled by a file):
    `ArchiveFullError`, nothing stored lost, writes work again once the file is removed."""
    path = tmpfs / "a.db"
    with MemoryPool(str(tiny_model_path), n_ctx=2048, resident_agents=2, n_threads=1, archive_path=str(path)) as pool:
        pool.chat("kept", [{"role": "user", "content": "hello world " * 40}], max_tokens=4)
        pool.commit("kept")
        st = os.statvfs(tmpfs)
        filler = tmpfs / "filler"
        filler.write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - 4096))
        pool.chat("new", [{"role": "user", "content": "other text " * 80}], max_tokens=4)
        with pytest.raises(ArchiveFullError):
            pool.commit("new")
        with Archive(path, readonly=True) as arc:
            assert [a.agent_id for a in arc.list_agents()] == ["kept"]
        filler.unlink()
        assert pool.commit("new") and pool.storage_fault is None


# ---------------------------------------------------------------------------------------- finding 8

def _corrupt_schema(path: Path, target: bytes = b"ledgers") -> None:
    """Write an archive, then put bytes that are not UTF-8 into its schema text (a table name)."""
    Archive(path).close()
    data = bytearray(path.read_bytes())
    i = data.find(target)
    assert i > 0
    data[i + 1 : i + 4] = b"\xfc\xfd\xfe"
    path.write_bytes(data)


@pytest.mark.parametrize("target", [b"ledgers", b"AFTER DELETE"])
def test_corrupt_schema_text_is_a_typed_archive_error(tmp_path: Path, tiny_model_path: Path, target: bytes) -> None:
    """#23 finding 8 (library): random bytes in the schema text raised a raw UnicodeDecodeError at
    open. Now `ArchiveError` naming the file, from `Archive` and from `MemoryPool(archive_path=…)`."""
    path = tmp_path / "bad.db"
    _corrupt_schema(path, target)
    for readonly in (True, False):
        with pytest.raises(ArchiveError, match="bad.db.*not UTF-8"):
            Archive(path, readonly=readonly)
    with pytest.raises(ArchiveError, match="bad.db"):
        MemoryPool(str(tiny_model_path), n_ctx=512, n_threads=1, archive_path=str(path))


def test_cli_on_a_corrupt_schema_is_one_line_exit_2(tmp_path: Path) -> None:
    """#23 finding 8 (CLI): `agentmem archive ls` on a schema with non-UTF-8 bytes died with a
    traceback (exit 1). Now exit 2 and one line naming the file."""
    path = tmp_path / "bad.db"
    _corrupt_schema(path)
    p = _script("import sys; from agentmem.cli import main; sys.exit(main(sys.argv[1:]))", "archive", "ls", str(path))
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentmem: error: ") and "bad.db" in lines[0], p.stderr


def test_cli_random_schema_corruption_never_tracebacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """#23 finding 8: random bytes (0x80-0xff) written over the schema's CREATE statements: every
    `archive ls` exits 0 (the corruption was harmless) or 2 with one line; none raises."""
    base = tmp_path / "base.db"
    Archive(base).close()
    data = base.read_bytes()
    creates = [i for i in range(len(data)) if data.startswith(b"CREATE", i)]
    target = tmp_path / "t.db"
    for seed in range(40):
        r = random.Random(seed)
        b = bytearray(data)
        i = r.choice(creates)
        for _ in range(r.randint(1, 8)):
            b[min(len(b) - 1, i + r.randint(0, 200))] = r.randint(0x80, 0xFF)  # a CREATE may end the file
        target.write_bytes(b)
        for side in ("-wal", "-shm"):
            Path(f"{target}{side}").unlink(missing_ok=True)
        rc = cli_main(["archive", "ls", str(target)])
        err = capsys.readouterr().err.strip()
        assert rc in (0, 2), (seed, rc, err)
        if rc == 2:
            assert "\n" not in err and err.startswith("agentmem: error: "), (seed, err)


# ---------------------------------------------------------------------------------------- finding 11

class _DecodeLog:
    """Slows the pool's decodes and records `(monotonic time, tokens)` of each one."""

    def __init__(self, pool: MemoryPool, monkeypatch: pytest.MonkeyPatch, delay_s: float) -> None:
        self.calls: list[tuple[float, int]] = []
        ctx = pool.engine().ctx
        run, multi = ctx.decode_run, ctx.decode_multi

        def decode_run(seq: int, tokens: Any, pos0: int, *a: Any, **k: Any) -> Any:
            time.sleep(delay_s)
            self.calls.append((time.monotonic(), len(tokens)))
            return run(seq, tokens, pos0, *a, **k)

        def decode_multi(runs: Any, *a: Any, **k: Any) -> Any:
            time.sleep(delay_s)
            self.calls.append((time.monotonic(), sum(len(r[1]) for r in runs)))
            return multi(runs, *a, **k)

        monkeypatch.setattr(ctx, "decode_run", decode_run)
        monkeypatch.setattr(ctx, "decode_multi", decode_multi)

    def tokens_after(self, t: float) -> int:
        return sum(n for ts, n in self.calls if ts > t)


@pytest.fixture
def served(tiny_model_path: Path) -> Iterator[Any]:
    pytest.importorskip("fastapi")
    from agentmem.server import ServerSettings, create_app
    from tests.fixtures.serving import ServerThread

    pool = MemoryPool(str(tiny_model_path), n_ctx=2048, resident_agents=2, n_threads=1, n_batch=32, prefetch=False)
    app = create_app(pool, settings=ServerSettings(default_max_tokens=4))
    with ServerThread(app) as srv:
        srv.pool = pool
        yield srv
    pool.close()


def _post_and_leave(srv: Any, body: dict[str, Any], after_s: float) -> float:
    """POST `body` on a raw socket, close the connection after `after_s` (no answer read yet); returns when."""
    raw = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        time.sleep(after_s)
    return time.monotonic()


def _idle(pool: MemoryPool, agent_id: str, timeout_s: float = 10.0) -> float:
    """Seconds until `agent_id`'s call has released it."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        a = pool.engine()._core.agents.get(agent_id)
        if a is not None and not a.held:
            return time.monotonic() - t0
        time.sleep(0.01)
    raise AssertionError(f"{agent_id} still busy after {timeout_s} s")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_disconnect_before_the_first_token_stops_the_prefill(served: Any, monkeypatch: pytest.MonkeyPatch,
                                                             stream: bool) -> None:
    """#23 finding 11: a client that disconnected before the first token was not noticed (64 closed
    streams still prefilled for 19 s). Now the prefill stops at its next chunk: a ~26-chunk prompt
    (32 tokens a chunk, 40 ms each) left after 0.3 s decodes at most ~2 chunks after the disconnect."""
    log = _DecodeLog(served.pool, monkeypatch, delay_s=0.04)
    body = {"messages": [{"role": "user", "content": "hello world " * 400}], "user": "leaver",
            "max_tokens": 4, "stream": stream}
    gone = _post_and_leave(served, body, 0.3)
    waited = _idle(served.pool, "leaver")
    late = log.tokens_after(gone + 0.1)  # 0.1 s: the 50 ms disconnect poll plus the chunk under way
    total = sum(n for _, n in log.calls)
    assert late <= 2 * 32, f"{late} tokens decoded after the disconnect (of {total})"
    assert waited < 3.0 and total <= 512, (waited, total)
    import httpx

    r = httpx.post(f"{served.base_url}/v1/chat/completions", json={"messages": HI, "user": "leaver"}, timeout=30)
    assert r.status_code == 200, r.text  # the agent stays usable


def test_disconnect_during_a_non_streaming_call_stops_decoding(served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """#23 finding 11: an abandoned non-streaming call ran to max_tokens. Now its decode stops at
    the next step: the tiny model writes 54 tokens for "hi" (50 ms a step); the client leaves after
    0.4 s, and at most a few steps run after that."""
    log = _DecodeLog(served.pool, monkeypatch, delay_s=0.05)
    gone = _post_and_leave(served, {"messages": HI, "user": "quitter", "max_tokens": 200}, 0.4)
    _idle(served.pool, "quitter")
    late = log.tokens_after(gone + 0.1)
    assert late <= 2, f"{late} decode steps after the disconnect ({len(log.calls)} in all)"
    stats = served.pool.stats()["agents"]["quitter"]
    assert stats["tokens"] < 40, stats  # prompt (~10) + the few tokens before the client left
    import httpx

    r = httpx.post(f"{served.base_url}/v1/chat/completions", json={"messages": HI, "user": "quitter"}, timeout=30)
    assert r.status_code == 200, r.text
