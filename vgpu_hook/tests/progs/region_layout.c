/* region_layout - prints the region ABI (sizes and field offsets) as JSON, so that the Python
 * mirror (kubelet_plugin/region.py) is checked against the compiler, not against a copy. */
#include <stddef.h>
#include <stdio.h>

#include "region.h"

#define DEV(f) printf("    \"%s\": %zu,\n", #f, offsetof(struct vgpu_region_device, f))
#define TOP(f) printf("    \"%s\": %zu,\n", #f, offsetof(struct vgpu_region, f))

int main(void) {
    printf("{\n  \"magic\": %u,\n  \"version\": %u,\n", VGPU_REGION_MAGIC, VGPU_REGION_VERSION);
    printf("  \"max_devices\": %d,\n  \"max_slots\": %d,\n", VGPU_MAX_DEVICES, VGPU_MAX_SLOTS);
    printf("  \"region_size\": %zu,\n  \"device_size\": %zu,\n  \"slot_size\": %zu,\n",
           sizeof(struct vgpu_region), sizeof(struct vgpu_region_device),
           sizeof(struct vgpu_region_slot));
    printf("  \"lock_base\": %lld,\n", (long long)VGPU_LOCK_BASE);
    printf("  \"region\": {\n");
    TOP(magic); TOP(version); TOP(size); TOP(device_count); TOP(ready); TOP(slot_hwm); TOP(created_ns);
    TOP(claim); TOP(devices);
    printf("    \"slots\": %zu\n  },\n", offsetof(struct vgpu_region, slots));
    printf("  \"device\": {\n");
    DEV(uuid); DEV(memory_limit); DEV(cores); DEV(policy); DEV(rate); DEV(rate_stamp_ns);
    DEV(rate_source); DEV(governor_stamp_ns); DEV(credit); DEV(refill_stamp_ns); DEV(launches);
    DEV(launch_cost); DEV(throttled_ns); DEV(oversub_allocs); DEV(ctl_stamp_ns);
    DEV(ctl_cost_mark); DEV(ctl_gain_bits); DEV(ctl_integral_bits); DEV(util_milli); DEV(throttle_mark); DEV(seed_gain_bits); DEV(ctl_window_ns); DEV(ctl_learning_anchor);
    DEV(ctl_hold); DEV(ctl_weight_bits); DEV(ctl_poll_cost); DEV(ctl_poll_fresh); DEV(ctl_steps);
    DEV(ctl_moved);
    printf("    \"ctl_seen_ns\": %zu\n  },\n", offsetof(struct vgpu_region_device, ctl_seen_ns));
    printf("  \"slot\": {\n    \"pid\": %zu,\n    \"generation\": %zu,\n    \"used\": %zu,\n"
           "    \"managed\": %zu\n  }\n}\n",
           offsetof(struct vgpu_region_slot, pid), offsetof(struct vgpu_region_slot, generation),
           offsetof(struct vgpu_region_slot, used), offsetof(struct vgpu_region_slot, managed));
    return 0;
}
