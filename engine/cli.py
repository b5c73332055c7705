"""The `stagetrail` command line."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from events import StagetrailError

F = TypeVar("F", bound=Callable[..., Any])

store_option = click.option(
    "--store",
    metavar="URL",
    default=None,
    help="Store URL (default: $STAGETRAIL_STORE, else sqlite:///stagetrail.db).",
)


class _Group(click.Group):
    """A group that turns stagetrail errors into one line on stderr and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except StagetrailError as error:
            if ctx.find_root().params.get("debug"):
                raise
            click.echo(f"stagetrail: error: {error}", err=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.version_option(package_name="stagetrail")
def main(debug: bool) -> None:
    """Record, audit and time-travel multi-stage pipeline runs."""


@main.command()
@store_option
def demo(store: str | None) -> None:
    """Record the example pipelines into the store and summarise what was recorded."""
    from engine._demo import run_demo

    run_demo(store)
