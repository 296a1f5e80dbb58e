"""Instructions per allocator decision, under callgrind: a load-independent Cython/reference ratio.

Run by `allocator_bench` (one process per cluster size, workload and path) as
`valgrind --tool=callgrind --instr-atstart=no python -m bench.allocator_instructions NODES
WORKLOAD fast|reference COUNT OUT`: builds the cluster with instrumentation off, places one claim
to warm the caches, then switches instrumentation on (callgrind_control) for COUNT decisions
plus commits, exactly the loop the timed benchmark runs, and off again. The callgrind output's
totals divided by COUNT are the instructions per decision (Python interpreter included).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from bench import allocator_bench
from dra_driver.allocator.allocate import Allocator


def _instrument(on: bool) -> None:
    subprocess.run(
        ["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
        check=True,
        capture_output=True,
    )


def main(argv: list[str]) -> int:
    nodes, workload, path, count = int(argv[0]), argv[1], argv[2], int(argv[3])
    obj, policy = allocator_bench.workloads()[workload]
    model, _ = allocator_bench.build(nodes)
    alloc = Allocator(model, fast=path == "fast")
    pod: dict[str, Any] = {"metadata": {"name": "bench"}, "spec": {}}
    todo = allocator_bench.claims(obj, count + 1)
    alloc.place(pod, [todo.pop()], policy)
    allocator_bench.settle()
    _instrument(True)
    for claim in todo:
        alloc.commit(alloc.place(pod, [claim], policy))
    _instrument(False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
