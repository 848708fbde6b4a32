"""``manyfiles info``: version, Python, platform, C core, listing backends, extras."""

from __future__ import annotations

import click

from manyfiles._core.checkpoints import reached as checkpoint
from manyfiles._info import info
from manyfiles.cli._common import echo_json, json_option


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@json_option("One JSON object (one line) instead of text.")
def command(as_json: bool) -> int:
    """Show what this installation can do: C core built or not (and why), backends, extras."""
    checkpoint("command")  # every command passes here once parsed, before any work
    about = info()
    if as_json:
        echo_json(about.to_dict())
    else:
        click.echo(str(about))
    return 0
