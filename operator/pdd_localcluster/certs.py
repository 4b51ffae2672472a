"""Key material for the local control plane, made with the `openssl` CLI (the venv carries no
crypto library). EC P-256 keys: generating them takes milliseconds, RSA would take seconds."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

# Names a client inside or outside the cluster may use for the apiserver.
APISERVER_SANS = (
    "IP:127.0.0.1",
    "IP:10.96.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class CertFiles:
    ca_crt: Path
    ca_key: Path
    serving_crt: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path

    def complete(self) -> bool:
        return all(p.is_file() and p.stat().st_size > 0 for p in vars(self).values())


def cert_files(cert_dir: Path) -> CertFiles:
    return CertFiles(
        ca_crt=cert_dir / "ca.crt",
        ca_key=cert_dir / "ca.key",
        serving_crt=cert_dir / "apiserver.crt",
        serving_key=cert_dir / "apiserver.key",
        sa_key=cert_dir / "sa.key",
        sa_pub=cert_dir / "sa.pub",
    )


def ensure_certs(cert_dir: Path) -> CertFiles:
    """Creates the CA, the apiserver serving pair and the service-account signing pair once;
    a state dir that already has them keeps them (kubeconfigs stay valid across restarts)."""
    files = cert_files(cert_dir)
    if files.complete():
        return files
    cert_dir.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", files.ca_key, "-out", files.ca_crt, "-days", "3650",
        "-subj", "/CN=pdd-localcluster-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    csr = cert_dir / "apiserver.csr"
    _openssl("req", *ec, "-keyout", files.serving_key, "-out", csr, "-subj", "/CN=kube-apiserver")
    ext = cert_dir / "apiserver.ext"
    ext.write_text(
        f"subjectAltName={','.join(APISERVER_SANS)}\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", csr, "-CA", files.ca_crt, "-CAkey", files.ca_key,
        "-CAcreateserial", "-out", files.serving_crt, "-days", "3650", "-extfile", ext,
    )  # fmt: skip
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-out", files.sa_key)  # fmt: skip
    _openssl("pkey", "-in", files.sa_key, "-pubout", "-out", files.sa_pub)
    for p in (files.ca_key, files.serving_key, files.sa_key):
        p.chmod(0o600)
    return files


def _openssl(*args: str | Path) -> None:
    res = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {res.stderr.strip()}")
