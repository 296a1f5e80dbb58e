/*
 * cuda_list - print the devices the CUDA driver exposes to this process, one per line:
 *   <ordinal> <uuid> <pci bus id> <total bytes> <SM count> <name>
 * Used to check CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES selection and ordering. Prints
 * "count=0 <error>" when cuInit fails (e.g. no visible device).
 */
#include "cuda_prog.h"

int main(void)
{
    CUresult rc = cuInit(0);
    if (rc != CUDA_SUCCESS) {
        const char *name = NULL;
        cuGetErrorName(rc, &name);
        printf("count=0 %s\n", name ? name : "?");
        return 0;
    }
    int n = 0;
    CU_OK(cuDeviceGetCount(&n));
    printf("count=%d\n", n);
    for (int i = 0; i < n; i++) {
        char name[128], bus[32];
        CUuuid u;
        size_t total = 0;
        int sms = 0;
        CU_OK(cuDeviceGetName(name, sizeof(name), i));
        CU_OK(cuDeviceGetPCIBusId(bus, sizeof(bus), i));
        CU_OK(cuDeviceGetUuid_v2(&u, i));
        CU_OK(cuDeviceTotalMem_v2(&total, i));
        CU_OK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, i));
        const unsigned char *b = (const unsigned char *)u.bytes;
        printf("%d GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x %s %zu %d %s\n",
               i, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
               b[13], b[14], b[15], bus, total, sms, name);
    }
    return 0;
}
