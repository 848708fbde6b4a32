"""``manyfiles info``: version, Python, platform, C core, listing backends, extras."""

from __future__ import annotations

import json

import click

from manyfiles._info import info


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
def command(as_json: bool) -> int:
    """Show what this installation can do: C core built or not (and why), backends, extras."""
    about = info()
    click.echo(json.dumps(about.to_dict(), indent=2) if as_json else str(about))
    return 0
