"""`python -m dequantd` with TLS, mutual TLS and tokens (--tls-ca, --tls-cert, --tls-key,
--tls-server-name, --token-file, $DEQUANTD_TOKEN) against a dequantd that requires all three:
certificates are made here with openssl (a CA, a server certificate for the name dequantd.test
only, a client certificate), the token file has one reader token. Results are compared with the
library's over the same credentials; refusals are checked by their gRPC code and exit status."""

import os
import subprocess
import sys

import numpy as np
import pytest

import dequantd

from conftest import start_server, stop_server

LAYER = "model.layers.0.self_attn.k_proj"
TOKEN = "0123456789abcdef0123456789abcdef"


def _openssl(cwd, *args):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(cwd, name, san=None):
    """name.key/name.pem signed by ca.key/ca.pem in `cwd` (P-256, 2 days)."""
    _openssl(cwd, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
    extra = []
    if san:
        with open(os.path.join(cwd, f"{name}.ext"), "w") as f:
            f.write(f"subjectAltName={san}\n")
        extra = ["-extfile", f"{name}.ext"]
    _openssl(cwd, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", *extra)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    _openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test-ca")
    _issue(d, "server", san="DNS:dequantd.test")
    _issue(d, "client")
    with open(os.path.join(d, "tokens"), "w") as f:
        f.write(f"# ROLE TOKEN\nreader {TOKEN}\n")
    with open(os.path.join(d, "token"), "w") as f:
        f.write(f"{TOKEN}\n")
    with open(os.path.join(d, "wrong-token"), "w") as f:
        f.write("not-the-token-0123456789\n")
    with open(os.path.join(d, "empty-token"), "w") as f:
        f.write("\n")
    return d


@pytest.fixture(scope="module")
def secure_server(pki, tmp_path_factory):
    p = lambda name: os.path.join(pki, name)  # noqa: E731
    proc, target = start_server(str(tmp_path_factory.mktemp("secure")), extra=(
        f"--tls-cert={p('server.pem')}", f"--tls-key={p('server.key')}",
        f"--tls-client-ca={p('ca.pem')}", f"--auth-tokens={p('tokens')}"))
    yield target
    stop_server(proc)


def _cli(pki, target, *args, tls=True, client_cert=True, server_name="dequantd.test",
         token_file="token", env_token=None):
    p = lambda name: os.path.join(pki, name)  # noqa: E731
    argv = [sys.executable, "-m", "dequantd", *args, "--server", target, "--timeout", "60"]
    if tls:
        argv += ["--tls-ca", p("ca.pem")]
    if client_cert:
        argv += ["--tls-cert", p("client.pem"), "--tls-key", p("client.key")]
    if server_name:
        argv += ["--tls-server-name", server_name]
    if token_file:
        argv += ["--token-file", p(token_file)]
    env = {k: v for k, v in os.environ.items() if k != "DEQUANTD_TOKEN"}
    if env_token is not None:
        env["DEQUANTD_TOKEN"] = env_token
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def _library_client(pki, target):
    p = lambda name: os.path.join(pki, name)  # noqa: E731
    creds, options, metadata = dequantd.security_options(
        tls_ca=p("ca.pem"), tls_cert=p("client.pem"), tls_key=p("client.key"),
        tls_server_name="dequantd.test", token_file=p("token"))
    return dequantd.Client(target, credentials=creds, options=options, metadata=metadata)


def test_list_and_dequantize_over_mutual_tls_with_a_token_file(pki, secure_server, tmp_path):
    r = _cli(pki, secure_server, "list")
    assert r.returncode == 0, r.stderr
    assert LAYER in r.stdout
    out = str(tmp_path / "k.npy")
    r = _cli(pki, secure_server, "dequantize", "--tensor", LAYER, "--dtype", "bf16", "--out", out)
    assert r.returncode == 0, r.stderr
    with _library_client(pki, secure_server) as c:
        expected = c.dequantize(LAYER, dtype="bf16").view(np.uint16)
    got = np.load(out)
    assert got.dtype == np.uint16 and got.shape == expected.shape
    assert np.array_equal(got, expected)


def test_token_from_the_environment(pki, secure_server):
    r = _cli(pki, secure_server, "info", token_file=None, env_token=f" {TOKEN}\n")
    assert r.returncode == 0, r.stderr
    assert '"backend": "cpu"' in r.stdout


def test_token_file_wins_over_the_environment(pki, secure_server):
    r = _cli(pki, secure_server, "info", env_token="not-the-token-0123456789")
    assert r.returncode == 0, r.stderr


def test_missing_or_unknown_token_is_unauthenticated(pki, secure_server):
    r = _cli(pki, secure_server, "list", token_file=None)
    assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr, r.stderr
    r = _cli(pki, secure_server, "list", token_file="wrong-token")
    assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr, r.stderr


def test_without_a_client_certificate_the_handshake_fails(pki, secure_server):
    r = _cli(pki, secure_server, "list", client_cert=False)
    assert r.returncode == 1 and "UNAVAILABLE" in r.stderr, r.stderr


def test_server_name_is_verified(pki, secure_server):
    # The certificate names dequantd.test only: connecting to 127.0.0.1 without the override
    # (or with another name) fails verification.
    r = _cli(pki, secure_server, "list", server_name=None)
    assert r.returncode == 1 and "UNAVAILABLE" in r.stderr, r.stderr
    r = _cli(pki, secure_server, "list", server_name="other.test")
    assert r.returncode == 1 and "UNAVAILABLE" in r.stderr, r.stderr


def test_plaintext_to_a_tls_server_fails(pki, secure_server):
    r = _cli(pki, secure_server, "list", tls=False, client_cert=False, server_name=None)
    assert r.returncode == 1 and "UNAVAILABLE" in r.stderr, r.stderr


@pytest.mark.parametrize("args,message", [
    (["--tls-cert", "client.pem"], "--tls-cert and --tls-key go together"),
    (["--tls-key", "client.key"], "--tls-cert and --tls-key go together"),
    (["--tls-server-name", "dequantd.test"], "--tls-server-name needs TLS"),
    (["--token-file", "empty-token"], "the first line holds no token"),
    (["--token-file", "no-such-file"], "--token-file"),
    (["--tls-ca", "no-such-ca.pem"], "--tls-ca"),
    (["--tls-ca", "ca.key"], "ca.key: not a PEM certificate (no '-----BEGIN CERTIFICATE' block)"),
    (["--tls-cert", "client.key", "--tls-key", "client.key"],
     "client.key: not a PEM certificate"),
    (["--tls-ca", "ca.pem", "--tls-cert", "client.pem", "--tls-key", "client.pem"],
     "client.pem: not a PEM private key"),
])
def test_bad_security_flags_are_usage_errors(pki, args, message):
    argv = [a if a.startswith("--") or "." in a and a.endswith(".test") else os.path.join(pki, a)
            for a in args]
    r = subprocess.run([sys.executable, "-m", "dequantd", "list", "--server", "127.0.0.1:1",
                        *argv], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr


def test_a_token_grpc_cannot_send_is_a_usage_error_that_does_not_echo_it(tmp_path):
    """A tab or DEL in the token: refused before any call (gRPC would reject the metadata), the
    source and the byte named, the token's text never printed."""
    token_file = tmp_path / "tab.token"
    token_file.write_bytes(b"abc\tsecret0123456789\n")
    r = subprocess.run([sys.executable, "-m", "dequantd", "list", "--server", "127.0.0.1:1",
                        "--token-file", str(token_file)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert (f"--token-file {token_file}: the token holds byte 0x09 at position 3; a token is "
            "visible ASCII (0x21-0x7E)") in r.stderr
    assert "secret" not in r.stderr
    env = dict(os.environ, DEQUANTD_TOKEN="abcdefghijklmnop\x7f")
    r = subprocess.run([sys.executable, "-m", "dequantd", "list", "--server", "127.0.0.1:1"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2, r.stderr
    assert "$DEQUANTD_TOKEN: the token holds byte 0x7F at position 16" in r.stderr
    assert "abcdefghijklmnop" not in r.stderr
