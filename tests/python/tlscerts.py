"""Throwaway TLS certificates for the suites, made at run time with the
openssl command (Debian's `openssl`, installed by scripts/setup.sh) in a
directory the caller owns; nothing is checked in.

  d = tlscerts.CertDir(tmpdir)
  d.ca()                                    # ca.pem, ca.key
  d.issue("master", "master-1", sans=["IP:127.0.0.1"])   # master.pem, master.key
  d.issue("client", "client-1")             # a client certificate (no SAN)
  d.ca("rogue-ca"); d.issue("rogue", "rogue", ca="rogue-ca")

EC P-256 keys, valid for a week, extendedKeyUsage serverAuth and clientAuth
(etcd, written in Go, checks it).  Standard library only.
"""
import contextlib
import os
import shutil
import subprocess
import tempfile

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"


LOOPBACK = ["IP:127.0.0.1", "DNS:localhost"]  # the SANs of a server on loopback


def available():
    return os.access(OPENSSL, os.X_OK)


def _run(*args, cwd):
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=30)


class CertDir:
    def __init__(self, path):
        self.dir = path
        os.makedirs(path, exist_ok=True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def ca(self, name="ca", cn="moonlet test CA"):
        _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "7", "-subj", f"/CN={cn}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=self.dir)
        return self.path(f"{name}.pem")

    def issue(self, name, cn, sans=(), ca="ca"):
        """name.pem and name.key for cn, signed by ca; returns (cert, key)."""
        _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=self.dir)
        ext = ["basicConstraints=CA:FALSE", "extendedKeyUsage=serverAuth,clientAuth"]
        if sans:
            ext.append("subjectAltName=" + ",".join(sans))
        with open(self.path(f"{name}.ext"), "w") as f:
            f.write("\n".join(ext) + "\n")
        _run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "7", "-extfile", f"{name}.ext",
             cwd=self.dir)
        os.chmod(self.path(f"{name}.key"), 0o600)
        return self.path(f"{name}.pem"), self.path(f"{name}.key")

    def flags(self, name, ca="ca"):
        """--tls-cert, --tls-key, --tls-ca of a certificate made here."""
        return ["--tls-cert", self.path(f"{name}.pem"), "--tls-key", self.path(f"{name}.key"),
                "--tls-ca", self.path(f"{ca}.pem")]

    def kwargs(self, name, ca="ca"):
        """tls_ca, tls_cert, tls_key for moonlet.Store.connect."""
        return {"tls_ca": self.path(f"{ca}.pem"), "tls_cert": self.path(f"{name}.pem"),
                "tls_key": self.path(f"{name}.key")}


@contextlib.contextmanager
def temp_certs(prefix, servers, clients):
    """A CertDir in a fresh temp directory (`prefix`, removed on the way out)
    with a CA ("ca"), a certificate for each server {name: cn} valid on
    loopback (LOOPBACK), and one for each client {name: cn}."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        d = CertDir(tmp)
        d.ca()
        for name, cn in servers.items():
            d.issue(name, cn, LOOPBACK)
        for name, cn in clients.items():
            d.issue(name, cn)
        yield d
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
