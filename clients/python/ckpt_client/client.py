"""The blocking client: Client."""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional, Sequence

from ._protocol import (
    DEFAULT_DIAL_WAIT,
    AgentError,
    ConnectFailed,
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

OnSynced = Callable[[Event], None]


def checkpoint_fields(task: str, n: int, dir: str, engine: Optional[str], handoff: bool,
                      timeout: Optional[float], tasks: Optional[Sequence[str]], job: Optional[str],
                      traceparent: Optional[str], wal_dir: Optional[str] = None) -> Dict[str, Any]:
    """The fields of a checkpoint request."""
    if n <= 0:
        raise ValueError(f"checkpoint number must be positive, got {n}")
    if not os.path.isabs(dir):
        raise ValueError(f"dir must be an absolute path, got {dir!r}")
    if wal_dir is not None and not os.path.isabs(wal_dir):
        raise ValueError(f"wal_dir must be an absolute path, got {wal_dir!r}")
    timeout_ms = None
    if timeout is not None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        timeout_ms = max(1, math.ceil(timeout * 1000))
    return {"task": task, "checkpoint": n, "dir": dir, "engine": engine, "handoff": handoff,
            "timeout_ms": timeout_ms, "tasks": list(tasks) if tasks else None, "job": job,
            "traceparent": traceparent, "wal_dir": wal_dir}


def dial_error(path: str, waited: float, err: BaseException) -> ConnectFailed:
    return ConnectFailed(f"connect to the ckpt agent at {path}: {err} after {waited:.1f}s "
                         f"(is `ckpt agent --socket {path}` running, and is the socket's directory shared with this app?)")


def retryable(err: OSError) -> bool:
    """Whether a failed dial means the agent is not there yet."""
    return isinstance(err, (FileNotFoundError, ConnectionRefusedError))


class Client:
    """A connection to a ckpt agent over its Unix socket (protocol v1).

    Calls are blocking and serialised (one request at a time; use one
    client per thread to run requests in parallel). Each request gets a
    fresh id, and only events carrying it answer it. When the connection is
    lost the call in progress raises ConnectionLost, and the next call dials
    again. Use it as a context manager, or call close.

    ``socket_path`` is the agent's --socket. Connecting retries while the
    socket is missing or refuses connections (an agent starting next to
    the app, or restarting), with backoff from 10 ms to 1 s, for at most
    ``dial_wait`` seconds, then raises ConnectFailed.
    """

    def __init__(self, socket_path: str, *, dial_wait: float = DEFAULT_DIAL_WAIT, connect: bool = True) -> None:
        self.socket_path = socket_path
        self.dial_wait = dial_wait
        self._sock: Optional[socket.socket] = None
        self._buf = bytearray()
        self._lock = threading.Lock()
        self._next = 0
        if connect:
            with self._lock:
                self._dial()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection. Checkpoints past synced go on in the agent."""
        with self._lock:
            self._drop()

    def hello(self, *, wait: Optional[float] = None) -> Event:
        """The agent's hello event: ``protocol`` (1) and ``version``."""
        return self._call("hello", {}, wait)

    def checkpoint(self, task: str, n: int, dir: str, *, engine: Optional[str] = None, handoff: bool = False,
                   timeout: Optional[float] = None, tasks: Optional[Sequence[str]] = None,
                   job: Optional[str] = None, traceparent: Optional[str] = None,
                   on_synced: Optional[OnSynced] = None, wait: Optional[float] = None,
                   wal_dir: Optional[str] = None) -> Event:
        """Checkpoint ``n`` of ``task`` from the snapshot in ``dir`` (an
        absolute path), and return the completed event once it is in storage
        (``checkpoint_size``, ``full_size``, ``files_uploaded``,
        ``files_reused``, ``duration_ms``).

        ``engine`` names the store's engine ("pebble", "rocksdb"), ``handoff``
        gives dir to the agent (do not use it afterwards), ``timeout`` bounds
        the upload in seconds (the agent fails it with Unavailable), ``tasks``
        makes it job-wide. ``on_synced`` is called with the synced event as
        soon as the agent holds its own copy: from then on dir may be
        deleted. ``wait`` bounds the call in seconds (WaitTimeout; the
        checkpoint goes on). ``wal_dir``, the live store's directory (an
        absolute path), makes the agent ship the store's write-ahead log
        between this checkpoint and the next. Raises an AgentError subclass
        with the agent's code, Aborted, or ConnectionLost.
        """
        return self._call("checkpoint", checkpoint_fields(task, n, dir, engine, handoff, timeout, tasks, job, traceparent,
                                                          wal_dir),
                          wait, on_synced)

    def restore(self, task: str, target: str, checkpoint: int = 0, *, job_consistent: bool = False,
                job: Optional[str] = None, wait: Optional[float] = None) -> Event:
        """Restore checkpoint ``checkpoint`` of ``task`` (0: the newest
        complete one) into ``target``, an absolute path that is missing or
        empty; returns the restored event (``restored``, ``checkpoint``,
        ``files``, ``bytes``, ...)."""
        if not os.path.isabs(target):
            raise ValueError(f"target must be an absolute path, got {target!r}")
        return self._call("restore", {"task": task, "target": target, "checkpoint": checkpoint,
                                      "job_consistent": job_consistent, "job": job}, wait)

    def status(self, task: Optional[str] = None, *, job: Optional[str] = None, wait: Optional[float] = None) -> Event:
        """The status event: ``tasks`` lists the task named, or every task
        the agent knows."""
        return self._call("status", {"task": task, "job": job}, wait)

    def abort(self, task: str, n: int, *, job: Optional[str] = None, wait: Optional[float] = None) -> Event:
        """Abort in-flight checkpoint ``n`` of ``task``; returns the aborted
        event once it stopped (NotFound: not in flight; Conflict: it
        completed first)."""
        return self._call("abort", {"task": task, "checkpoint": n, "job": job}, wait)

    def follow(self, task: str, *, wait: Optional[float] = None) -> Event:
        """Ask the agent to keep a warm standby copy of ``task``; returns
        the following event."""
        return self._call("follow", {"task": task}, wait)

    # The connection.

    def _dial(self) -> None:
        start = time.monotonic()
        backoff = 0.01
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.socket_path)
            except OSError as err:
                s.close()
                waited = time.monotonic() - start
                left = self.dial_wait - waited
                if not retryable(err) or left <= 0:
                    raise dial_error(self.socket_path, waited, err) from err
                time.sleep(min(backoff, left))
                backoff = min(2 * backoff, 1.0)
                continue
            self._sock, self._buf = s, bytearray()
            return

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._buf = None, bytearray()

    def _refusal(self) -> Optional[AgentError]:
        """The agent's refusal, when it sent one before closing."""
        assert self._sock is not None
        self._sock.setblocking(False)
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

    def _send(self, line: bytes) -> None:
        if self._sock is None:
            self._dial()
        assert self._sock is not None
        try:
            self._sock.sendall(line)
            return
        except OSError:
            # The agent closed the connection before this request: it never
            # read it, so it is sent again on a new one, unless the agent
            # said it refuses us.
            err = self._refusal()
            self._drop()
            if err is not None:
                raise err from None
        self._dial()
        assert self._sock is not None
        try:
            self._sock.sendall(line)
        except OSError as e:
            self._drop()
            raise ConnectionLost(f"send to the ckpt agent at {self.socket_path}: {e}") from e

    def _next_event(self, deadline: Optional[float]) -> Event:
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
            self._sock.settimeout(timeout)
            try:
                b = self._sock.recv(65536)
            except socket.timeout:
                continue
            except OSError as e:
                self._drop()
                raise ConnectionLost(f"connection to the ckpt agent at {self.socket_path} lost: {e}") from e
            if not b:
                self._drop()
                raise ConnectionLost(f"the ckpt agent at {self.socket_path} closed the connection before answering "
                                     "(it stopped or restarted); ask status for the request's outcome")
            self._buf += b

    def _call(self, op: str, fields: Dict[str, Any], wait: Optional[float],
              on_synced: Optional[OnSynced] = None) -> Event:
        deadline = None if wait is None else time.monotonic() + wait
        with self._lock:
            self._next += 1
            rid = f"py{self._next}"
            self._send(encode(op, rid, fields))
            while True:
                ev = self._next_event(deadline)
                if refusal(ev):
                    self._drop()
                    raise AgentError.of(ev)
                if not answers(ev, rid):
                    continue  # the answer to an earlier request the caller stopped waiting for
                if not final(op, ev):
                    if on_synced is not None:
                        on_synced(ev)
                    continue
                return outcome(op, ev)
