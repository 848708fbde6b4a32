"""The ``manyfiles`` command: a click group whose subcommands load lazily.

Each verb lives in its own module (``ls``, ``shard``, ``s3pull``, ``rm``, ``trace``, ``info``,
``cache``, ``check``); all but ``info``, ``cache`` and ``check`` are also installed as standalone
scripts (``fastls``, ``shard``, ...).  The
CLI only parses, calls the library and renders; exit codes (``_common.exit_code``, the table in
docs/cli.md): 0 ok, 1 runtime failure, 2 usage error, 130 interrupted.
"""

from __future__ import annotations

import importlib

import click

from manyfiles.cli._common import GROUP_OPTIONS, run_main, version_option

# subcommand name -> module under manyfiles.cli that defines ``command``
SUBCOMMANDS = {
    "info": "info",
    "ls": "ls",
    "shard": "shard",
    "pull": "s3pull",
    "push": "s3push",
    "rm": "rm",
    "trace": "trace",
    "cache": "cache",
    "check": "check",
}


class LazyGroup(click.Group):
    """Imports a subcommand's module only when it is run (keeps start-up fast)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = SUBCOMMANDS.get(name)
        if module is None:
            return None
        try:
            return importlib.import_module(f"manyfiles.cli.{module}").command
        except ModuleNotFoundError:
            return None


@click.group(cls=LazyGroup, **GROUP_OPTIONS)
@version_option("manyfiles")
def group() -> None:
    """Move data when there are too many files."""


def main() -> None:
    """Entry point of the ``manyfiles`` script."""
    run_main(group, "manyfiles")
