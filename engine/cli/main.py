"""The `stagetrail` command line.

This module declares every command and its options; the work of each command
lives in the module named after it (``engine.cli.runs``, ``show``, ``state``,
``replay``, ``diff``, ``fork``, ``verify``, ``compact``, ``export_import``,
``diagram``, ``projections``, ``demo``; ``ui`` holds ``ui`` and ``report``). Each
command imports its module only when it runs, so starting the program stays cheap.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

from engine.version import VERSION

F = TypeVar("F", bound=Callable[..., Any])

store_option = click.option(
    "--store",
    metavar="URL",
    default=None,
    help="Store URL (default: $STAGETRAIL_STORE, else sqlite:///stagetrail.db).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


class _Group(click.Group):
    """A group that turns stagetrail errors into one line on stderr and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # `stagetrail show RUN | head`: the reader left
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(1)
        except Exception as error:
            if ctx.find_root().params.get("debug") or not _reported(error):
                raise
            from engine.cli.common import clean

            click.echo(f"stagetrail: error: {clean(_one_line(error), one_line=True)}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("stagetrail: interrupted", err=True)
            sys.exit(130)


def given(name: str) -> bool:
    """Whether the running command's parameter `name` was given, not left to its default."""
    from click.core import ParameterSource

    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, ParameterSource.DEFAULT)


def refuse_alone(option: str, needed: str) -> NoReturn:
    """Refuse `option` given without `needed`, the option it only makes sense with.

    Raises:
        click.UsageError: always, naming both options (exit code 2, nothing done).
    """
    raise click.UsageError(f"{option} only applies with {needed}: give {needed}, or drop {option}")


def _reported(error: Exception) -> bool:
    """Whether `error` is ours, the database's or the system's: one line, not a traceback.

    The drivers are looked up, not imported: an error of one comes from a store opened.
    """
    if _ours(error) or isinstance(error, OSError):
        return True
    drivers = (sys.modules.get("sqlite3"), sys.modules.get("psycopg"))
    return any(driver is not None and isinstance(error, driver.Error) for driver in drivers)


def _ours(error: Exception) -> bool:
    """Whether stagetrail raised `error` on purpose (imported here: only errors need it)."""
    from events import StagetrailError

    return isinstance(error, StagetrailError)


def _one_line(error: Exception) -> str:
    text = " ".join(str(error).split())
    if _ours(error):
        return text
    return f"{'system' if isinstance(error, OSError) else 'database'}: {text}"


@click.group(cls=_Group, name="stagetrail")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.version_option(VERSION, package_name="stagetrail")
def main(debug: bool) -> None:
    """Record, audit and time-travel multi-stage pipeline runs."""


@main.command()
@store_option
def demo(store: str | None) -> None:
    """Record the examples into the store; suggest what to try next.

    Prints what was recorded, then three commands worth trying on those runs.
    """
    from engine.cli.demo.command import run_demo

    run_demo(store)


@main.command()
@click.option("--status", default=None, help="running, succeeded, failed, aborted_stuck, ...")
@click.option("--pipeline", default=None, help="Only runs of this pipeline.")
@click.option("--label", "labels", multiple=True, metavar="K=V", help="Only runs with this label.")
@click.option("--since", default=None, metavar="TIME", help="Started at or after (ISO 8601, 2d).")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(min=1))
@store_option
@json_option
def runs(
    status: str | None,
    pipeline: str | None,
    labels: tuple[str, ...],
    since: str | None,
    limit: int,
    store: str | None,
    as_json: bool,
) -> None:
    """List runs, newest first, from the run index."""
    from engine.cli.common import open_engine
    from engine.cli.runs import check_limit, list_runs

    limit = check_limit(limit)
    with open_engine(store, read_only=True) as engine:
        list_runs(
            engine,
            status=status,
            pipeline=pipeline,
            labels=labels,
            since=since,
            limit=limit,
            as_json=as_json,
        )


events_option = click.option(
    "--limit",
    default="1000",
    show_default=True,
    metavar="N|all",
    help="Show at most N events from --from, or all of them.",
)


@main.command()
@click.argument("run")
@click.option("--from", "start", default=1, type=click.IntRange(min=1), help="First event.")
@events_option
@store_option
@json_option
def show(run: str, start: int, limit: str, store: str | None, as_json: bool) -> None:
    """A run's timeline, one line per event.

    Decisions are marked with *; the run's status and reason close it. At most
    1000 events from --from (--limit N or all); a line says what was left out.
    """
    from engine.cli.common import count_or_all, open_engine, resolve_run
    from engine.cli.show import show_run

    most = count_or_all("--limit", limit)
    with open_engine(store, read_only=True) as engine:
        show_run(engine, resolve_run(engine, run), start=start, limit=most, as_json=as_json)


@main.command()
@click.argument("run")
@click.option("--at", default=None, metavar="N|TIME", help="After event N, or at a time.")
@click.option("--projection", default="state_stack", show_default=True, metavar="NAME")
@click.option(
    "--tree", is_flag=True, help="Fold the run and its child runs together (--at: a time only)."
)
@click.option(
    "--frames",
    default="20",
    show_default=True,
    metavar="N|all",
    help="Show the newest N frames of a state stack, or all of them.",
)
@click.option(
    "--items",
    default="100",
    show_default=True,
    metavar="N|all",
    help="Show N entries of each list or mapping of another projection's state, or all.",
)
@store_option
@json_option
def state(
    run: str,
    at: str | None,
    projection: str,
    tree: bool,
    frames: str,
    items: str,
    store: str | None,
    as_json: bool,
) -> None:
    """A projection of a run, now or at a past point.

    The state stack by default (its newest 20 frames; --frames N or all); --projection
    names any built-in or registered one (100 entries of each list or mapping; --items).
    --tree folds the run's child runs in too (task tables across child runs).
    """
    from engine.cli.common import open_engine, resolve_run
    from engine.cli.state import frame_limit, item_limit, show_state

    shown, entries = frame_limit(frames), item_limit(items)
    asked = {
        f"--{name}": text for name, text in (("frames", frames), ("items", items)) if given(name)
    }
    with open_engine(store, read_only=True) as engine:
        show_state(
            engine, resolve_run(engine, run), at, projection, tree=tree, frames=shown,
            items=entries, given=asked, as_json=as_json,
        )  # fmt: skip


@main.command()
@click.argument("run")
@click.option("--from", "start", default=1, type=click.IntRange(min=1), help="First event.")
@click.option("--to", "stop", default=None, type=click.IntRange(min=1), help="Last event.")
@events_option
@store_option
@json_option
def replay(
    run: str, start: int, stop: int | None, limit: str, store: str | None, as_json: bool
) -> None:
    """Step through a run, showing what each event changed.

    Under each event: the machine's state, the stack and the status it moved. At
    most 1000 events from --from (--limit N or all); a line says what was left out.
    """
    from engine.cli.common import count_or_all, open_engine, resolve_run
    from engine.cli.replay import replay_run

    most = count_or_all("--limit", limit)
    with open_engine(store, read_only=True) as engine:
        replay_run(engine, resolve_run(engine, run), start, stop, most, as_json=as_json)


@main.command()
@click.argument("run")
@click.argument("other", required=False)
@click.option("--from", "start", default=None, type=click.IntRange(min=0), help="Version A.")
@click.option("--to", "stop", default=None, type=click.IntRange(min=0), help="Version B.")
@store_option
@json_option
def diff(
    run: str,
    other: str | None,
    start: int | None,
    stop: int | None,
    store: str | None,
    as_json: bool,
) -> None:
    """Compare two points of a run, or two runs.

    RUN --from N [--to M] compares two points of one run; RUN_A RUN_B two runs.
    """
    from engine.cli.common import open_engine, resolve_run
    from engine.cli.diff import diff_points

    with open_engine(store, read_only=True) as engine:
        first = resolve_run(engine, run)
        second = None if other is None else resolve_run(engine, other)
        diff_points(engine, first, second, start, stop, as_json=as_json)


@main.command()
@click.argument("run")
@click.option("--at", type=int, required=True, help="Copy events 1..N into the new run.")
@store_option
@json_option
def fork(run: str, at: int, store: str | None, as_json: bool) -> None:
    """Start a new run from a copy of RUN's first N events."""
    from engine.cli.common import open_engine, resolve_run
    from engine.cli.fork import fork_run

    with open_engine(store) as engine:
        fork_run(engine, resolve_run(engine, run), at, as_json=as_json)


@main.command()
@store_option
@json_option
def compact(store: str | None, as_json: bool) -> None:
    """Physically remove the events of deleted runs.

    Deleting a run (a LangGraph thread's delete_thread, `retain`) is an event; this
    erases those runs' events and snapshots in short batches while other processes
    go on writing; the persistent projections forgot them when they folded the deletion.
    """
    from engine.cli.common import open_engine
    from engine.cli.compact import compact_store

    with open_engine(store) as engine:
        compact_store(engine, as_json=as_json)


@main.command()
@click.option(
    "--rule",
    "rules",
    multiple=True,
    required=True,
    help="status=A|B,pipeline=P,label=K:V,age=30d (all must hold); repeat for alternatives.",
)
@click.option(
    "--apply", is_flag=True, help="Delete the chosen runs and compact (default: dry run)."
)
@store_option
@json_option
def retain(rules: tuple[str, ...], apply: bool, store: str | None, as_json: bool) -> None:
    """Delete finished runs chosen by retention rules; a dry run unless --apply.

    Each deletion is a RunDeleted event recording its rule; --apply then compacts
    while other processes go on writing and folding.
    """
    from engine.cli.common import open_engine
    from engine.cli.retain import retain_runs
    from engine.retention import parse_rule

    parsed = [parse_rule(text) for text in rules]
    with open_engine(store) as engine:
        retain_runs(engine, parsed, apply=apply, as_json=as_json)


@main.command()
@click.option("--to", "target", default=None, metavar="PATH", help="Write a compact copy here.")
@click.option("--in-place", is_flag=True, help="Rewrite the store itself, under its write lock.")
@store_option
@json_option
def upgrade(target: str | None, in_place: bool, store: str | None, as_json: bool) -> None:
    """Rewrite an older SQLite store compact, then verify it.

    Stores written before compact storage keep run ids as text and topics in full;
    they work as they are, and nothing rewrites them unless asked. Give --to PATH
    (a new file; the store is only read) or --in-place (one write transaction;
    stop other writers first: one that opened the store before is refused).
    """
    from engine.cli.upgrade import upgrade_store
    from engine.store import default_url

    if (target is None) == (not in_place):
        raise click.UsageError("give --to PATH (a compact copy) or --in-place (not both)")
    if not upgrade_store(store or default_url(), target, in_place=in_place, as_json=as_json):
        sys.exit(1)


@main.command()
@click.argument("run", required=False)
@click.option("--all", "everything", is_flag=True, help="Verify every run of the store.")
@click.option(
    "--chain-only", is_flag=True, help="Check the hash chain alone (faster: nothing decoded)."
)
@click.option(
    "--worker-timeout",
    "worker_timeout",
    default=None,
    metavar="SECONDS",
    help="Seconds a chain worker may take to answer before all are stopped (default 60).",
)
@store_option
@json_option
def verify(
    run: str | None,
    everything: bool,
    chain_only: bool,
    worker_timeout: str | None,
    store: str | None,
    as_json: bool,
) -> None:
    """Re-check a run's hash chain and its table; exit 1 on problems.

    The chain of links over the stored events must be unbroken (docs/audit.md), and
    the run is folded through the table stored in it and every persistent projection
    (not with --chain-only).
    """
    from engine.cli.common import open_engine, resolve_run
    from engine.cli.verify import timeout_option, verify_all, verify_run

    if (run is None) == (not everything):
        raise click.UsageError("give a RUN or --all (not both)")
    timeout = timeout_option(worker_timeout)
    with open_engine(store, read_only=True) as engine:
        if everything:
            ok = verify_all(engine, as_json=as_json, chain_only=chain_only, timeout=timeout)
        else:
            rid = resolve_run(engine, str(run))
            ok = verify_run(engine, rid, as_json=as_json, chain_only=chain_only, timeout=timeout)
    if not ok:
        sys.exit(1)


@main.command()
@click.argument("runs", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Every top-level run (children follow).")
@click.option("--since", default=None, metavar="TIME", help="With --all: started at or after.")
@click.option(
    "--endpoint", default=None, metavar="URL",
    help="OTLP/HTTP receiver (default $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, localhost:4318).",
)  # fmt: skip
@click.option("--service", default="stagetrail", show_default=True, help="The service.name.")
@click.option("--follow", is_flag=True, help="Export runs live as events are recorded.")
@store_option
@json_option
def otel(
    runs: tuple[str, ...],
    everything: bool,
    since: str | None,
    endpoint: str | None,
    service: str,
    follow: bool,
    store: str | None,
    as_json: bool,
) -> None:
    """Export runs as OpenTelemetry traces (the otel extra).

    A run is a trace, each attempt a span; child runs are child spans. --json prints
    the spans as JSON Lines instead of sending them.
    """
    import threading

    from engine.cli.common import open_engine, resolve_run
    from engine.cli.otel import check_extra, chosen_runs, export
    from engine.cli.otel import follow as follow_store

    check_extra()
    if as_json and given("endpoint"):
        raise click.UsageError("--endpoint sends spans, --json prints them: give one, not both")
    if follow:
        if runs or everything or as_json or since is not None:
            raise click.UsageError("--follow takes no RUN, --all, --since or --json")
        with open_engine(store) as engine:
            try:
                follow_store(engine, endpoint=endpoint, service=service, stop=threading.Event())
            except KeyboardInterrupt:
                return
        return
    if bool(runs) == everything or (since is not None and not everything):
        raise click.UsageError("name the runs to export, or give --all (with --since)")
    with open_engine(store, read_only=True) as engine:
        chosen = chosen_runs(engine, [resolve_run(engine, r) for r in runs], since)
        export(
            engine, chosen, endpoint=endpoint, service=service, as_json=as_json, every=everything
        )


@main.command("export")
@click.argument("runs", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Export every run, oldest first.")
@store_option
def export_(runs: tuple[str, ...], everything: bool, store: str | None) -> None:
    """Write runs as JSON Lines on stdout, for import.

    One event per line, each run's events in order; --all writes every run, oldest first.
    """
    from engine.cli.common import open_engine, resolve_run
    from engine.cli.export_import import export_runs

    if bool(runs) == everything:
        raise click.UsageError("name the runs to export, or give --all (not both)")
    with open_engine(store, read_only=True) as engine:
        chosen = None if everything else [resolve_run(engine, run) for run in runs]
        export_runs(engine, chosen)


@main.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option(
    "--unchained",
    is_flag=True,
    help="Import runs without a chain head (an older release's export), unchecked.",
)
@store_option
@json_option
def import_(file: str, unchained: bool, store: str | None, as_json: bool) -> None:
    """Read runs from an export file, checked first.

    FILE is JSON Lines (- reads stdin). Nothing is written unless every line is valid;
    each run is written in one transaction; runs already there, identical, are skipped.
    A run without a chain head is refused unless --unchained is given.
    """
    from engine.cli.common import open_engine
    from engine.cli.export_import import import_runs

    with open_engine(store, create=True) as engine:
        import_runs(engine, file, as_json=as_json, unchained=unchained)


@main.command()
@click.argument("target", metavar="PIPELINE_OR_RUN")
@click.option("--format", "kind", type=click.Choice(["mermaid", "dot"]), default="mermaid")
@store_option
def diagram(target: str, kind: str, store: str | None) -> None:
    """Draw a run's or a pipeline's transition table.

    A run's own recorded table, its state highlighted, or a Pipeline named module:attr.
    """
    from engine.cli.diagram import draw

    draw(target, kind, store)


@main.group()
def projections() -> None:
    """List, watch and rebuild persistent projections."""


@projections.command("list")
@store_option
@json_option
def projections_list(store: str | None, as_json: bool) -> None:
    """The projections known by name: the built-ins and those this store keeps."""
    from engine.cli.common import open_engine
    from engine.cli.projections import list_projections

    with open_engine(store, read_only=True) as engine:
        list_projections(engine, as_json=as_json)


@projections.command("status")
@store_option
@json_option
def projections_status(store: str | None, as_json: bool) -> None:
    """Position, head, lag and last error of each persistent projection."""
    from engine.cli.common import open_engine
    from engine.cli.projections import projection_status

    with open_engine(store, read_only=True) as engine:
        projection_status(engine, as_json=as_json)


@projections.command("rebuild")
@click.argument("name")
@store_option
@json_option
def projections_rebuild(name: str, store: str | None, as_json: bool) -> None:
    """Fold projection NAME (a built-in name or ``module:attr``) again from the first event."""
    from engine.cli.common import open_engine
    from engine.cli.projections import rebuild_projection

    with open_engine(store) as engine:
        rebuild_projection(engine, name, as_json=as_json)


@main.command()
@store_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; anything but loopback exposes your runs.",
)
@click.option(
    "--port",
    default=8765,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Port to listen on.",
)
def ui(store: str | None, host: str, port: int) -> None:
    """Browse runs in a local, read-only web viewer.

    Runs page, run page with a timeline, the diagram and a time slider; needs the
    ui extra (pip install 'stagetrail[ui]'). Never creates a store.
    """
    from engine.cli.ui import serve

    serve(store, host, port)


@main.command()
@click.argument("run")
@click.option("--html", "path", required=True, metavar="FILE", help="The file to write.")
@click.option("--force", is_flag=True, help="Replace FILE if it exists (never the store).")
@click.option("--full", is_flag=True, help="Hold every event and state, however long the run.")
@click.option(
    "--full-limit",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    metavar="N",
    help="The longest run --full writes.",
)
@store_option
@json_option
def report(
    run: str,
    path: str,
    force: bool,
    full: bool,
    full_limit: int,
    store: str | None,
    as_json: bool,
) -> None:
    """Write a run's page as one self-contained HTML file.

    Inline CSS, script and diagram, and the state at every version: the slider
    works offline, from a file. A run past 1,000 events keeps its newest 1,000
    and 50 evenly spaced earlier states (the report says so); --full holds every
    event and state, for runs up to --full-limit events. An existing FILE is
    replaced only with --force; the store itself never.
    """
    from engine.cli.ui import report as write

    if given("full_limit") and not full:
        refuse_alone("--full-limit", "--full")
    write(store, run, path, as_json=as_json, force=force, full=full, full_limit=full_limit)
