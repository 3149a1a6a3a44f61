"""TLS and token options for a Client, as dequantctl takes them (client/credentials.cc):

    creds, options, metadata = security_options(tls_ca="ca.pem", token_file="token")
    Client(target, credentials=creds, options=options, metadata=metadata)

TLS is used when a CA or a client certificate is given (the system's CA store verifies the
server when only a client certificate is given). The token (first line of `token_file`, else
$DEQUANTD_TOKEN) is sent as `authorization: Bearer TOKEN` on every call; dequantd refuses
tokens over plaintext unless it listens on loopback or a Unix socket (README.md, Security).
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple

import grpc

TOKEN_ENV = "DEQUANTD_TOKEN"


def _read(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror}") from None


def _pem(flag: str, path: str, kind: str) -> bytes:
    """The PEM file at `path`, which must hold a "-----BEGIN <kind>" block (CERTIFICATE, or
    PRIVATE KEY for any key type); ValueError naming the flag otherwise (gRPC would only fail at
    the handshake, with its own logs)."""
    data = _read(flag, path)
    if f"-----BEGIN {kind}".encode() not in data and not (
            kind == "PRIVATE KEY" and b"PRIVATE KEY-----" in data):
        raise ValueError(f"{flag} {path}: not a PEM {kind.lower()} (no '-----BEGIN {kind}' "
                         "block)")
    return data


def _checked(token: str, source: str) -> str:
    """`token` when gRPC can send it (an HTTP/2 header value: visible ASCII 0x21-0x7E); else a
    ValueError naming `source` and the first bad byte, never the token."""
    for i, ch in enumerate(token):
        if not 0x21 <= ord(ch) <= 0x7E:
            raise ValueError(f"{source}: the token holds byte 0x{ord(ch):02X} at position {i}; "
                             "a token is visible ASCII (0x21-0x7E)")
    return token


def resolve_token(token_file: Optional[str] = None) -> str:
    """The bearer token: the first line of `token_file` (stripped), else $DEQUANTD_TOKEN
    (stripped), else "". Raises ValueError naming --token-file for an unreadable file or an empty
    first line, and naming its source for a token that is not visible ASCII."""
    if not token_file:
        raw = os.environb.get(TOKEN_ENV.encode(), b"").decode("latin-1")
        return _checked(raw.strip(" \t\r\n"), "$DEQUANTD_TOKEN")
    first_line = _read("--token-file", token_file).split(b"\n", 1)[0].decode("latin-1")
    token = first_line.strip(" \t\r\n")
    if not token:
        raise ValueError(f"--token-file {token_file}: the first line holds no token")
    return _checked(token, f"--token-file {token_file}")


def security_options(*, tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                     tls_key: Optional[str] = None, tls_server_name: Optional[str] = None,
                     token_file: Optional[str] = None
                     ) -> Tuple[Optional[grpc.ChannelCredentials], List[Tuple[str, Any]],
                                Sequence[Tuple[str, str]]]:
    """(credentials, channel options, metadata) for Client(...). Reads the PEM files and the token
    now. Raises ValueError naming the flag: unreadable file, a file that is not a PEM certificate
    (--tls-ca, --tls-cert) or key (--tls-key), --tls-cert without --tls-key or the reverse,
    --tls-server-name without TLS, an empty --token-file."""
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("--tls-cert and --tls-key go together (mutual TLS): give both or neither")
    credentials = None
    options: List[Tuple[str, Any]] = []
    if tls_ca or tls_cert:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_pem("--tls-ca", tls_ca, "CERTIFICATE") if tls_ca else None,
            private_key=_pem("--tls-key", tls_key, "PRIVATE KEY") if tls_key else None,
            certificate_chain=_pem("--tls-cert", tls_cert, "CERTIFICATE") if tls_cert else None)
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
    elif tls_server_name:
        raise ValueError("--tls-server-name needs TLS: give --tls-ca")
    token = resolve_token(token_file)
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    return credentials, options, metadata
