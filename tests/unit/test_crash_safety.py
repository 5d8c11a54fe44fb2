"""The archive survives SIGKILL at random points of its writes, on SQLite and on PostgreSQL.

A child process loops writing, per transaction, one agent's ledger, state
(1-4 MB of random bytes) and an event, then appends `agent seq` to a journal
file. The parent kills it with SIGKILL at a random moment -- during start-up and
migration in some rounds, mid-write in most -- reopens the archive and checks:

* the archive opens (WAL recovery works; on PostgreSQL the server rolls the dead
  client's transaction back);
* every stored state either verifies (length + SHA-256) or raises
  `CodecError` (a cache miss); it is never silently wrong;
* ledger and state of an agent always come from the same transaction
  (their sequence numbers agree): no torn writes;
* no committed transaction is lost: for every agent the archive holds at least
  the last sequence number the journal recorded (the journal line is written
  after the commit, so the archive may be one ahead, never behind);
* blobs and tokens are byte-identical to what the child wrote.
"""

from __future__ import annotations

import inspect
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from agentmem.archive import open_archive
from agentmem.errors import CodecError

KILLS = {"sqlite": 50, "postgres": 25}  # PostgreSQL rounds cost more (connect, 1-4 MB over a socket): ~60 s -> ~30 s
REPO = Path(__file__).resolve().parents[2]

AGENTS = ("planner", "coder", "reviewer", "selector")


def _payload(agent: str, seq: int) -> tuple[np.ndarray, bytes]:
    """Deterministic tokens and state blob of `agent`'s write number `seq`."""
    rng = np.random.default_rng([AGENTS.index(agent), seq])
    n_tokens = int(rng.integers(1, 4000))
    size = int(rng.integers(1 << 20, 4 << 20))
    return rng.integers(0, 262_144, n_tokens, dtype=np.int32), rng.bytes(size)


# The child runs from source with `python -c` rather than importing this
# module, which would import pytest (~0.3 s a round); it shares `_payload`.
_SHARED = f"import numpy as np\n\nAGENTS = {AGENTS!r}\n\n\n" + inspect.getsource(_payload)
_CHILD = _SHARED + textwrap.dedent(
    """
    import os, random, sys
    from agentmem.archive import open_archive

    path, journal, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print("opening", flush=True)
    arc = open_archive(path)
    seqs = {}
    for agent in AGENTS:
        led = arc.get_ledger(agent)
        seqs[agent] = led.messages[0]["seq"] if led is not None else 0
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    # What we resume from is committed: record it, so the journal is never
    # more than one commit per agent behind the archive.
    os.write(fd, "".join(f"{a} {s}\\n" for a, s in seqs.items() if s).encode())
    print("ready", flush=True)
    order = random.Random(seed)
    while True:  # until the parent's SIGKILL
        agent = order.choice(AGENTS)
        seq = seqs[agent] + 1
        tokens, blob = _payload(agent, seq)
        n = len(tokens)
        with arc.transaction():
            arc.put_ledger(agent, tokens, [(0, n, "user", 0)],
                           [{"role": "user", "content": f"{agent}#{seq}", "seq": seq}])
            arc.put_state(agent, blob, codec="f16", n_tokens=n,
                          fingerprint={"agent": agent, "seq": seq})
            arc.log_event(agent, "write", seq=seq)
        os.write(fd, f"{agent} {seq}\\n".encode())
        seqs[agent] = seq
    """
)


def _journal(path: Path) -> dict[str, int]:
    last: dict[str, int] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:  # a kill can never tear a line shorter than PIPE_BUF, but be safe
                last[parts[0]] = max(last.get(parts[0], 0), int(parts[1]))
    return last


def _verify(path: str, journal: Path) -> tuple[int, int]:
    """Check every invariant; returns (states verified, states detected as corrupt)."""
    committed = _journal(journal)
    verified = corrupt = 0
    with open_archive(path) as arc:
        for agent in AGENTS:
            led = arc.get_ledger(agent)
            if led is None:
                assert agent not in committed, f"ledger of {agent} lost; journal says seq {committed[agent]}"
                assert arc.get_state_info(agent) is None
                continue
            seq = led.messages[0]["seq"]
            assert seq >= committed.get(agent, 0), (
                f"{agent}: archive at seq {seq}, journal committed {committed[agent]}"
            )
            assert seq <= committed.get(agent, 0) + 1, f"{agent}: archive at {seq}, journal only {committed.get(agent)}"
            tokens, blob = _payload(agent, seq)
            np.testing.assert_array_equal(led.tokens, tokens)
            try:
                state = arc.get_state(agent)
            except CodecError:
                corrupt += 1
                continue
            assert state is not None, f"{agent}: ledger without state"
            assert state.fingerprint == {"agent": agent, "seq": seq}, "ledger and state from different transactions"
            assert state.n_tokens == len(tokens) and state.blob == blob
            verified += 1
            assert arc.events(agent, limit=1)[0].data["seq"] == seq
    return verified, corrupt


@pytest.mark.slow
def test_sigkill_during_writes_loses_no_committed_transaction(backend: str, archive_target: str, tmp_path: Path) -> None:
    path, journal = archive_target, tmp_path / "journal.txt"
    kills = KILLS[backend]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    rng = random.Random(20240607)
    verified = corrupt = 0
    kills_mid_write = 0
    for round_no in range(kills):
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(path), str(journal), str(round_no)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            opening = proc.stdout.readline()  # type: ignore[union-attr]
            assert opening == b"opening\n", proc.stderr.read()  # type: ignore[union-attr]
            if round_no % 10 == 3:
                time.sleep(rng.uniform(0.0, 0.03))  # in open: creation, migration or WAL recovery
            else:
                ready = proc.stdout.readline()  # type: ignore[union-attr]
                assert ready == b"ready\n", proc.stderr.read()  # type: ignore[union-attr]
                time.sleep(rng.uniform(0.02, 0.35))
                kills_mid_write += 1
            assert proc.poll() is None, f"child died on its own: {proc.stderr.read()!r}"  # type: ignore[union-attr]
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            proc.stdout.close()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]
        v, c = _verify(path, journal)
        verified += v
        corrupt += c
    writes = sum(_journal(journal).values())
    # Every round kills the child; 9 in 10 kills land inside its write loop. How many
    # transactions commit before a kill depends on machine load (a busy CI box may commit
    # none in a round), so only require that writes happened at all, on average every other round.
    assert kills_mid_write >= 0.8 * kills and writes >= kills // 2, f"{kills_mid_write=}, {writes=}"
    assert verified > 0
    # SQLite's WAL commits and PostgreSQL's are atomic: no state should even need its checksum.
    assert corrupt == 0, f"{corrupt} states failed their checksum after SIGKILL"
