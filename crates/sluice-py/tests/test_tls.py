"""The client over TLS (issue #19): a one-node `sluice dev --tls` (a local
CA, mutual TLS), reached with the CA and the client certificate it wrote;
without them the connection is refused with a clear error."""

import signal
import socket
import subprocess
from pathlib import Path

import pytest

import sluice
from conftest import sluice_bin


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tls_dev(tmp_path):
    port = free_port()
    d = tmp_path / "dev"
    p = subprocess.Popen(
        [sluice_bin(), "dev", "--tls", "--nodes", "1", "--base-port", str(port), "--dir", str(d)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    # `sluice dev` prints its "nodes up" line once the node serves (or exits).
    for line in p.stdout:
        seen.append(line)
        if "nodes up" in line:
            break
    else:
        p.wait()
        raise RuntimeError("sluice dev --tls did not start:\n" + "".join(seen))
    yield f"127.0.0.1:{port}", d / "tls"
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=20)


def test_put_and_get_over_mutual_tls(tls_dev):
    addr, tls = tls_dev
    with sluice.Client(
        addr,
        tls_ca=str(tls / "ca.pem"),
        tls_cert=str(tls / "client.pem"),
        tls_key=str(tls / "client-key.pem"),
    ) as c:
        c.put("/vol/tls", b"secret")
        assert bytes(c.get("/vol/tls").value) == b"secret"


def test_without_the_client_certificate_or_the_ca_it_is_refused(tls_dev):
    addr, tls = tls_dev
    with pytest.raises(sluice.SluiceError, match="CertificateRequired.*Python: tls_cert=, tls_key="):
        sluice.Client(addr, tls_ca=str(tls / "ca.pem"))
    with pytest.raises(sluice.SluiceError, match="connect with its CA"):
        sluice.Client(addr)
    with pytest.raises(ValueError, match="need tls_ca"):
        sluice.Client(addr, tls_cert=str(tls / "client.pem"), tls_key=str(tls / "client-key.pem"))
    # Named as the caller named it (the keyword), not as a node config names it.
    with pytest.raises(ValueError, match=r"^tls_ca .*nope\.pem"):
        sluice.Client(addr, tls_ca=str(Path(tls) / "nope.pem"))


def test_principals_access_rules_and_revocation(tls_dev):
    """The client certificate names a principal; tokens name others; an
    access rule refuses what it does not allow with PermissionDenied; a
    revoked token is refused (issue #19)."""
    addr, tls = tls_dev
    creds = dict(
        tls_ca=str(tls / "ca.pem"),
        tls_cert=str(tls / "client.pem"),
        tls_key=str(tls / "client-key.pem"),
    )
    with sluice.Client(addr, **creds) as c:
        me = c.policy("whoami")
        assert (me["principal"], me["via"]) == ("sluice-client", "certificate")
        admin = c.policy("auth_create", name="py-admin", roles=["admin"])["token"]
        bob = c.policy("auth_create", name="bob")["token"]
    with sluice.Client(addr, token=admin, **creds) as a:
        assert a.policy("whoami")["principal"] == "py-admin"
        a.policy("set", name="admins", rule={"kind": "access", "who": {"role": "admin"}, "pool": "/", "allow": ["read", "write", "trigger", "watch", "admin"]})
        a.policy("set", name="bob-reads", rule={"kind": "access", "who": {"principal": "bob"}, "pool": "/vol", "allow": ["read"]})
        a.put("/vol/shared", b"x")
        with sluice.Client(addr, token=bob, **creds) as b:
            assert bytes(b.get("/vol/shared").value) == b"x"
            with pytest.raises(sluice.PermissionDenied) as e:
                b.put("/vol/shared", b"y")
            assert e.value.details["principal"] == "bob"
            assert e.value.details["perm"] == "write"
            # The certificate's principal has no rule: refused too.
            with sluice.Client(addr, **creds) as anon:
                with pytest.raises(sluice.PermissionDenied):
                    anon.get("/vol/shared")
            a.policy("set", name="bob-slow", rule={"kind": "rate", "who": {"principal": "bob"}, "ops_per_s": 5, "max_delay_ms": 0})
            with pytest.raises(sluice.RateLimited) as e:
                for _ in range(50):
                    b.get("/vol/shared")
            assert e.value.details["retry_after_ms"] > 0
            a.policy("auth_revoke", name="bob")
            with pytest.raises(sluice.Unauthenticated):
                b.get("/vol/shared")
        with pytest.raises(sluice.Unauthenticated):
            sluice.Client(addr, token=bob, **creds)
