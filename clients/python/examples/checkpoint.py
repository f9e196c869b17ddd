"""Checkpoint a store's snapshot through the agent and print the outcome.

    python3 checkpoint.py SOCKET TASK N DIR [ENGINE]

DIR is the snapshot (for RocksDB: `ldb --db=DB checkpoint --checkpoint_dir=DIR`,
or rocksdb::Checkpoint). Prints the completed event as JSON; exits 1 with
the agent's code on failure.
"""

import json
import sys

from ckpt_client import AgentError, Client


def main() -> int:
    socket, task, n, snap = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    engine = sys.argv[5] if len(sys.argv) > 5 else None
    with Client(socket, dial_wait=10) as c:
        try:
            done = c.checkpoint(task, n, snap, engine=engine, timeout=120,
                                on_synced=lambda ev: print(f"synced in {ev['sync_ms']} ms", file=sys.stderr))
        except AgentError as e:
            print(f"checkpoint {n} of {task}: {e.code}: {e.message}", file=sys.stderr)
            return 1
        print(json.dumps(dict(done)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
