"""The ``busd`` command line.

The ``main`` group is here; its commands are in one module per kind:

- ``serve``: the daemon (:mod:`.serve`);
- ``tail``, ``publish``, ``ingest``: the event stream (:mod:`.stream`);
- ``watch``, ``web``, ``demo``: the frontends (:mod:`.frontends`);
- ``sessions``, ``export``: the journal (:mod:`.history`);
- ``journal check``, ``journal recover``: a damaged journal (:mod:`.journal`);
- ``run``, ``cancel``: a headless agent run, and ending one (:mod:`.run`);
- ``attach``: follow an agent busd did not start (:mod:`.attach`);
- ``hook``, ``hooks``, ``statusline``: an agent's own hooks report to busd (:mod:`.hooks`);
- ``catalog``, ``status``, ``plugins``: what busd knows and runs (:mod:`.info`).

What they share (``--socket``, failing with a message, running a client) is in
:mod:`._common`. The command modules never import this one.
"""

from __future__ import annotations

import click

from .._version import __version__
from . import attach, frontends, history, hooks, info, journal, run, serve, stream

__all__ = ["main"]


@click.group()
@click.version_option(__version__, prog_name="busd")
def main() -> None:
    """busd: one ordered, typed, coalesced event stream for AI coding agents."""


main.add_command(attach.attach)
main.add_command(info.catalog)
main.add_command(info.schema)
main.add_command(frontends.demo)
main.add_command(history.export)
main.add_command(hooks.hook)
main.add_command(hooks.hooks)
main.add_command(stream.ingest)
main.add_command(journal.journal_group)
main.add_command(info.plugins)
main.add_command(stream.publish)
main.add_command(run.run_command)
main.add_command(run.cancel_command)
main.add_command(serve.serve)
main.add_command(history.sessions_command)
main.add_command(info.status)
main.add_command(hooks.statusline)
main.add_command(stream.tail)
main.add_command(frontends.watch)
main.add_command(frontends.web)
