"""Run every benchmark module (`bench/*_bench.py`), or only those named on the command line.

Usage: python -m bench [NAME ...]   e.g. `python -m bench prepare`
The long runs of issue 29 run only when named, with their options after the name:
`python -m bench chaos [--short ...]`, `python -m bench soak --minutes N`.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

ON_REQUEST = ("chaos", "soak")  # long runs: only when named, options after the name


def main(argv: list[str]) -> int:
    available = sorted(
        p.stem.removesuffix("_bench") for p in Path(__file__).parent.glob("*_bench.py")
    )
    options: list[str] = []
    if argv and argv[0] in ON_REQUEST:
        argv, options = argv[:1], argv[1:]
    chosen = argv or [name for name in available if name not in ON_REQUEST]
    unknown = [name for name in chosen if name not in available]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; available: {available}", file=sys.stderr)
        return 2
    failed: list[str] = []
    for name in chosen:
        print(f"== bench {name}", flush=True)
        started = time.monotonic()
        try:
            module = importlib.import_module(f"bench.{name}_bench")
            module.main(options) if name in ON_REQUEST else module.main()
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            print(f"!! bench {name} failed: {exc!r}", file=sys.stderr)
            failed.append(name)
        print(f"== bench {name}: {time.monotonic() - started:.1f}s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
