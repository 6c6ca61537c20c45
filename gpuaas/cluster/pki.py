"""Certificates and kubeconfigs for a local control plane.

The apiserver authenticates every component by client certificate, the way kubeadm sets a cluster up: one cluster CA
signs the serving certificate and each component's client certificate (its user and groups are the CN and O fields),
and a separate front-proxy CA signs the aggregator's client certificate, which aggregated API servers (our
custom-metrics API) verify. The gpuaas extender gets a serving certificate from the cluster CA too (`extender.crt`,
for 127.0.0.1 and localhost), and accepts kube-scheduler's own client certificate (`scheduler.crt`, CN
system:kube-scheduler) on its verbs: the cluster CA is its client CA.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=365)

# Client identities, as kubeadm names them: (file stem, user, groups).
CLIENTS = (
    ("admin", "kubernetes-admin", ("system:masters",)),
    ("controller-manager", "system:kube-controller-manager", ()),
    ("scheduler", "system:kube-scheduler", ()),
    ("kwok", "kwok-controller", ("system:masters",)),  # kwok plays every kubelet: it writes any node and pod status
)


EXTENDER_SERVING = ("extender", "gpuaas-extender")  # (file stem, CN)


@dataclass(frozen=True)
class Pki:
    dir: Path

    def path(self, name: str) -> Path:
        return self.dir / name

    @property
    def ca_cert(self) -> Path:
        return self.path("ca.crt")

    @property
    def front_proxy_ca_cert(self) -> Path:
        return self.path("front-proxy-ca.crt")


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _ca(common_name: str):
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(ca_key, ca_cert, common_name: str, groups=(), *, server_names=(), server_ips=(), client=True):
    key = _key()
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    if server_names or server_ips:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if server_names or server_ips:
        sans = [x509.DNSName(n) for n in server_names] + [x509.IPAddress(ipaddress.ip_address(i)) for i in server_ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def create_pki(directory: Path, *, service_ip: str = "10.96.0.1") -> Pki:
    """Write a complete PKI into `directory`: CA, apiserver serving cert, component client certs, the extender's
    serving cert, service-account signing key, front-proxy CA and the aggregator's client cert."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("gpuaas-local-ca")
    _write_key(directory / "ca.key", ca_key)
    _write_cert(directory / "ca.crt", ca_cert)

    key, cert = _leaf(
        ca_key,
        ca_cert,
        "kube-apiserver",
        server_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                      "kubernetes.default.svc.cluster.local"),
        server_ips=("127.0.0.1", service_ip),
        client=False,
    )
    _write_key(directory / "apiserver.key", key)
    _write_cert(directory / "apiserver.crt", cert)

    for stem, user, groups in CLIENTS:
        key, cert = _leaf(ca_key, ca_cert, user, groups)
        _write_key(directory / f"{stem}.key", key)
        _write_cert(directory / f"{stem}.crt", cert)

    # Service-account tokens are signed with RSA, as every Kubernetes distribution does.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(directory / "sa.key", sa_key)
    (directory / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )

    key, cert = _leaf(ca_key, ca_cert, EXTENDER_SERVING[1], server_names=("localhost",), server_ips=("127.0.0.1",),
                      client=False)
    _write_key(directory / f"{EXTENDER_SERVING[0]}.key", key)
    _write_cert(directory / f"{EXTENDER_SERVING[0]}.crt", cert)

    fp_key, fp_cert = _ca("gpuaas-front-proxy-ca")
    _write_key(directory / "front-proxy-ca.key", fp_key)
    _write_cert(directory / "front-proxy-ca.crt", fp_cert)
    key, cert = _leaf(fp_key, fp_cert, "front-proxy-client")
    _write_key(directory / "front-proxy-client.key", key)
    _write_cert(directory / "front-proxy-client.crt", cert)
    return Pki(directory)


def issue_serving_cert(pki: Pki, stem: str, common_name: str, names=("localhost",),
                       ips=("127.0.0.1",)) -> tuple[Path, Path]:
    """A serving certificate signed by the cluster CA, for a webhook-style server of ours (extender, metrics API)."""
    ca_key = serialization.load_pem_private_key(pki.path("ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key, cert = _leaf(ca_key, ca_cert, common_name, server_names=names, server_ips=ips, client=False)
    key_path, cert_path = pki.path(f"{stem}.key"), pki.path(f"{stem}.crt")
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return cert_path, key_path


def write_kubeconfig(path: Path, *, server: str, pki: Pki, client: str) -> Path:
    """A kubeconfig that authenticates as the client certificate `client` (a stem from CLIENTS)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gpuaas", "cluster": {"server": server, "certificate-authority": str(pki.ca_cert)}}],
        "users": [
            {
                "name": client,
                "user": {
                    "client-certificate": str(pki.path(f"{client}.crt")),
                    "client-key": str(pki.path(f"{client}.key")),
                },
            }
        ],
        "contexts": [{"name": "gpuaas", "context": {"cluster": "gpuaas", "user": client}}],
        "current-context": "gpuaas",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
