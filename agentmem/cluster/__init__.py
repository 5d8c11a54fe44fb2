"""Scale-out: several `agentmem serve` replicas over one shared archive, an agent served by one at a time.

* `leases` — `LeaseKeeper`: the agent leases of one replica (claim, bounded wait, renewal, idle release, fence).
* `local` — `LocalLeaseStore`: leases in one process's memory with the archive's semantics (tests, one replica).
* `pool` — `ClusterPool`: a `MemoryPool` whose archive writes are fenced and which re-reads one agent on demand.
* `replica` — `Replica`: what the server does around a call in cluster mode (lease, re-read, fenced commit).
* `audit` — `lease_intervals` / `overlaps`: checks from a lease log that no agent had two owners at once.
* `nginx` — `NginxConfig`: the consistent-hash (`X-Agent-Id`) proxy config in front of the replicas.
* `launcher` — `Cluster`: starts N replicas and nginx on one machine and stops them (`agentmem cluster up`).

See docs/scale-out.md.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from agentmem.cluster.leases import LeaseKeeper, LeaseStore
from agentmem.cluster.local import LocalLeaseStore
from agentmem.cluster.pool import ClusterPool
from agentmem.cluster.replica import CLUSTER_DURABILITY, Replica
from agentmem.models import MemoryPool

__all__ = ["CLUSTER_DURABILITY", "ClusterPool", "LeaseKeeper", "LeaseStore", "LocalLeaseStore", "Replica",
           "default_replica_id", "open_replica"]


def default_replica_id() -> str:
    """`host:pid`: unique among the replicas of one machine and across machines."""
    return f"{socket.gethostname()}:{os.getpid()}"


def open_replica(config: Any, settings: Any) -> tuple[MemoryPool, Replica]:
    """The pool and the lease keeper of one replica, from a `PoolConfig` and `ServerSettings` (cluster mode).

    With `archive_url` the leases use a connection of their own to the shared
    archive, so the renewal thread never waits behind a state write, and the
    leases can still be released after the pool has stored its agents and closed
    its connection. Otherwise (one SQLite archive, one replica) they share the pool's.
    """
    from agentmem.archive import open_archive

    pool = MemoryPool(config=config, open_engine=ClusterPool)
    engine = pool.engine()
    store = None
    try:
        url = getattr(config, "archive_url", None)
        store = open_archive(url) if url else engine.archive
        keeper = LeaseKeeper(store, owner=settings.replica_id or default_replica_id(), ttl_s=settings.lease_ttl_s)
        return pool, Replica(engine, keeper, durability=settings.durability, own_store=store is not engine.archive)
    except BaseException:
        if store is not None and store is not engine.archive:
            store.close()
        pool.close()
        raise
