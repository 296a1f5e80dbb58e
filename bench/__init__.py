"""Benchmarks: each `bench/<name>_bench.py` has a `main() -> None` that measures one part and
writes `bench/results/<name>.json`. `python -m bench` (make bench) runs them all. What several of
them share (writing a result document, claim requests, percentiles) lives in `bench/common.py`."""
