"""Keys and certificates made in the tests (nothing is fetched): EC P-256 key pairs in PEM and
a CA -> leaf certificate chain whose leaf may sign code."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: Path


def ec_key_pair(directory: Path, name: str = "signer") -> KeyPair:
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    private = directory / f"{name}.key.pem"
    public = directory / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return KeyPair(private, public)


@dataclass(frozen=True)
class CertChain:
    root: Path  # the CA certificate a verifier trusts
    key: Path  # the leaf's private key
    leaf: Path  # the signing certificate


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def cert_chain(directory: Path, name: str = "ca", identity: str = "signer@example.com"
               ) -> CertChain:
    """A self-signed root CA and a leaf it issued (digital signature, code signing), whose
    identity (an e-mail subject alternative name) is ``identity``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    later = now + datetime.timedelta(days=30)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name(f"{name} root"))
          .issuer_name(_name(f"{name} root")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(later)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder().subject_name(_name(identity)).issuer_name(ca.subject)
            .public_key(leaf_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(later)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False,
                                         False), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.RFC822Name(identity)]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    root = directory / f"{name}.root.pem"
    root.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    leaf_path = directory / f"{name}.leaf.pem"
    leaf_path.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_path = directory / f"{name}.leaf.key.pem"
    key_path.write_bytes(leaf_key.private_bytes(serialization.Encoding.PEM,
                                                serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    return CertChain(root, key_path, leaf_path)


def ca_and_leaf(ca_common: str, leaf_common: str,
                names: list[x509.GeneralName] | None = None
                ) -> tuple[x509.Certificate, x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A throwaway self-signed CA and a leaf it issued to ``leaf_common`` (with subject
    alternative ``names`` when given): (ca, leaf, leaf's key), valid from a day ago to tomorrow."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name(ca_common)).issuer_name(_name(ca_common))
          .public_key(ca_key.public_key()).serial_number(1)
          .not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    builder = (x509.CertificateBuilder().subject_name(_name(leaf_common))
               .issuer_name(ca.subject).public_key(key.public_key()).serial_number(2)
               .not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=1)))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return ca, builder.sign(ca_key, hashes.SHA256()), key
