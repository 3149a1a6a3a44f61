"""The one exception type of the package: a failed gRPC call."""

from __future__ import annotations

import grpc


class DequantdError(Exception):
    """A call to dequantd failed.

    Attributes:
        code: the gRPC status code (``grpc.StatusCode``), e.g. ``NOT_FOUND`` for an unknown
            tensor name, ``INVALID_ARGUMENT`` for a bad field (the message names it),
            ``UNAVAILABLE`` when the server cannot be reached, ``DEADLINE_EXCEEDED`` when the
            call's timeout passed, ``DATA_LOSS`` for a stream that did not add up.
        message: the server's (or gRPC's) status message.
    """

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "DequantdError":
        """The DequantdError for a ``grpc.RpcError`` raised by a stub call."""
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")
