"""ckpt_client talks to a ckpt agent over its Unix socket (protocol v1).

    from ckpt_client import Client

    with Client("/run/ckpt/ckpt.sock") as c:
        done = c.checkpoint("orders-0", 42, "/data/snap-42", engine="rocksdb")
        print(done["checkpoint_size"], done["files_reused"])

Client is blocking, AsyncClient its asyncio twin. Errors are typed: an
AgentError subclass per protocol code (BadRequest, NotFound, Conflict,
Unavailable, Forbidden, Internal), Aborted, ConnectionLost, ConnectFailed,
WaitTimeout. The standard library is all it needs.
"""

from ._protocol import (
    CODES,
    MAX_LINE,
    PROTOCOL_VERSION,
    Aborted,
    AgentError,
    BadRequest,
    CkptError,
    Conflict,
    ConnectFailed,
    ConnectionLost,
    Event,
    Forbidden,
    Internal,
    NotFound,
    Unavailable,
    WaitTimeout,
)
from .aio import AsyncClient
from .client import Client

__all__ = [
    "CODES", "MAX_LINE", "PROTOCOL_VERSION", "Aborted", "AgentError", "AsyncClient", "BadRequest", "CkptError",
    "Client", "Conflict", "ConnectFailed", "ConnectionLost", "Event", "Forbidden", "Internal", "NotFound",
    "Unavailable", "WaitTimeout",
]
