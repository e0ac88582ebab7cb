"""Certificates for the TLS tests, made on the spot (no tests here).

A test gets its own CA, a server certificate for 127.0.0.1/localhost signed by it, and a client
certificate, so a "wrong CA" is simply a second :func:`make_pki`. Made with ``cryptography``
(installed with the airflow extra), else with the ``openssl`` command; with neither, the TLS
tests skip and say why.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # pragma: no cover - the openssl command is the fallback
    x509 = None  # type: ignore[assignment]

OPENSSL = shutil.which("openssl")
PKI_UNAVAILABLE = (None if x509 is not None or OPENSSL else
                   "neither the cryptography package nor the openssl command is available to "
                   "make test certificates")


@dataclass(frozen=True)
class Pki:
    ca_file: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def server_tls_block(self, *, verify_clients: bool = False) -> str:
        """The ``tls { … }`` block of a nats-server config for this PKI's server cert."""
        lines = [f'  cert_file: "{self.server_cert}"', f'  key_file: "{self.server_key}"',
                 f'  ca_file: "{self.ca_file}"', "  timeout: 5"]
        if verify_clients:
            lines.append("  verify: true")
        return "tls {\n" + "\n".join(lines) + "\n}\n"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
           issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool,
           usage: x509.ObjectIdentifier | None = None,
           alt_names: list[x509.GeneralName] | None = None) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(hours=1))
               .not_valid_after(now + dt.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(directory: Path, label: str = "js-etl test") -> Pki:
    """A CA, a server certificate for 127.0.0.1 and localhost, and a client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    if x509 is None:
        return _make_pki_openssl(directory, label)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"{label} CA")
    ca = _issue(f"{label} CA", ca_key, ca_name, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _issue("127.0.0.1", server_key, ca_name, ca_key, ca=False,
                    usage=ExtendedKeyUsageOID.SERVER_AUTH,
                    alt_names=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                               x509.DNSName("localhost")])
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _issue("js-etl client", client_key, ca_name, ca_key, ca=False,
                    usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    pki = Pki(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem",
              directory / "client.pem", directory / "client-key.pem")
    pki.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.server_cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    pki.client_cert.write_bytes(client.public_bytes(serialization.Encoding.PEM))
    _write_key(server_key, pki.server_key)
    _write_key(client_key, pki.client_key)
    return pki


def _make_pki_openssl(directory: Path, label: str) -> Pki:
    pki = Pki(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem",
              directory / "client.pem", directory / "client-key.pem")
    ca_key = directory / "ca-key.pem"

    def openssl(*args: str) -> None:
        subprocess.run([str(OPENSSL), *args], check=True, capture_output=True, cwd=directory)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(ca_key), "-out", str(pki.ca_file), "-days", "2",
            "-subj", f"/CN={label} CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")
    for cert, key, cn, ext in (
            (pki.server_cert, pki.server_key, "127.0.0.1",
             "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
            (pki.client_cert, pki.client_key, "js-etl client", "extendedKeyUsage=clientAuth")):
        csr = directory / f"{cert.stem}.csr"
        extfile = directory / f"{cert.stem}.ext"
        extfile.write_text(ext + "\n")
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={cn}")
        openssl("x509", "-req", "-in", str(csr), "-CA", str(pki.ca_file), "-CAkey", str(ca_key),
                "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(extfile))
    return pki
