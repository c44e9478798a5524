"""``sharefl keygen``: the keys and certificates a small deployment needs.

Writes into one folder:

- ``ca.pem`` / ``ca.key``: a self-signed certificate authority (ECDSA P-256);
- ``server.pem`` / ``server.key``: the server's certificate for the given host names and
  IP addresses, signed by the CA;
- ``client-<id>.pem`` / ``client-<id>.key``: one TLS client certificate per client (for
  servers that require client certificates);
- ``client-<id>.identity``: the client's Ed25519 identity key (hex of the raw 32 bytes);
- ``directory.json``: ``{"identities": {id: public key hex}}``, which the server uses to
  authenticate clients and clients use to verify each other's signatures in signed mode.

Private keys are written with mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

from sharefl.crypto.signatures import IdentityKey

VALIDITY = dt.timedelta(days=365)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    names: Sequence[str] = (),
    usage: ObjectIdentifier | None = None,
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if names:
        alternatives: list[x509.GeneralName] = []
        for host in names:
            try:
                alternatives.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                alternatives.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def keygen(
    out: str | Path, client_ids: Sequence[int], hosts: Sequence[str] = ("127.0.0.1", "localhost")
) -> Path:
    """Write the CA, server and client certificates, identities and directory to ``out``.

    Returns the folder. Raises ``FileExistsError`` if it already holds a ``ca.pem`` (never
    overwrite a deployment's keys by accident).
    """
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "ca.pem").exists():
        raise FileExistsError(f"{folder / 'ca.pem'} exists; choose an empty folder")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("sharefl CA", ca_key, None, ca_key, ca=True)
    _write(folder / "ca.pem", ca.public_bytes(serialization.Encoding.PEM))
    _write(folder / "ca.key", _key_pem(ca_key), private=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate(
        hosts[0], server_key, ca.subject, ca_key, names=hosts, usage=ExtendedKeyUsageOID.SERVER_AUTH
    )
    _write(folder / "server.pem", server.public_bytes(serialization.Encoding.PEM))
    _write(folder / "server.key", _key_pem(server_key), private=True)
    identities = {}
    for cid in client_ids:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(
            f"client-{cid}", key, ca.subject, ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH
        )
        _write(folder / f"client-{cid}.pem", cert.public_bytes(serialization.Encoding.PEM))
        _write(folder / f"client-{cid}.key", _key_pem(key), private=True)
        identity = IdentityKey.generate()
        _write(folder / f"client-{cid}.identity", identity.private.hex().encode(), private=True)
        identities[str(cid)] = identity.public.hex()
    _write(folder / "directory.json", json.dumps({"identities": identities}, indent=1).encode())
    return folder


def load_identity(path: str | Path) -> IdentityKey:
    """Read a ``client-<id>.identity`` file written by :func:`keygen`."""
    return IdentityKey.from_private(bytes.fromhex(Path(path).read_text().strip()))
