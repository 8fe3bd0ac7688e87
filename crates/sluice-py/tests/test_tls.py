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
    with pytest.raises(sluice.SluiceError, match="CertificateRequired"):
        sluice.Client(addr, tls_ca=str(tls / "ca.pem"))
    with pytest.raises(sluice.SluiceError, match="connect with its CA"):
        sluice.Client(addr)
    with pytest.raises(ValueError, match="need tls_ca"):
        sluice.Client(addr, tls_cert=str(tls / "client.pem"), tls_key=str(tls / "client-key.pem"))
    with pytest.raises(ValueError, match=r"tls\.ca .*nope\.pem"):
        sluice.Client(addr, tls_ca=str(Path(tls) / "nope.pem"))
