"""Run every benchmark module (`bench/*_bench.py`), or only those named on the command line.

Usage: python -m bench [NAME ...]   e.g. `python -m bench prepare`
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    available = sorted(
        p.stem.removesuffix("_bench") for p in Path(__file__).parent.glob("*_bench.py")
    )
    chosen = argv or available
    unknown = [name for name in chosen if name not in available]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; available: {available}", file=sys.stderr)
        return 2
    failed: list[str] = []
    for name in chosen:
        print(f"== bench {name}", flush=True)
        started = time.monotonic()
        try:
            importlib.import_module(f"bench.{name}_bench").main()
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            print(f"!! bench {name} failed: {exc!r}", file=sys.stderr)
            failed.append(name)
        print(f"== bench {name}: {time.monotonic() - started:.1f}s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
