"""The process the kill tests SIGKILL: a zygote that imports torch and the registry once, then
forks one child per job (a push or a pull, from the environment's registry) and reports the
child's pid, so the test can kill a real process at a random moment without paying for an
import of torch per trial.

Protocol (one JSON object per line): stdin ``{"op": "push"|"pull", "name": ..., "seed": N,
"ref": ...}``; stdout ``{"pid": P}`` once the child runs, then ``{"pid": P, "status": S}``
(``os.waitpid`` status) when it ended. A pull child exits 3 if it got other weights than
``build(seed)``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

import torch
from torch import nn

LAYERS = 4
WIDTH = 256  # 4 x (256 x 256 + 256) float32: about 1 MiB, 4 shards of 263 KB at 512KiB


def build(seed: int) -> nn.Module:
    """The model a job with ``seed`` pushes (the same weights in every process)."""
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def same_weights(state: dict[str, Any], seed: int) -> bool:
    expected = build(seed).state_dict()
    return state.keys() == expected.keys() and all(
        torch.equal(state[k].cpu(), expected[k]) for k in expected)


def run(job: dict[str, Any]) -> int:
    import registry

    reg = registry.Registry()
    try:
        if job["op"] == "push":
            reg.push(build(job["seed"]), job["name"], tags={"seed": str(job["seed"])},
                     aliases=["production"])
            return 0
        if job["op"] == "moves":  # alias moves, each a change with its event
            for i in range(job["count"]):
                reg.set_alias(job["name"], "production", 1 + i % job["versions"])
            return 0
        state = reg.pull_state_dict(job["ref"], device="cpu")
        return 0 if same_weights(state, job["seed"]) else 3
    finally:
        reg.close()


def main() -> None:
    import registry  # noqa: F401  (imported once, before any fork)

    out = sys.stdout
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = run(job)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"pid": pid, "status": status}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
