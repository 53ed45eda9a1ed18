"""TLS of a job's connections (`transferQueue.tls`): a certificate authority made for
the job alone, and one server certificate it signs, which every server of the job
presents (the TransferQueue controller and its storage service, the weight server,
the Redis units).

Whoever starts the job makes them (the operator into the job's Secret, `rljob run`
for the run) and hands them to its processes in `TLS_CA_ENV`, `TLS_CERT_ENV` and
`TLS_KEY_ENV` (PEM text). A client trusts the job's CA and nothing else, so a server
of another job, or one whose certificate has expired, fails the handshake; the
certificate names `SERVER_NAME`, not a host, so one certificate serves every address
a pod may have, and clients check that name. Who the caller is stays the job token's
business (infra/auth.py): TLS keeps the token, the samples and the weights from being
read or changed on the wire. A process without `TLS_CA_ENV` speaks plain text.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

from ..contract import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV

SERVER_NAME = "job.rljob"  # the name in every server certificate, checked by clients
DAYS = 365  # a certificate's life: longer than any job, renewed with the job's Secret


@dataclass(frozen=True)
class Pems:
    """A job's CA certificate, and its server certificate and key (PEM text)."""

    ca: str
    cert: str
    key: str

    def env(self) -> dict[str, str]:
        return {TLS_CA_ENV: self.ca, TLS_CERT_ENV: self.cert, TLS_KEY_ENV: self.key}


def make(days: float = DAYS, now: datetime.datetime | None = None,
         names: tuple[str, ...] = (SERVER_NAME,), ips: tuple[str, ...] = ()) -> Pems:
    """A new CA and a server certificate for `names` (DNS names, the first its common
    name; default `SERVER_NAME`) and `ips` it signs, valid from `now` (default: a
    minute ago, for clocks a little apart) for `days` days. ECDSA P-256: a handshake
    costs a fraction of RSA's."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    start = now or datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=1)
    end = start + datetime.timedelta(days=days)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rljob job CA")])

    def cert(subject, public_key, extensions):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
             .public_key(public_key).serial_number(x509.random_serial_number())
             .not_valid_before(start).not_valid_after(end))
        for ext, critical in extensions:
            b = b.add_extension(ext, critical=critical)
        return b.sign(ca_key, hashes.SHA256())

    ca = cert(ca_name, ca_key.public_key(), [
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (x509.KeyUsage(digital_signature=False, content_commitment=False,
                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                       key_cert_sign=True, crl_sign=True, encipher_only=False,
                       decipher_only=False), True)])
    alt = [*map(x509.DNSName, names), *(x509.IPAddress(ipaddress.ip_address(a)) for a in ips)]
    server = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]),
                  key.public_key(), [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.SubjectAlternativeName(alt), False),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)])
    pem = serialization.Encoding.PEM
    return Pems(
        ca=ca.public_bytes(pem).decode(), cert=server.public_bytes(pem).decode(),
        key=key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode())


def ca_from_env() -> bytes | None:
    """The job's CA certificate this process trusts (None: it speaks plain text)."""
    value = os.environ.get(TLS_CA_ENV)
    return value.encode() if value else None


def server_pems_from_env() -> tuple[bytes, bytes] | None:
    """This process's server key and certificate (None: its servers speak plain text)."""
    cert, key = os.environ.get(TLS_CERT_ENV), os.environ.get(TLS_KEY_ENV)
    return (key.encode(), cert.encode()) if cert and key else None


# ---- gRPC ----------------------------------------------------------------------------
def add_port(server, listen: str) -> int:
    """Listen on `listen` with the job's certificate where this process has one, else in
    plain text; the port bound (0: none)."""
    import grpc

    pair = server_pems_from_env()
    if pair is None:
        return server.add_insecure_port(listen)
    return server.add_secure_port(listen, grpc.ssl_server_credentials([pair]))


def secure_channel(address: str, ca: bytes, options=None):
    """A channel that trusts only `ca` and checks the server's name is `SERVER_NAME`."""
    import grpc

    opts = [*(options or ()), ("grpc.ssl_target_name_override", SERVER_NAME)]
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca),
                               options=opts)


# ---- Redis ---------------------------------------------------------------------------
def redis_client_kwargs(url: str, ca: str | None = None) -> dict:
    """redis-py's TLS arguments for `url` (rediss://: the job's CA, `ca` or else this
    process's, else the system's trust store); none for redis:// (pure but for the env)."""
    if not url.startswith("rediss://"):
        return {}
    ca = ca.encode() if ca else ca_from_env()
    if ca is None:  # a user's own Redis behind a certificate of the public kind
        return {"ssl_cert_reqs": "required"}
    # the job's CA signs nothing but this job's servers: the chain is the identity, and
    # the certificate names SERVER_NAME, not the unit's host
    return {"ssl_ca_data": ca.decode(), "ssl_cert_reqs": "required",
            "ssl_check_hostname": False}
