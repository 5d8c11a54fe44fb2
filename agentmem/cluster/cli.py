"""`agentmem cluster`: run replicas behind nginx on one machine, or write the nginx config for several.

```bash
agentmem cluster up --replicas 2 --archive-url postgresql://agentmem@db/agentmem --port 8000 \\
    -- --model gemma-3-270m --n-ctx 8192 --threads 1
agentmem cluster nginx-config --listen 0.0.0.0:8000 --upstream 10.0.0.11:8000 --upstream 10.0.0.12:8000
```

`up` runs until SIGINT/SIGTERM, then stops nginx and the replicas cleanly (each
stores its agents and releases their leases). Flags after `--` go to every
`agentmem serve` replica.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

__all__ = ["add_arguments"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The subcommands of `agentmem cluster`."""
    cmds = p.add_subparsers(dest="cluster_command", metavar="CMD", required=True)
    up = cmds.add_parser("up", help="start N replicas and nginx on this machine; Ctrl-C stops them")
    up.add_argument("--replicas", type=int, default=2, help="agentmem serve processes (2)")
    up.add_argument("--archive-url", required=True, metavar="URL", help="the shared archive (postgresql://...)")
    up.add_argument("--host", default="127.0.0.1", help="interface of the proxy and the replicas (127.0.0.1)")
    up.add_argument("--port", type=int, default=8000, help="the proxy's port (8000); replica i listens on port+1+i")
    up.add_argument("--workdir", default="agentmem-cluster", help="nginx config, logs, replica logs (agentmem-cluster/)")
    up.add_argument("serve_args", nargs=argparse.REMAINDER, help="-- then flags for every agentmem serve replica")
    up.set_defaults(handler=_up)
    ng = cmds.add_parser("nginx-config", help="print an nginx config over replicas on several machines")
    ng.add_argument("--listen", default="127.0.0.1:8000", help="host:port nginx serves (127.0.0.1:8000)")
    ng.add_argument("--upstream", action="append", required=True, metavar="HOST:PORT", help="a replica (repeatable)")
    ng.add_argument("--workdir", default="/var/lib/agentmem-nginx", help="nginx pid, logs and temp files")
    ng.set_defaults(handler=_nginx_config)


def _up(args: argparse.Namespace) -> int:
    from agentmem.cluster.launcher import Cluster

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    extra = [a for a in args.serve_args if a != "--"] if args.serve_args[:1] == ["--"] else list(args.serve_args)
    cluster = Cluster(replicas=args.replicas, archive_url=args.archive_url, port=args.port, host=args.host,
                      serve_args=extra, workdir=args.workdir)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with cluster:
        sys.stderr.write(f"agentmem cluster: {cluster.url}/v1 over {args.replicas} replica(s); Ctrl-C stops\n")
        while not stop.wait(1.0):
            dead = [i for i, p in enumerate(cluster.procs) if p is not None and p.poll() is not None]
            if dead:
                sys.stderr.write(f"agentmem cluster: replica(s) {dead} exited; restarting\n")
                for i in dead:
                    cluster.start_replica(i)
    return 0


def _nginx_config(args: argparse.Namespace) -> int:
    from agentmem.cluster.nginx import NginxConfig

    cfg: Any = NginxConfig(listen=args.listen, upstreams=tuple(args.upstream), workdir=args.workdir)
    sys.stdout.write(cfg.render())
    return 0
