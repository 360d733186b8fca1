"""A local certificate authority for `make serve TLS=1`, made once under ``.serve/tls/``
(``TLS_DIR`` names another folder): the CA (``ca.pem``, ``ca.key``), the server's
certificate for 127.0.0.1 and localhost (``server.pem``, ``server.key``) and the devices'
client certificates (``devices/<id>.pem``, ``devices/<id>.key``). Keys are EC P-256, 0600.

    python -m localdev.tls device-cert --device lamp-1   # two lines: the certificate's path, then the key's
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import ipaddress
import os
import ssl
import sys
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from functions.auth.credentials import DEVICE_URI_PREFIX
from functions.device_state import DEVICE_ID_PATTERN

DEFAULT_DIRECTORY = ".serve/tls"
CA_DAYS = 3650
SERVER_DAYS = 365
DEVICE_DAYS = 365
CLOCK_SKEW = datetime.timedelta(minutes=5)  # valid a little before now, for a client whose clock is behind


def directory_from_environment() -> Path:
    return Path(os.environ.get("TLS_DIR") or DEFAULT_DIRECTORY)


def _write_private(path: Path, data: bytes) -> None:
    """Written whole and 0600 from the first byte, then moved into place."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    os.replace(temporary, path)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _save(certificate: x509.Certificate, key, certificate_path: Path, key_path: Path) -> None:
    _write_private(key_path, _key_pem(key))
    certificate_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


class LocalCA:
    def __init__(self, directory: Path, key, certificate: x509.Certificate):
        self.directory, self.key, self.certificate = Path(directory), key, certificate

    @property
    def certificate_path(self) -> Path:
        return self.directory / "ca.pem"

    @classmethod
    def load_or_create(cls, directory: Path | str | None = None) -> "LocalCA":
        """The folder's CA: made on first use, the same one ever after. A lock keeps two
        processes starting at once (make serve, make device-cert) from making two."""
        directory = Path(directory) if directory else directory_from_environment()
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            certificate_path, key_path = directory / "ca.pem", directory / "ca.key"
            if not key_path.exists() or not certificate_path.exists():
                key = ec.generate_private_key(ec.SECP256R1())
                name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "device-state local CA")])
                now = datetime.datetime.now(datetime.timezone.utc)
                certificate = (
                    x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                    .serial_number(x509.random_serial_number())
                    .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + datetime.timedelta(days=CA_DAYS))
                    .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                    .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                                 key_encipherment=False, data_encipherment=False,
                                                 key_agreement=False, key_cert_sign=True, crl_sign=True,
                                                 encipher_only=False, decipher_only=False), critical=True)
                    .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                    .sign(key, hashes.SHA256()))
                _save(certificate, key, certificate_path, key_path)
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            return cls(directory, key, x509.load_pem_x509_certificate(certificate_path.read_bytes()))

    def issue(self, subject: str, names: list[x509.GeneralName], usage, days: int,
              certificate_path: Path, key_path: Path) -> tuple[Path, Path]:
        """A new key and a certificate for it, signed by this CA, written to the two paths."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(self.certificate.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256()))
        certificate_path.parent.mkdir(parents=True, exist_ok=True)
        _save(certificate, key, certificate_path, key_path)
        return certificate_path, key_path

    def server_certificate(self) -> tuple[Path, Path]:
        """The server's certificate for 127.0.0.1 and localhost: made when missing, when it
        expires within a day, or when it is not this CA's (the CA was made anew)."""
        certificate_path, key_path = self.directory / "server.pem", self.directory / "server.key"
        with open(self.directory / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if certificate_path.exists() and key_path.exists():
                current = x509.load_pem_x509_certificate(certificate_path.read_bytes())
                fresh = current.not_valid_after_utc - datetime.timedelta(days=1) > datetime.datetime.now(
                    datetime.timezone.utc)
                if fresh and _signed_by(current, self.certificate):
                    return certificate_path, key_path
            names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            return self.issue("localhost", names, ExtendedKeyUsageOID.SERVER_AUTH, SERVER_DAYS,
                              certificate_path, key_path)

    def device_certificate(self, device_id: str) -> tuple[Path, Path]:
        """A new key and client certificate for the device: SAN ``URI:urn:device:<id>``, CN the id."""
        if not isinstance(device_id, str) or not DEVICE_ID_PATTERN.fullmatch(device_id):
            raise ValueError("a device id is 1-128 characters of A-Z a-z 0-9 . _ : -")
        folder = self.directory / "devices"
        return self.issue(device_id, [x509.UniformResourceIdentifier(DEVICE_URI_PREFIX + device_id)],
                          ExtendedKeyUsageOID.CLIENT_AUTH, DEVICE_DAYS,
                          folder / f"{device_id}.pem", folder / f"{device_id}.key")

    def server_context(self) -> ssl.SSLContext:
        """HTTPS with this CA's server certificate, asking every client for a certificate of
        this CA and accepting one that sends none (it authenticates with a token instead)."""
        certificate_path, key_path = self.server_certificate()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certificate_path, key_path)
        context.load_verify_locations(cafile=self.certificate_path)
        context.verify_mode = ssl.CERT_OPTIONAL
        return context


def _signed_by(certificate: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        certificate.verify_directly_issued_by(issuer)
        return True
    except (ValueError, TypeError, InvalidSignature):
        return False


def client_cert(der: bytes) -> dict:
    """``requestContext.identity.clientCert`` as API Gateway fills it for a certificate
    mutual TLS verified (the PEM, the DNs, the serial as colon-separated hex bytes, the
    validity in OpenSSL's text form, e.g. ``Aug  5 09:36:04 2021 GMT``)."""
    certificate = x509.load_der_x509_certificate(der)
    serial = format(certificate.serial_number, "x")
    serial = serial.zfill(len(serial) + len(serial) % 2)
    return {
        "clientCertPem": certificate.public_bytes(serialization.Encoding.PEM).decode(),
        "subjectDN": certificate.subject.rfc4514_string(),
        "issuerDN": certificate.issuer.rfc4514_string(),
        "serialNumber": ":".join(serial[i:i + 2] for i in range(0, len(serial), 2)),
        "validity": {"notBefore": _openssl_time(certificate.not_valid_before_utc),
                     "notAfter": _openssl_time(certificate.not_valid_after_utc)},
    }


_MONTHS = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()


def _openssl_time(moment: datetime.datetime) -> str:
    return f"{_MONTHS[moment.month - 1]} {moment.day:2d} {moment:%H:%M:%S} {moment.year} GMT"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="The local CA of make serve TLS=1")
    parser.add_argument("command", choices=("device-cert",))
    parser.add_argument("--device", default="")
    parser.add_argument("--directory", default=None, help=f"default: $TLS_DIR or {DEFAULT_DIRECTORY}")
    args = parser.parse_args(argv)
    if not DEVICE_ID_PATTERN.fullmatch(args.device):
        sys.exit("DEVICE must be 1-128 characters of A-Z a-z 0-9 . _ : -  (make -s device-cert DEVICE=lamp-1)")
    certificate_path, key_path = LocalCA.load_or_create(args.directory).device_certificate(args.device)
    print(certificate_path)
    print(key_path)


if __name__ == "__main__":
    main()
