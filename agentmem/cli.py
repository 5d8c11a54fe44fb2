"""The `agentmem` command.

`main(argv)` builds one argparse parser with a subcommand per area and runs
the chosen handler. Each area registers itself through a function in
`COMMANDS` that adds its subparser and sets `handler` on it, so a new
area is one more function in that list.

Commands today:

```text
agentmem --version
agentmem archive ls PATH [--json]
agentmem archive show PATH AGENT [--events N] [--json]
agentmem archive rm PATH AGENT [AGENT ...]
agentmem archive vacuum PATH
agentmem archive search PATH QUERY [--agent AGENT] [-k K]
agentmem bench NAME [options]      every benchmark in agentmem.bench.BENCHMARKS (switch)
agentmem serve [options]           the OpenAI-compatible server (agentmem.server; extra [server])
agentmem cluster up|nginx-config   replicas behind nginx over a shared archive (agentmem.cluster)
```

Errors agentmem raises on purpose (and OS errors) print one line on stderr and
exit with status 2, without a traceback; so does an unknown benchmark name.
`ls`, `show` and `search` open the archive read-only, so they work while a pool
is using it; `rm` and `vacuum` need the archive's exclusive lock.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from agentmem.errors import ConfigError, UnknownAgentError
from agentmem.server.command import EXIT_ERROR, EXIT_OK, SERVE_DESCRIPTION, SERVE_HELP, Handler, run_handler

if TYPE_CHECKING:  # the archive is imported on use, so `agentmem --help` stays fast
    from agentmem.archive.records import AgentRecord, EventRecord, LedgerRecord, StateInfo

__all__ = ["COMMANDS", "build_parser", "human_bytes", "main"]


class _Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose usage errors can be one line (`brief_errors=True`).

    Sub-parsers made with `add_parser` are of this class too and take the keyword.
    """

    def __init__(self, *args: Any, brief_errors: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.brief_errors = brief_errors

    def error(self, message: str) -> NoReturn:
        if not self.brief_errors:
            super().error(message)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class _VersionAction(argparse.Action):
    """`--version`: prints agentmem's and llama-cpp-python's versions, then exits 0.

    The versions are read when the flag is used, so building the parser imports nothing.
    """

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        from agentmem import __version__

        print(f"agentmem {__version__} (llama-cpp-python {_package_version('llama-cpp-python')})")
        parser.exit(EXIT_OK)


def human_bytes(n: float) -> str:
    """Format a byte count with binary units.

    Example:
        >>> human_bytes(0), human_bytes(1536), human_bytes(18_400_000)
        ('0 B', '1.5 KiB', '17.5 MiB')
    """
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: set[int]) -> str:
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _open(path: str, *, readonly: bool) -> Any:
    """The archive named by `path`: a SQLite file or a `postgresql://` URL."""
    # Imported here so `agentmem --help` stays fast and independent of numpy.
    from agentmem.archive import open_archive

    return open_archive(path, readonly=readonly)


def _label(path: str) -> str:
    """`path` as printed: a PostgreSQL URL loses its password."""
    from agentmem.archive.postgres import is_postgres_url, redact_url

    return redact_url(path) if is_postgres_url(path) else path


# --------------------------------------------------------------------------- archive


def _archive_ls(args: argparse.Namespace) -> int:
    with _open(args.path, readonly=True) as arc:
        agents = arc.list_agents()
    if args.json:
        print(json.dumps([dataclasses.asdict(a) | {"n_bytes": a.n_bytes} for a in agents], indent=2))
        return EXIT_OK
    if not agents:
        print(f"{_label(args.path)}: no agents")
        return EXIT_OK
    rows = [
        (
            a.agent_id,
            a.priority,
            a.ledger_tokens,
            a.tier or "-",
            a.codec or "-",
            human_bytes(a.n_bytes),
            _when(a.updated),
        )
        for a in agents
    ]
    print(_table(("AGENT", "PRIORITY", "TOKENS", "TIER", "CODEC", "BYTES", "UPDATED"), rows, {2, 5}))
    total = sum(a.n_bytes for a in agents)
    print(f"{len(agents)} agent(s), {human_bytes(total)}")
    return EXIT_OK


def _archive_show(args: argparse.Namespace) -> int:
    with _open(args.path, readonly=True) as arc:
        agent = arc.get_agent(args.agent)
        if agent is None:
            raise UnknownAgentError(f"{_label(args.path)}: no agent {args.agent!r}")
        ledger = arc.get_ledger(args.agent)
        state = arc.get_state_info(args.agent)
        events = arc.events(args.agent, limit=args.events)
        n_evicted = len(arc.list_evicted(args.agent))
    if args.json:
        print(json.dumps(_show_json(agent, ledger, state, n_evicted, events), indent=2, default=str))
        return EXIT_OK
    _print_agent(agent)
    print()
    _print_ledger(ledger)
    print(f"evicted   {n_evicted} span(s) archived")
    _print_state(state)
    print()
    _print_events(events)
    return EXIT_OK


def _show_json(
    agent: AgentRecord, ledger: LedgerRecord | None, state: StateInfo | None, n_evicted: int,
    events: Sequence[EventRecord],
) -> dict[str, Any]:
    """`archive show --json`: the agent's record, a ledger summary, its state, evicted spans and events."""
    return {
        "agent": dataclasses.asdict(agent),
        "ledger": None
        if ledger is None
        else {
            "n_tokens": ledger.n_tokens,
            "regions": ledger.regions,
            "n_messages": None if ledger.messages is None else len(ledger.messages),
        },
        "state": None if state is None else dataclasses.asdict(state),
        "evicted_spans": n_evicted,
        "events": [dataclasses.asdict(e) for e in events],
    }


def _print_agent(agent: AgentRecord) -> None:
    print(f"agent     {agent.agent_id}")
    print(f"priority  {agent.priority}")
    print(f"labels    {json.dumps(agent.labels, ensure_ascii=False)}")
    print(f"created   {_when(agent.created)}")
    print(f"updated   {_when(agent.updated)}")


def _print_ledger(ledger: LedgerRecord | None) -> None:
    """The ledger's size and its spans counted per region."""
    if ledger is None:
        print("ledger    none")
        return
    n_msgs = "-" if ledger.messages is None else len(ledger.messages)
    print(f"ledger    {ledger.n_tokens} tokens, {len(ledger.regions)} spans, {n_msgs} messages")
    spans: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    for start, end, region, _flags in ledger.regions:
        spans[region] += 1
        tokens[region] += end - start
    if spans:
        rows = [(r, spans[r], tokens[r]) for r in sorted(spans)]
        print(_indent(_table(("REGION", "SPANS", "TOKENS"), rows, {1, 2})))


def _print_state(state: StateInfo | None) -> None:
    if state is None:
        print("state     none")
        return
    print(
        f"state     {state.tier}, {state.codec}, {state.n_tokens} tokens, "
        f"{human_bytes(state.n_bytes)}, stored {_when(state.created)}"
    )
    print(f"checksum  {state.checksum}")
    print(f"fingerprint {json.dumps(state.fingerprint, sort_keys=True)}")


def _print_events(events: Sequence[EventRecord]) -> None:
    if not events:
        print("events    none")
        return
    print(f"events    (newest {len(events)})")
    event_rows = [(_when(e.ts), e.kind, json.dumps(e.data, ensure_ascii=False)) for e in events]
    print(_indent(_table(("TIME", "KIND", "DATA"), event_rows, set())))


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def _archive_rm(args: argparse.Namespace) -> int:
    with _open(args.path, readonly=False) as arc:
        missing = [a for a in args.agents if arc.get_agent(a) is None]
        if missing:
            raise UnknownAgentError(f"{_label(args.path)}: no agent {', '.join(map(repr, missing))}; nothing removed")
        with arc.transaction():
            for agent_id in args.agents:
                arc.delete_agent(agent_id)
    for agent_id in args.agents:
        print(f"removed {agent_id}")
    return EXIT_OK


def _archive_vacuum(args: argparse.Namespace) -> int:
    with _open(args.path, readonly=False) as arc:
        result = arc.vacuum()
    saved = result.bytes_before - result.bytes_after
    print(
        f"{_label(args.path)}: {human_bytes(result.bytes_before)} -> {human_bytes(result.bytes_after)} "
        f"({human_bytes(saved)} freed)"
    )
    return EXIT_OK


def _archive_search(args: argparse.Namespace) -> int:
    if args.k < 1:
        raise ConfigError(f"-k must be at least 1, got {args.k}")
    with _open(args.path, readonly=True) as arc:
        hits = arc.search_evicted(args.agent, args.query, k=args.k)
    if not hits:
        print("no matches")
        return EXIT_OK
    for h in hits:
        text = " ".join(h.text.split())
        text = text if len(text) <= 100 else text[:97] + "..."
        print(f"{h.score:7.3f}  {h.agent_id}  [{h.start}:{h.end}] {h.region}  {text}")
    return EXIT_OK


def _add_archive_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("archive", help="inspect and maintain an agentmem SQLite archive")
    cmds = p.add_subparsers(dest="archive_command", metavar="COMMAND", required=True)

    ls = cmds.add_parser("ls", help="list agents with tokens, tier, codec and bytes")
    ls.add_argument("path", metavar="PATH", help="a SQLite archive file or a postgresql:// URL")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(handler=_archive_ls)

    show = cmds.add_parser("show", help="show one agent: record, ledger, state, events")
    show.add_argument("path", metavar="PATH", help="a SQLite archive file or a postgresql:// URL")
    show.add_argument("agent", metavar="AGENT")
    show.add_argument("--events", type=int, default=10, metavar="N", help="recent events to show (10)")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=_archive_show)

    rm = cmds.add_parser("rm", help="delete agents with their ledger, state and history")
    rm.add_argument("path", metavar="PATH", help="a SQLite archive file or a postgresql:// URL")
    rm.add_argument("agents", metavar="AGENT", nargs="+")
    rm.set_defaults(handler=_archive_rm)

    vac = cmds.add_parser("vacuum", help="compact the file; prints bytes before/after")
    vac.add_argument("path", metavar="PATH", help="a SQLite archive file or a postgresql:// URL")
    vac.set_defaults(handler=_archive_vacuum)

    search = cmds.add_parser("search", help="full-text search of evicted text")
    search.add_argument("path", metavar="PATH", help="a SQLite archive file or a postgresql:// URL")
    search.add_argument("query", metavar="QUERY")
    search.add_argument("--agent", default=None, help="only this agent's spans")
    search.add_argument("-k", type=int, default=5, help="results (5)")
    search.set_defaults(handler=_archive_search)


# --------------------------------------------------------------------------- bench


def _add_bench_commands(sub: argparse._SubParsersAction) -> None:
    # Imported here: agentmem.bench is a registry of module names, cheap to read.
    from agentmem.bench import BENCHMARKS

    p = sub.add_parser(
        "bench",
        help="run a benchmark shipped with agentmem",
        description="Benchmarks shipped with agentmem; `agentmem bench NAME --help` lists a benchmark's options.",
        brief_errors=True,
    )
    cmds = p.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, module_name in BENCHMARKS.items():
        module = importlib.import_module(module_name)
        summary = (module.__doc__ or name).strip().split("\n\n")[0].replace("\n", " ")
        bench = cmds.add_parser(name, help=summary, description=summary)
        module.add_arguments(bench)
        bench.set_defaults(handler=module.run_args)


# --------------------------------------------------------------------------- serve


def _add_serve_command(sub: argparse._SubParsersAction) -> None:
    # agentmem.server.cli imports no optional dependency; its handler says what to install.
    from agentmem.server.cli import add_arguments, run_args

    p = sub.add_parser("serve", help=SERVE_HELP, description=SERVE_DESCRIPTION)
    add_arguments(p)
    p.set_defaults(handler=run_args)


def _add_cluster_command(sub: argparse._SubParsersAction) -> None:
    from agentmem.cluster.cli import add_arguments

    p = sub.add_parser("cluster", help="replicas behind nginx over a shared archive (see docs/scale-out.md)",
                       description="Scale-out: agentmem serve replicas behind nginx (docs/scale-out.md).")
    add_arguments(p)


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_archive_commands,
    _add_bench_commands,
    _add_serve_command,
    _add_cluster_command,
]
"""Functions that each add one top-level subcommand (with `handler` defaults)."""


def build_parser() -> argparse.ArgumentParser:
    """The `agentmem` argument parser with every registered subcommand and `--version`."""
    parser = _Parser(prog="agentmem", description="agentmem command-line tools")
    parser.add_argument("--version", action=_VersionAction, help="print agentmem's and llama-cpp-python's versions")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `agentmem` command; returns the exit status.

    Args:
        argv: arguments without the program name; `None` reads `sys.argv`.

    Returns:
        0 on success, 2 on errors (usage errors exit through argparse with 2).

    Example:
        >>> main(["archive", "ls", "/nonexistent/agents.db"])
        2
    """
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    return run_handler(handler, args)  # errors: one line on stderr, status 2 (agentmem.server.command)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
