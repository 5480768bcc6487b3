"""``--help`` and ``--version`` of the hook console scripts, in click, imported only when a person asks.

Input: ``sys.argv`` holding ``--help``, ``-h`` or ``--version`` (``asked_for_cli`` in ``_hooklib`` decides,
stdlib only). Output: the help or ``PROG VERSION`` on stdout, exit 0. slurmd runs the hooks with no
arguments, so the hot path never imports click; and answering here, before the hook's first step, is what
keeps ``--help`` from running the hook: no config read, no log line, no log file or spool created.
"""

from __future__ import annotations

import click

from node_agent.clikit import version_option

_HOW = (
    "\n\nRun by slurmd with no arguments and the job's environment; settings in /etc/fleetyield/hooks.conf "
    "($FLEETYIELD_HOOKS_CONF; keys and defaults: prolog_epilog/_hooklib.py, README). It logs to stderr and "
    "to the configured log_file (/var/log/fleetyield/hooks.log)."
)


def run(name: str, summary: str) -> None:
    """Answer ``--help`` / ``--version`` for hook ``name`` (``summary``: its first docstring line)."""

    @click.command(name, help=summary + _HOW, context_settings={"help_option_names": ["-h", "--help"]})
    @version_option()
    def hook() -> None:
        raise click.UsageError("a hook takes no arguments besides --help and --version (slurmd runs it)")

    hook(prog_name=name)
