"""CLI conventions shared by every FleetYield console script: ``--version``, ``--json`` and JSON errors.

Input: click commands and groups. Output: ``version_option`` (the installed ``fleetyield`` distribution's
version, read through importlib.metadata when ``--version`` is asked), ``json_option``, ``emit`` (one JSON
document on stdout), ``CliError`` (a refusal with its exit status and optional JSON fields) and
``JsonErrorGroup``: a group under which, when ``--json`` is on the command line, a failing command's error
is one JSON object ``{"error": "..."}`` on stderr instead of click's text, with the same non-zero exit
status (1 refused, 2 usage or input). Stdout then holds only data, so ``cmd --json | jq`` never parses an
error by mistake, and scripts read the status.

It lives in the agent's package because the controller's already imports it (``node_agent.protocol``) and
never the reverse: the agent and the hooks stay free of the controller's dependencies.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import click

DIST = "fleetyield"
JSON_FLAG = "--json"
_META_KEY = "fleetyield.json_errors"


def version_option() -> Callable[[Any], Any]:
    """``--version``: ``PROG VERSION`` from the installed distribution's metadata (read only when asked)."""
    return click.version_option(package_name=DIST, message="%(prog)s %(version)s")


def json_option(help: str = "Machine-readable output (JSON on stdout; errors as JSON on stderr).") -> Any:
    return click.option("--json", "as_json", is_flag=True, help=help)


def emit(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=True))


class CliError(click.ClickException):
    """A command's refusal: ``message`` (text, or ``{"error": message, **fields}`` under ``--json``) and
    ``exit_code`` (1 refused, 2 usage / input; click's own ``ClickException`` is 1)."""

    def __init__(self, message: str, exit_code: int = 1, **fields: Any) -> None:
        super().__init__(message)
        # click types exit_code as a ClassVar, yet main() reads it from the instance: per-refusal codes
        self.exit_code = exit_code  # type: ignore[misc]
        self.fields = fields


class JsonError(click.ClickException):
    """What any ``ClickException`` becomes when ``--json`` was given: shown as one JSON line on stderr."""

    def __init__(self, cause: click.ClickException) -> None:
        super().__init__(cause.format_message())
        self.exit_code = cause.exit_code  # type: ignore[misc]  # (see CliError)
        self.fields: dict[str, Any] = dict(getattr(cause, "fields", {}))

    def show(self, file: Any = None) -> None:
        click.echo(json.dumps({**self.fields, "error": self.message}, sort_keys=True), err=True)


def json_requested(args: Sequence[str]) -> bool:
    """``--json`` among the options (before a ``--`` that ends them)."""
    for arg in args:
        if arg == "--":
            return False
        if arg == JSON_FLAG:
            return True
    return False


class JsonErrorGroup(click.Group):
    """A group whose errors (its own usage errors, and every subcommand's) are JSON under ``--json``.

    Parsing a subcommand's options happens in the parent's ``invoke``, so the flag is read from the raw
    arguments once, at the outermost group, and kept in the context tree's shared ``meta``."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        wanted = json_requested(args) or bool(parent is not None and parent.meta.get(_META_KEY))
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except click.ClickException as exc:
            raise _as_json(exc) if wanted else exc from None
        ctx.meta[_META_KEY] = wanted
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            if ctx.meta.get(_META_KEY):
                raise _as_json(exc) from None
            raise


def _as_json(exc: click.ClickException) -> click.ClickException:
    return exc if isinstance(exc, JsonError) else JsonError(exc)
