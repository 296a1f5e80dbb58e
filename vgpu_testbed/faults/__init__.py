"""Faults of the whole system under churn (issue 29): a private test bed with real nodes and two
controller replicas (`bed`), a steady churn of mixed pods (`churn`), fault injectors (`catalogue`,
`netem` for partitions and delays inside the bed's own network namespaces, `plugin_steps` for
kills of the kubelet plugin at each step of prepare and unprepare), the invariants checked from
the API and from the nodes' files (`invariants`), recovery measured with canary pods (`run`),
and the process figures of the soak (`sampling`).

Used by `python -m bench chaos`, `python -m bench soak` and tests/e2e/system/test_faults.py;
docs/reliability.md says what each component promises under which fault.
"""
