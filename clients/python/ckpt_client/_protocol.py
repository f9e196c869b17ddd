"""The parts of protocol v1 that do no I/O: requests, events, errors.

Both clients (Client and AsyncClient) share them, so that they speak the
protocol the same way; docs/protocol.md in the ckpt repository is the spec.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Mapping, Optional

PROTOCOL_VERSION = 1
"""The protocol version this package speaks (the hello event's protocol)."""

MAX_LINE = 1 << 20
"""The longest request line the agent reads, in bytes, without the newline."""

DEFAULT_DIAL_WAIT = 30.0
"""Seconds a client waits, by default, for a missing or refusing socket."""

CODES = ("bad_request", "not_found", "conflict", "unavailable", "forbidden", "internal")
"""The error codes of failed and error events."""


class Event(Mapping[str, Any]):
    """One event from the agent: a read-only mapping of its JSON fields.

    ``ev["checkpoint_size"]`` reads a field, ``ev.get("files", 0)`` one an
    event may lack; ``ev.name`` is the event's name (completed, synced,
    status, ...). Fields a newer agent adds are kept as they are.
    """

    __slots__ = ("_fields",)

    def __init__(self, fields: Dict[str, Any]) -> None:
        self._fields = fields

    @property
    def name(self) -> str:
        """The event's name: hello, synced, completed, failed, aborted,
        status, restored, following or error."""
        return str(self._fields.get("event", ""))

    @property
    def id(self) -> Any:
        """The id of the request the event answers, None when it has none."""
        return self._fields.get("id")

    @property
    def task(self) -> Optional[str]:
        """The task the event is about, when it names one."""
        return self._fields.get("task")

    @property
    def checkpoint(self) -> int:
        """The checkpoint number the event is about, 0 when it names none."""
        return int(self._fields.get("checkpoint", 0))

    @property
    def tasks(self) -> List[Dict[str, Any]]:
        """The tasks of a status event."""
        return list(self._fields.get("tasks", []))

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"Event({self._fields!r})"


class CkptError(Exception):
    """Base class of every error the client raises."""


class AgentError(CkptError):
    """The agent refused or failed the request: a failed or error event.

    ``code`` is the protocol's code (one of CODES; a newer agent may send
    another), ``message`` says why in words, ``event`` is the whole event.
    Each known code has its subclass (BadRequest, NotFound, Conflict,
    Unavailable, Forbidden, Internal): ``except Unavailable`` retries.
    """

    def __init__(self, code: str, message: str, event: Optional[Event] = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.event = event

    @staticmethod
    def of(event: Event) -> "AgentError":
        """The error a failed or error event stands for."""
        err = event.get("error") or {}
        code = str(err.get("code", "internal"))
        cls = _BY_CODE.get(code, AgentError)
        return cls(code, str(err.get("message", "")), event)


class BadRequest(AgentError):
    """bad_request: the request is invalid; fix it, do not retry it."""


class NotFound(AgentError):
    """not_found: the task, checkpoint or restore source does not exist."""


class Conflict(AgentError):
    """conflict: an older checkpoint number, a non-empty restore target,
    a fenced agent."""


class Unavailable(AgentError):
    """unavailable: the agent cannot serve it now (queue full, storage
    outage, shutdown, timed out, disk full); retry later."""


class Forbidden(AgentError):
    """forbidden: the peer's credentials do not allow this job, task or
    directory."""


class Internal(AgentError):
    """internal: anything else (the message names the problem)."""


_BY_CODE = {
    "bad_request": BadRequest,
    "not_found": NotFound,
    "conflict": Conflict,
    "unavailable": Unavailable,
    "forbidden": Forbidden,
    "internal": Internal,
}


class Aborted(CkptError):
    """The checkpoint was aborted (an abort request) before it completed."""

    def __init__(self, event: Event) -> None:
        super().__init__(f"checkpoint {event.checkpoint} of task {event.task} aborted")
        self.event = event


class ConnectionLost(CkptError, ConnectionError):
    """The connection closed before the request's last event: its outcome
    is unknown (ask status). The next call dials the agent again."""


class ConnectFailed(CkptError, ConnectionError):
    """The agent's socket stayed missing or refusing past the dial wait, or
    could not be opened at all (a permission denied)."""


class WaitTimeout(CkptError, TimeoutError):
    """The caller's wait ran out; the request goes on in the agent."""


def encode(op: str, rid: str, fields: Mapping[str, Any]) -> bytes:
    """One request line: op, id, and the fields that are set (None, False,
    0, "" and empty lists are left out, as the agent reads them so)."""
    req: Dict[str, Any] = {"op": op, "id": rid}
    for k, v in fields.items():
        if v is None or v is False or v == "" or (isinstance(v, (list, tuple)) and not v):
            continue
        if isinstance(v, int) and not isinstance(v, bool) and v == 0:
            continue
        req[k] = list(v) if isinstance(v, tuple) else v
    line = json.dumps(req, separators=(",", ":"), ensure_ascii=False).encode()
    if len(line) > MAX_LINE:
        raise ValueError(f"request of {len(line)} bytes exceeds the agent's {MAX_LINE} byte line limit")
    return line + b"\n"


def decode(line: bytes) -> Optional[Event]:
    """The event on a line, or None for a line that is not a JSON object."""
    try:
        v = json.loads(line)
    except ValueError:
        return None
    return Event(v) if isinstance(v, dict) else None


def answers(ev: Event, rid: str) -> bool:
    """Whether ev answers the request with id rid: it carries that id.
    Events for other ids answer requests the caller stopped waiting for."""
    return ev.id == rid


def final(op: str, ev: Event) -> bool:
    """Whether ev is the request's last event: every event is, but a
    checkpoint's synced, which completed, failed or aborted follows."""
    return not (op == "checkpoint" and ev.name == "synced")


def outcome(op: str, ev: Event) -> Event:
    """The request's last event as returned, or the error it stands for:
    failed and error events raise AgentError, a checkpoint's aborted event
    raises Aborted (an abort request's aborted event is its answer)."""
    if ev.name in ("failed", "error"):
        raise AgentError.of(ev)
    if op == "checkpoint" and ev.name == "aborted":
        raise Aborted(ev)
    return ev


def refusal(ev: Event) -> bool:
    """Whether ev is the agent refusing the connection: an error event with
    no id, sent just before it closes."""
    return ev.name == "error" and ev.id is None


def split_lines(buf: bytearray) -> Iterator[bytes]:
    """The complete lines at the start of buf, removed from it."""
    while True:
        i = buf.find(b"\n")
        if i < 0:
            return
        line = bytes(buf[:i])
        del buf[: i + 1]
        yield line
