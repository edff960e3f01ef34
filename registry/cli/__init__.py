"""The ``registry`` command: each subcommand is one call of the Registry facade.

A RegistryError prints one line on stderr and exits with the error's exit code; no traceback.
The root group only assembles the command modules (``models``, ``admin``, ``service``); they
share ``_context`` and never import this module.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, NoReturn

import click

from ..errors import RegistryError
from . import admin, cache, exports, governance, models, oci, provenance, service, signing, webhooks


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="torch-registry")
def cli() -> None:
    """A model registry for PyTorch: push any checkpoint, pull it on any device."""


for _module in (models, exports, signing, provenance, governance, admin, cache, service, oci,
                webhooks):
    for _command in _module.COMMANDS:
        cli.add_command(_command)


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """A warning as the command's other messages are: one line on stderr, without the file,
    line number and source line Python's default format adds."""
    click.echo(f"warning: {' '.join(str(message).split())}", err=True)


def main(argv: list[str] | None = None) -> NoReturn:
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            cli.main(args=argv, prog_name="registry", standalone_mode=False)
    except RegistryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except OSError as exc:
        click.echo(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), err=True)
        sys.exit(1)
    sys.exit(0)
