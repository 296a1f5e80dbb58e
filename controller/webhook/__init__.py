"""The admission webhook: legacy GPU-sharing pods run unchanged, bad configs refused at the door.

Teams arrive with pod specs written for vgpu-manager, HAMi, gpu-manager or NVIDIA's device plugin.
The mutating half rewrites such a pod, per container, into a DRA claim from a
ResourceClaimTemplate (count, `memory` / `cores` capacity requests, CEL selectors, topology
constraints, a VgpuConfig) and, when it asks for scheduling policies, puts it on the policy path
(the `vgpu.dra.dev/policy` scheduling gate and our `vgpu.dra.dev/*` annotations). The validating
half refuses ResourceClaims, ResourceClaimTemplates and DeviceClasses whose VgpuConfig the kubelet
plugin would refuse at prepare (same parser: `dra_driver.config`), and pods whose annotations
contradict each other.

Modules:
- `legacy`: every foreign (and our own) resource and annotation name, in one table;
- `translate`: pod -> JSONPatch + templates + warnings (pure; raises `Refusal`), and the CEL
  `matchConditions` that route exactly the pods needing translation to the webhook;
- `validation`: object -> list of refusal messages (pure);
- `admission`: a review to its answer (the two above, plus making templates exist);
- `server`: HTTPS in the controller's threads; `certs`: TLS material and the caBundle;
  `templates`: templates ensured per admission, unused ones collected; `facts`: the GPU
  inventory the validation compares against; `metrics`; `flags`; `run`: the wiring.
Only `legacy`, `translate` and `validation` are pure; the rest does the I/O around them.
"""
