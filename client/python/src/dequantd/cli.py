"""Command line: python -m dequantd {info,list,dequantize,convert} --server TARGET ...

Security, as dequantctl: --tls-ca FILE (TLS), --tls-cert FILE --tls-key FILE (mutual TLS),
--tls-server-name NAME, --token-file FILE (else $DEQUANTD_TOKEN) (README.md, Security).

Exit status 0 on success, 1 on a DequantdError (printed as "error: CODE: message"), 2 on bad
arguments (argparse).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from typing import List, Optional, TextIO

import numpy as np

from .client import Client
from .convert import convert
from .credentials import security_options
from .errors import DequantdError


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dequantd", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--server", required=True, help="host:port of dequantd")
        p.add_argument("--timeout", type=float, default=None,
                       help="deadline per call in seconds (default: 60 for info/list, none for "
                            "streams)")
        g = p.add_argument_group("security (README.md, Security)")
        g.add_argument("--tls-ca", metavar="FILE",
                       help="PEM CA that verifies the server's certificate: use TLS")
        g.add_argument("--tls-cert", metavar="FILE",
                       help="PEM client certificate chain for mutual TLS (with --tls-key)")
        g.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
        g.add_argument("--tls-server-name", metavar="NAME",
                       help="name to verify in the server's certificate (default: the host of "
                            "--server)")
        g.add_argument("--token-file", metavar="FILE",
                       help="file whose first line is the bearer token to send; default: "
                            "$DEQUANTD_TOKEN if set")
        return p

    command("info", "server version, backend, devices, model")
    command("list", "quantized layers and other tensors of the loaded model")
    p = command("dequantize", "one layer to a .npy file (row-major, the format's own orientation: "
                              "AWQ (K, N), the others (N, K))")
    p.add_argument("--tensor", required=True, help="layer name from `list`")
    p.add_argument("--dtype", choices=["fp16", "bf16", "fp32"], default="fp16")
    p.add_argument("--out", required=True,
                   help=".npy file to write ('.npy' is added to a name without it; - or "
                        "/dev/stdout = the .npy bytes to standard output, the report line then "
                        "on stderr; bf16 as its uint16 bits: numpy has no bfloat16; ml-dtypes is "
                        "not needed)")
    p.add_argument("--orientation", choices=["kn", "nk"], default=None,
                   help="the result's layout, written by the server's kernel: kn = (K, N), nk = "
                        "(N, K) (nn.Linear.weight); default: the format's own")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (there is none when stderr is not a terminal)")
    p = command("convert", "the whole model to a plain fp16/bf16 Hugging Face checkpoint")
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--max-shard-size", default="5GB", help="e.g. 5GB (default), 500MB, 2GiB")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (there is none when stderr is not a terminal)")
    return ap


def _write_all(stream: TextIO, data: memoryview) -> None:
    """Every byte of `data` to `stream`'s descriptor (os.write in a loop: sys.stdout.buffer.write
    returned a partial count, no error, when a pipe's reader had gone). BrokenPipeError when the
    reader is gone."""
    stream.flush()
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(stream.fileno(), view):]


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.timeout is not None and not args.timeout > 0:
        parser.error(f"--timeout must be > 0 seconds (inf: no deadline), got {args.timeout}")
    if args.command == "dequantize":
        if args.out == "/dev/stdout":
            args.out = "-"
        if args.out == "-" and sys.stdout is None:
            parser.error("--out -: standard output is closed")
        if args.out == "-" and sys.stdout.isatty():
            parser.error("--out -: standard output is a terminal; redirect it to a file or a "
                         "pipe for the .npy bytes")
        if args.out != "-":
            if os.path.isdir(args.out):
                parser.error(f"--out {args.out} is a directory: give the .npy file to write")
            if not args.out.endswith(".npy"):
                args.out += ".npy"  # as np.save would add it
            if os.path.isdir(args.out):
                parser.error(f"--out {args.out} is a directory: give the .npy file to write")
    # A progress bar only where someone watches it (as dequantctl): never into a pipe or a log.
    progress = not getattr(args, "no_progress", False) and sys.stderr.isatty()
    timeouts = {} if args.timeout is None else {"timeout": args.timeout,
                                                "stream_timeout": args.timeout}
    try:
        credentials, options, metadata = security_options(
            tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
            tls_server_name=args.tls_server_name, token_file=args.token_file)
        with Client(args.server, credentials=credentials, options=options, metadata=metadata,
                    **timeouts) as client:
            if args.command == "info":
                info = client.info()
                print(json.dumps({k: v for k, v in vars(info).items() if k != "model_config"},
                                 indent=2))
            elif args.command == "list":
                listing = client.list()
                for layer in listing.layers:
                    experts = f"\tE={layer.experts}" if layer.experts > 1 else ""
                    print(f"{layer.name}\t{layer.format}\t({layer.in_features}, "
                          f"{layer.out_features})\tG={layer.group_size}\t{layer.scale_dtype}"
                          f"{experts}")
                for t in listing.other_tensors:
                    print(f"{t.name}\t{t.shape}\t{t.dtype}\tstored")
            elif args.command == "dequantize":
                # bf16: the raw bits (np.uint16), so that ml-dtypes is not needed.
                w = client.dequantize(args.tensor, dtype=args.dtype, progress=progress,
                                      orientation=args.orientation, bf16_bits=True)
                if args.out == "-":
                    out = "standard output"
                    data = io.BytesIO()
                    np.save(data, w)
                    _write_all(sys.stdout, data.getbuffer())
                else:
                    out = args.out
                    np.save(out, w)
                note = (" (bf16 as uint16 bits: numpy has no bfloat16; read with "
                        "np.load(...).view(ml_dtypes.bfloat16))" if args.dtype == "bf16" else "")
                print(f"{args.tensor}: {w.shape} {args.dtype} -> {out}{note}",
                      file=sys.stderr if args.out == "-" else sys.stdout)
            else:
                result = convert(client, args.out, dtype=args.dtype,
                                 max_shard_size=args.max_shard_size,
                                 progress=progress)
                print(f"wrote {result.tensors} tensors ({result.total_bytes} bytes) in "
                      f"{len(result.shards)} shards to {result.out_dir} "
                      f"({result.shards_kept} kept from an earlier run)")
    except DequantdError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # --out -: the reader went away (e.g. `| head -c 10`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        print("error: --out -: standard output was closed by its reader before the whole .npy "
              "was written", file=sys.stderr)
        return 1
    except OSError as e:  # writing the output: a missing directory, a file in the way, a full disk
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: the calls in flight were cancelled on the way out
        print("interrupted", file=sys.stderr)
        return 130  # as a shell reports SIGINT
    return 0
