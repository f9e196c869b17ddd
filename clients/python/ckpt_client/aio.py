"""The asyncio client: AsyncClient."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any, Dict, Optional, Sequence

from ._protocol import (
    DEFAULT_DIAL_WAIT,
    AgentError,
    ConnectionLost,
    Event,
    WaitTimeout,
    answers,
    decode,
    encode,
    final,
    outcome,
    refusal,
    split_lines,
)
from .client import OnSynced, checkpoint_fields, dial_error, retryable


class AsyncClient:
    """The asyncio twin of Client: the same methods, as coroutines, with
    the same errors. Create it with ``await AsyncClient.connect(path)``
    inside the event loop that uses it. Requests on one client run one at a
    time; use several clients to run them in parallel.
    """

    def __init__(self, socket_path: str, *, dial_wait: float = DEFAULT_DIAL_WAIT) -> None:
        self.socket_path = socket_path
        self.dial_wait = dial_wait
        self._sock: Optional[socket.socket] = None
        self._buf = bytearray()
        self._lock = asyncio.Lock()
        self._next = 0

    @classmethod
    async def connect(cls, socket_path: str, *, dial_wait: float = DEFAULT_DIAL_WAIT) -> "AsyncClient":
        """A client connected to the agent at socket_path (see Client)."""
        c = cls(socket_path, dial_wait=dial_wait)
        async with c._lock:
            await c._dial()
        return c

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connection. Checkpoints past synced go on in the agent."""
        async with self._lock:
            self._drop()

    async def hello(self, *, wait: Optional[float] = None) -> Event:
        """See Client.hello."""
        return await self._call("hello", {}, wait)

    async def checkpoint(self, task: str, n: int, dir: str, *, engine: Optional[str] = None, handoff: bool = False,
                         timeout: Optional[float] = None, tasks: Optional[Sequence[str]] = None,
                         job: Optional[str] = None, traceparent: Optional[str] = None,
                         on_synced: Optional[OnSynced] = None, wait: Optional[float] = None,
                         wal_dir: Optional[str] = None) -> Event:
        """See Client.checkpoint."""
        return await self._call("checkpoint", checkpoint_fields(task, n, dir, engine, handoff, timeout, tasks, job,
                                                                traceparent, wal_dir), wait, on_synced)

    async def restore(self, task: str, target: str, checkpoint: int = 0, *, job_consistent: bool = False,
                      job: Optional[str] = None, wait: Optional[float] = None) -> Event:
        """See Client.restore."""
        if not os.path.isabs(target):
            raise ValueError(f"target must be an absolute path, got {target!r}")
        return await self._call("restore", {"task": task, "target": target, "checkpoint": checkpoint,
                                            "job_consistent": job_consistent, "job": job}, wait)

    async def status(self, task: Optional[str] = None, *, job: Optional[str] = None,
                     wait: Optional[float] = None) -> Event:
        """See Client.status."""
        return await self._call("status", {"task": task, "job": job}, wait)

    async def abort(self, task: str, n: int, *, job: Optional[str] = None, wait: Optional[float] = None) -> Event:
        """See Client.abort."""
        return await self._call("abort", {"task": task, "checkpoint": n, "job": job}, wait)

    async def follow(self, task: str, *, wait: Optional[float] = None) -> Event:
        """See Client.follow."""
        return await self._call("follow", {"task": task}, wait)

    # The connection: the same steps as Client's, on a non-blocking socket.

    async def _dial(self) -> None:
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        backoff = 0.01
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                await loop.sock_connect(s, self.socket_path)
            except OSError as err:
                s.close()
                waited = time.monotonic() - start
                left = self.dial_wait - waited
                if not retryable(err) or left <= 0:
                    raise dial_error(self.socket_path, waited, err) from err
                await asyncio.sleep(min(backoff, left))
                backoff = min(2 * backoff, 1.0)
                continue
            self._sock, self._buf = s, bytearray()
            return

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._buf = None, bytearray()

    def _refusal(self) -> Optional[AgentError]:
        assert self._sock is not None
        try:
            while True:
                b = self._sock.recv(65536)
                if not b:
                    break
                self._buf += b
        except OSError:
            pass
        for line in split_lines(self._buf):
            ev = decode(line)
            if ev is not None and refusal(ev):
                return AgentError.of(ev)
        return None

    async def _send(self, line: bytes) -> None:
        loop = asyncio.get_running_loop()
        if self._sock is None:
            await self._dial()
        assert self._sock is not None
        try:
            await loop.sock_sendall(self._sock, line)
            return
        except OSError:
            err = self._refusal()  # see Client._send
            self._drop()
            if err is not None:
                raise err from None
        await self._dial()
        assert self._sock is not None
        try:
            await loop.sock_sendall(self._sock, line)
        except OSError as e:
            self._drop()
            raise ConnectionLost(f"send to the ckpt agent at {self.socket_path}: {e}") from e

    async def _next_event(self, deadline: Optional[float]) -> Event:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            for line in split_lines(self._buf):
                ev = decode(line)
                if ev is not None:
                    return ev
            timeout = None
            if deadline is not None:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    raise WaitTimeout("the wait ran out; the request goes on in the agent")
            try:
                b = await asyncio.wait_for(loop.sock_recv(self._sock, 65536), timeout)
            except asyncio.TimeoutError:
                continue
            except OSError as e:
                self._drop()
                raise ConnectionLost(f"connection to the ckpt agent at {self.socket_path} lost: {e}") from e
            if not b:
                self._drop()
                raise ConnectionLost(f"the ckpt agent at {self.socket_path} closed the connection before answering "
                                     "(it stopped or restarted); ask status for the request's outcome")
            self._buf += b

    async def _call(self, op: str, fields: Dict[str, Any], wait: Optional[float],
                    on_synced: Optional[OnSynced] = None) -> Event:
        deadline = None if wait is None else time.monotonic() + wait
        async with self._lock:
            self._next += 1
            rid = f"py{self._next}"
            await self._send(encode(op, rid, fields))
            while True:
                ev = await self._next_event(deadline)
                if refusal(ev):
                    self._drop()
                    raise AgentError.of(ev)
                if not answers(ev, rid):
                    continue
                if not final(op, ev):
                    if on_synced is not None:
                        on_synced(ev)
                    continue
                return outcome(op, ev)
