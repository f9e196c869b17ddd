"""The conformance driver of the Python client (see clients/README.md).

It reads one call per line on stdin and answers each with one line on
stdout, making the call through Client, or through AsyncClient when the
call's "mode" is "async":

    go run ./clients/conformance -- python3 clients/python/tests/driver.py
    go run ./clients/conformance -mode async -- python3 clients/python/tests/driver.py

--break ids|synced runs a deliberately broken client (it ignores ids, or
takes synced for the end of a checkpoint): the suite must fail it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, Dict, Optional, Union

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import ckpt_client  # noqa: E402
from ckpt_client import aio, client  # noqa: E402

AnyClient = Union[ckpt_client.Client, ckpt_client.AsyncClient]


def breakage(kind: str) -> None:
    if kind == "ids":
        client.answers = aio.answers = lambda ev, rid: True  # type: ignore[assignment]
    elif kind == "synced":
        client.final = aio.final = lambda op, ev: True  # type: ignore[assignment]
    elif kind:
        sys.exit(f"unknown --break {kind}")


def error(kind: str, e: BaseException, code: Optional[str] = None) -> Dict[str, Any]:
    return {"error": {"kind": kind, "code": code, "message": str(e)}}


def args_of(cmd: Dict[str, Any]) -> Dict[str, Any]:
    wait = cmd.get("wait_ms")
    out: Dict[str, Any] = {"wait": wait / 1000 if wait else None}
    return out


async def call(c: Optional[AnyClient], cmd: Dict[str, Any]) -> Any:
    """Makes the call on c, awaiting it when c is an AsyncClient."""
    name = cmd["call"]
    kw = args_of(cmd)
    if name == "hello":
        r = c.hello(**kw)
    elif name == "checkpoint":
        t = cmd.get("timeout_ms")
        r = c.checkpoint(cmd["task"], cmd["checkpoint"], cmd["dir"], engine=cmd.get("engine"),
                         handoff=bool(cmd.get("handoff")), timeout=t / 1000 if t else None, **kw)
    elif name == "restore":
        r = c.restore(cmd["task"], cmd["target"], cmd.get("checkpoint", 0), **kw)
    elif name == "status":
        r = c.status(cmd.get("task"), **kw)
    elif name == "abort":
        r = c.abort(cmd["task"], cmd["checkpoint"], **kw)
    elif name == "follow":
        r = c.follow(cmd["task"], **kw)
    else:
        raise ValueError(f"unknown call {name}")
    if asyncio.iscoroutine(r):
        r = await r
    return r


async def serve(lines: Any) -> None:
    c: Optional[AnyClient] = None
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, lines.readline)
        if not line:
            break
        cmd = json.loads(line)
        name = cmd["call"]
        try:
            if name == "connect":
                wait = cmd["dial_wait_ms"] / 1000
                if cmd.get("mode") == "async":
                    c = await ckpt_client.AsyncClient.connect(cmd["socket"], dial_wait=wait)
                else:
                    c = ckpt_client.Client(cmd["socket"], dial_wait=wait)
                out: Dict[str, Any] = {"ok": True}
            elif name == "close":
                if c is not None:
                    r = c.close()
                    if asyncio.iscoroutine(r):
                        await r
                c = None
                out = {"ok": True}
            else:
                ev = await call(c, cmd)
                out = {"event": dict(ev)}
        except ckpt_client.AgentError as e:
            out = error("agent", e, e.code)
        except ckpt_client.Aborted as e:
            out = error("aborted", e)
        except ckpt_client.ConnectionLost as e:
            out = error("connection", e)
        except ckpt_client.ConnectFailed as e:
            out = error("connect", e)
        except ckpt_client.WaitTimeout as e:
            out = error("timeout", e)
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--break", dest="brk", default="")
    breakage(p.parse_args().brk)
    asyncio.run(serve(sys.stdin))


if __name__ == "__main__":
    main()
