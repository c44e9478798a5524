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

Modes, whatever the process umask: the folder 0700 (only the owner may list it or add to
it), private keys and identities 0600, certificates and ``directory.json`` 0644. Each file is
created new (``O_EXCL``, never through an existing file or link) with its final mode and
then ``fchmod``-ed to exactly that mode, so no file is ever readable beyond it, even for an
instant; the folder is ``chmod``-ed to 0700 before anything is written into it.
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
from sharefl.rounds.keyfiles import read_identity

VALIDITY = dt.timedelta(days=365)
FOLDER_MODE = 0o700
PUBLIC_MODE = 0o644
PRIVATE_MODE = 0o600


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """Create ``path`` (it must not exist) with mode 0600 (``private``) or 0644, exactly:
    the mode is passed to ``open`` (so the umask can only tighten it) and set again with
    ``fchmod`` (so a permissive umask cannot loosen it) before any byte is written."""
    mode = PRIVATE_MODE if private else PUBLIC_MODE
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, mode)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            fd = -1  # owned by the file object now
            handle.write(data)
    finally:
        if fd >= 0:
            os.close(fd)


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

    Returns the folder, mode 0700, its files 0600 (private keys, identities) or 0644 (see
    the module docstring). Raises ``FileExistsError`` if it already holds a ``ca.pem`` or
    any file keygen would write (never overwrite a deployment's keys by accident).
    """
    folder = Path(out)
    folder.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
    if (folder / "ca.pem").exists():
        raise FileExistsError(f"{folder / 'ca.pem'} exists; choose an empty folder")
    os.chmod(folder, FOLDER_MODE)  # mkdir's mode is cut by the umask, and exist_ok keeps
    # an existing folder's mode: set it exactly before anything secret lands in it
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
    """Read a ``client-<id>.identity`` file written by :func:`keygen`, with the one checked
    reader (:func:`~sharefl.rounds.keyfiles.read_identity`: raises its
    :class:`~sharefl.rounds.keyfiles.KeyFileError`)."""
    return read_identity(path)
