"""Signing (rows 34-36): what signatures cost. A pull under ``REGISTRY_VERIFY=require`` against
the same pull with verification off; ``Registry.verify`` against the reference package's
verification of the same files; a push with ``sign_key`` against the same push without."""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

import registry
from registry.caching.cache import SIGNATURE_MEMOS
from registry.signing import oms

from .helpers import FACTORY, Bench, Case, duration, env, interleaved, kwargs, touch_module
from .report import Row


def _key_pair(directory: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = directory / "key.pem", directory / "pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def signed_rows(b: Bench) -> list[Row]:
    try:
        import model_signing.verifying
    except ImportError as exc:
        rows = [Row(n, m, c, t) for n, m, c, t in _ROWS]
        for r in rows:
            r.notes.append(f"Not run: the signing extra is not installed ({exc}).")
        return rows
    private, public = _key_pair(b.scratch("keys"))
    b.reg.sign(b.ref, key=private)
    home = b.work / "home"
    with env(REGISTRY_VERIFY="off"):
        off = registry.Registry(home=home)
    with env(REGISTRY_VERIFY="require", REGISTRY_TRUSTED_KEYS=str(public)):
        strict = registry.Registry(home=home)

    # Row 34: the pull with and without the policy. A pull is short (tens of ms) beside a fixed
    # cost of a millisecond or two, so this row takes more samples than the others.
    memos = home / "cache" / SIGNATURE_MEMOS

    def first_check() -> None:  # as if this machine had never checked this signature
        oms.forget_verified()
        shutil.rmtree(memos, ignore_errors=True)

    t = interleaved({
        "off": Case(lambda: touch_module(off.pull(b.ref, device="cpu"))),
        # As the first pull of the version in a new process: the check written down in the
        # cache by an earlier process answers (later pulls in a process hit its own memo).
        "require": Case(lambda: touch_module(strict.pull(b.ref, device="cpu")),
                        prepare=oms.forget_verified),
        "first": Case(lambda: touch_module(strict.pull(b.ref, device="cpu")),
                      prepare=first_check),
    }, runs=3 * b.runs)
    p_off, p_req, p_first = t["off"].median, t["require"].median, t["first"].median
    row34 = Row(*_ROWS[0])
    row34.measured = f"require {duration(p_req)}, off {duration(p_off)}"
    row34.ratio = f"{p_req / p_off:.3f}x"
    row34.ok = p_req / p_off <= 1.03
    row34.notes.append(
        f"Samples (s): require {t['require'].spread()}, off {t['off'].spread()}. The policy "
        "reads the version's signature list and its bundle (a few KiB); no weight byte is read "
        "for it. Each timed pull starts as a new process does, with the process's memo of "
        "verified bundles empty; the cache holds the check an earlier process passed (named "
        "by the bundle's, the subjects' and the trusted keys' digests), as it holds the blob "
        "hashes an earlier pull verified. The first check on a machine, which parses the bundle "
        "and checks one ECDSA signature over the digests the manifest lists, measured in the "
        f"same run: {duration(p_first)}, {p_first / p_off:.3f}x (samples "
        f"{t['first'].spread()}).")

    # Row 35: Registry.verify against the reference package on a directory of the same files.
    directory = b.scratch("signed-dir")
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    os.link(b.blob, directory / "model.safetensors")
    import model_signing.signing

    sig = b.scratch("signed-dir.sig")  # beside the directory: not one of its files
    model_signing.signing.Config().use_elliptic_key_signer(private_key=private).sign(
        directory, sig)

    def reference() -> None:  # a fresh configuration per call, as its CLI makes one
        model_signing.verifying.Config().use_elliptic_key_verifier(public_key=public).verify(
            directory, sig)

    t = interleaved({
        "ours": Case(lambda: strict.verify(b.ref, public_keys=[public]),
                     prepare=oms.forget_verified),
        "reference": Case(reference),
    }, runs=b.runs)
    ours, ref = t["ours"].median, t["reference"].median
    row35 = Row(*_ROWS[1])
    row35.measured = f"verify {duration(ours)}, model_signing {duration(ref)}"
    row35.ratio = f"{ref / ours:.0f}x faster"
    row35.ok = ref / ours >= 10
    row35.notes.append(
        f"Samples (s): verify {t['ours'].spread()}, reference {t['reference'].spread()}. The "
        "reference package is called in-process (`verifying.Config().verify`, no CLI start-up); "
        f"it hashes the {b.nbytes / 1e6:.0f} MB file again, while the registry verifies the "
        "signature over digests its store already proved.")
    shutil.rmtree(directory)

    # Row 36: push with and without signing (a new name per run, as row 4).
    names = itertools.count()

    def push(**options: object) -> None:
        b.reg.push(b.net, f"bench-sign-{next(names)}", factory=FACTORY,
                   factory_kwargs=kwargs(b.size), **options)  # type: ignore[arg-type]

    t = interleaved({
        "plain": Case(push, prepare=os.sync),
        "signed": Case(lambda: push(sign_key=private), prepare=os.sync),
    }, runs=2 * b.runs)  # writes to disk spread one push over 0.7-1.8 s: twice the samples
    plain, signed = t["plain"].median, t["signed"].median
    row36 = Row(*_ROWS[2])
    row36.measured = f"signed {duration(signed)}, plain {duration(plain)}"
    row36.ratio = f"{signed / plain:.3f}x"
    row36.ok = signed / plain <= 1.05
    row36.notes.append(
        f"Samples (s): signed {t['signed'].spread()}, plain {t['plain'].spread()}. Signing adds "
        "one ECDSA signature over the digests the push already computed, and a few KiB stored.")
    for reg in (off, strict):
        reg.close()
    return [row34, row35, row36]


_ROWS = [
    (34, "pull under `REGISTRY_VERIFY=require` (signed version, trusted key)",
     "the same pull with `REGISTRY_VERIFY=off`", "<= 1.03x"),
    (35, "`Registry.verify` of the signed version",
     "`model_signing` verify (reference package) of a directory of the same files",
     ">= 10x faster"),
    (36, "push with `sign_key`", "the same push without", "<= 1.05x"),
]
