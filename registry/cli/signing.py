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
        status = s.get("status") or ("verified" if s.get("verified") else "unverified")
        when = s.get("created_at", "")[:19] or f"({s.get('file')}, of {s.get('of')})"
        lines.append(f"  {s['method']:<11} {s['signer']}  {when}  {status}")
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
@click.option("--fast", is_flag=True,
              help="Check the signatures against the manifest's digests only, without hashing "
                   "the stored files again.")
@click.pass_context
def verify(ctx: click.Context, ref: str, keys: tuple[str, ...], cas: tuple[str, ...],
           as_json: bool, fast: bool) -> None:
    """Verify the signatures of REF with trusted keys and hash every file they cover again;
    exit 13 when none verifies or a stored file is not the bytes signed."""
    reg = open_registry(ctx)
    mv = reg.show(ref)
    good = reg.verify(mv.ref, public_keys=keys or None, certificates=cas or None, fast=fast)
    checked = "digests only (--fast)" if fast else "every file re-hashed"
    if as_json:
        emit_json([{**s.to_dict(), "checked": "digests" if fast else "bytes"} for s in good])
    for s in good if not as_json else ():
        click.echo(f"verified {mv.ref}: {s.method} {s.signer} ({s.created_at[:19]}); "
                   f"{checked}")
    if not good:
        count = len(mv.metadata.get("signatures", []))
        raise SignatureError(f"no signature of {mv.ref} verifies with a trusted key ({count} "
                             "signature(s), none by a key given with --key or in "
                             "REGISTRY_TRUSTED_KEYS)")


COMMANDS = [sign, verify]
