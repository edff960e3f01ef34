"""``registry sign`` and ``registry verify``: OpenSSF Model Signing signatures of a version."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click

from ..errors import SignatureError
from ._context import emit_json, open_registry


def signatures_table(signatures: Sequence[Mapping[str, Any]]) -> str:
    """The signatures of ``registry show``: method, signer, time, and whether verified."""
    lines = ["signatures:"]
    for s in signatures:
        mark = " verified" if s.get("verified") else ""
        lines.append(f"  {s['method']:<11} {s['signer']}  {s['created_at'][:19]}{mark}")
    return "\n".join(lines)


@click.command()
@click.argument("ref")
@click.option("--key", required=True, type=click.Path(exists=True, dir_okay=False),
              help="EC private key (PEM) to sign with.")
@click.option("--certificate", type=click.Path(exists=True, dir_okay=False),
              help="Signing certificate (PEM) of --key, for certificate signing.")
@click.option("--chain", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Intermediate certificate (PEM) between --certificate and the root.")
@click.pass_context
def sign(ctx: click.Context, ref: str, key: str, certificate: str | None,
         chain: tuple[str, ...]) -> None:
    """Sign version REF: an OMS bundle over its files and manifest, stored with it."""
    reg = open_registry(ctx)
    mv = reg.show(ref)
    signature = reg.sign(mv.ref, key=key, certificate=certificate, chain=chain)
    click.echo(f"signed {mv.ref} as {signature.method} {signature.signer}")


@click.command()
@click.argument("ref")
@click.option("--key", "keys", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Trusted public key (PEM); default REGISTRY_TRUSTED_KEYS.")
@click.option("--ca", "cas", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Trusted CA certificate (PEM); default REGISTRY_TRUSTED_CERTS.")
@click.option("--json", "as_json", is_flag=True, help="Print the verified signatures as JSON.")
@click.pass_context
def verify(ctx: click.Context, ref: str, keys: tuple[str, ...], cas: tuple[str, ...],
           as_json: bool) -> None:
    """Verify the signatures of REF with trusted keys; exit 13 when none verifies."""
    reg = open_registry(ctx)
    mv = reg.show(ref)
    good = reg.verify(mv.ref, public_keys=keys or None, certificates=cas or None)
    if as_json:
        emit_json([s.to_dict() for s in good])
    for s in good if not as_json else ():
        click.echo(f"verified {mv.ref}: {s.method} {s.signer} ({s.created_at[:19]})")
    if not good:
        count = len(mv.metadata.get("signatures", []))
        raise SignatureError(f"no signature of {mv.ref} verifies with a trusted key ({count} "
                             "signature(s), none by a key given with --key or in "
                             "REGISTRY_TRUSTED_KEYS)")


COMMANDS = [sign, verify]
