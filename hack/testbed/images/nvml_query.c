/*
 * nvml_query - what a GPU monitoring tool in a container sees through NVML, one line per GPU:
 *   gpu <index> uuid=<uuid> name=<name> total=<bytes> used=<bytes> free=<bytes>
 * preceded by "hook=mapped|absent" (is the vgpu hook, libvgpu.so, in this process: it arrives
 * through /etc/ld.so.preload, never through this program) and "count=<n>" (or "error=..."). libnvidia-ml.so.1 is dlopen'ed by soname, the
 * way pynvml does, so it is the driver library the runtime injected (the simulated one in the
 * test bed) and the preloaded vgpu hook sees the calls.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    unsigned long long total, free, used;
} nvml_memory_t;
typedef void *nvml_device_t;

static int hook_mapped(void)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    if (!maps)
        return 0;
    while (!found && fgets(line, sizeof line, maps))
        found = strstr(line, "libvgpu.so") != NULL;
    fclose(maps);
    return found;
}

int main(void)
{
    printf("hook=%s\n", hook_mapped() ? "mapped" : "absent");
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        printf("error=dlopen %s\n", dlerror());
        return 1;
    }
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*count_fn)(unsigned *) = (int (*)(unsigned *))dlsym(lib, "nvmlDeviceGetCount_v2");
    int (*handle_fn)(unsigned, nvml_device_t *) =
        (int (*)(unsigned, nvml_device_t *))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    int (*name_fn)(nvml_device_t, char *, unsigned) =
        (int (*)(nvml_device_t, char *, unsigned))dlsym(lib, "nvmlDeviceGetName");
    int (*uuid_fn)(nvml_device_t, char *, unsigned) =
        (int (*)(nvml_device_t, char *, unsigned))dlsym(lib, "nvmlDeviceGetUUID");
    int (*mem_fn)(nvml_device_t, nvml_memory_t *) =
        (int (*)(nvml_device_t, nvml_memory_t *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    if (!init || !count_fn || !handle_fn || !name_fn || !uuid_fn || !mem_fn) {
        printf("error=missing symbol\n");
        return 1;
    }
    int rc = init();
    if (rc != 0) {
        printf("error=%d\n", rc);
        return 1;
    }
    unsigned n = 0;
    rc = count_fn(&n);
    if (rc != 0) {
        printf("error=%d\n", rc);
        return 1;
    }
    printf("count=%u\n", n);
    for (unsigned i = 0; i < n; i++) {
        nvml_device_t dev;
        char name[96] = "", uuid[96] = "";
        nvml_memory_t mem = {0, 0, 0};
        if (handle_fn(i, &dev) || name_fn(dev, name, sizeof name) ||
            uuid_fn(dev, uuid, sizeof uuid) || mem_fn(dev, &mem)) {
            printf("gpu %u error\n", i);
            continue;
        }
        printf("gpu %u uuid=%s name=%s total=%llu used=%llu free=%llu\n", i, uuid, name,
               mem.total, mem.used, mem.free);
    }
    fflush(stdout);
    return 0;
}
