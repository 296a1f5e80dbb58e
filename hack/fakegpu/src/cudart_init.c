/*
 * cudart_init.c - the simulated runtime's initialisation, driver entry points, current device and
 * primary contexts, error state and strings, versions, and cudaGetDriverEntryPoint.
 *
 * Initialisation is lazy and happens once (pthread_once, no constructor): the first call that
 * needs the driver dlopens libcuda.so.1, looks up only cuGetProcAddress_v2 with dlsym, resolves
 * every entry point of cudart_driver.def through it (as NVIDIA's runtime does, so an interposer
 * such as vgpu_hook sees the same requests), then calls cuInit. The runtime works in each
 * device's primary context, retained on first use and made current on the calling thread unless
 * the thread already has a current context (a context made current through the driver API is
 * used as it is, as the real runtime does).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cudart_internal.h"

struct cudart_driver cudart_drv;

#define CUDART_MAX_DEVICES 64

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static cudaError_t init_result = cudaErrorInitializationError;
static int device_count;

static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primaries[CUDART_MAX_DEVICES]; /* retained primary contexts, by ordinal */

static __thread int tls_device;                  /* cudaSetDevice; 0 until set */
static __thread cudaError_t tls_last_error;      /* cudaGetLastError */

static void resolve_entry_points(void) {
    CUdriverProcAddressQueryResult status;
    void *fn;
#define CUDART_DRV(sym, base, version)                                                            \
    fn = NULL;                                                                                    \
    if (cudart_drv.cuGetProcAddress_v2(#base, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT,         \
                                       &status) == CUDA_SUCCESS &&                                \
        status == CU_GET_PROC_ADDRESS_SUCCESS)                                                    \
        cudart_drv.sym = (__typeof__(cudart_drv.sym))fn;
#include "cudart_driver.def"
#undef CUDART_DRV
}

static void do_init(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *gpa = lib != NULL ? dlsym(lib, "cuGetProcAddress_v2") : NULL;
    if (gpa == NULL) {
        init_result = cudaErrorInsufficientDriver;
        return;
    }
    cudart_drv.cuGetProcAddress_v2 = (__typeof__(cudart_drv.cuGetProcAddress_v2))gpa;
    resolve_entry_points();
    int version = 0;
    if (cudart_drv.cuInit == NULL || cudart_drv.cuDriverGetVersion == NULL ||
        cudart_drv.cuDeviceGetCount == NULL ||
        cudart_drv.cuDriverGetVersion(&version) != CUDA_SUCCESS ||
        version / 1000 < VGPU_CUDART_MAJOR) {
        /* A driver of an older major version cannot run this runtime. */
        init_result = cudaErrorInsufficientDriver;
        return;
    }
    CUresult rc = cudart_drv.cuInit(0);
    if (rc == CUDA_SUCCESS) rc = cudart_drv.cuDeviceGetCount(&device_count);
    if (rc == CUDA_SUCCESS && device_count > CUDART_MAX_DEVICES) device_count = CUDART_MAX_DEVICES;
    init_result = rc == CUDA_SUCCESS ? cudaSuccess : cudart_error(rc);
}

cudaError_t cudart_init(void) {
    pthread_once(&init_once, do_init);
    return init_result;
}

int cudart_device_count(void) { return device_count; }

int cudart_thread_device(void) { return tls_device; }

void cudart_set_thread_device(int dev) { tls_device = dev; }

cudaError_t cudart_primary(int dev, CUcontext *ctx) {
    CUDART_TRY(cudart_init());
    if (dev < 0 || dev >= device_count) return cudaErrorInvalidDevice;
    pthread_mutex_lock(&primary_lock);
    CUresult rc = CUDA_SUCCESS;
    if (primaries[dev] == NULL) {
        CUdevice d = 0;
        rc = cudart_drv.cuDeviceGet(&d, dev);
        if (rc == CUDA_SUCCESS) rc = cudart_drv.cuDevicePrimaryCtxRetain(&primaries[dev], d);
    }
    *ctx = primaries[dev];
    pthread_mutex_unlock(&primary_lock);
    return cudart_error(rc);
}

void cudart_forget_primary(int dev) {
    if (dev < 0 || dev >= CUDART_MAX_DEVICES) return;
    pthread_mutex_lock(&primary_lock);
    primaries[dev] = NULL;
    pthread_mutex_unlock(&primary_lock);
}

cudaError_t cudart_ctx(CUcontext *ctx, int *dev) {
    CUDART_TRY(cudart_init());
    CUcontext cur = NULL;
    if (cudart_drv.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != NULL) {
        if (dev != NULL) {
            CUdevice d = 0;
            CUDART_TRY(cudart_error(cudart_drv.cuCtxGetDevice(&d)));
            *dev = d;
        }
        if (ctx != NULL) *ctx = cur;
        return cudaSuccess;
    }
    CUcontext primary;
    CUDART_TRY(cudart_primary(tls_device, &primary));
    CUDART_TRY(cudart_error(cudart_drv.cuCtxSetCurrent(primary)));
    if (ctx != NULL) *ctx = primary;
    if (dev != NULL) *dev = tls_device;
    return cudaSuccess;
}

/* ---- Errors ---------------------------------------------------------------------------------- */

struct error_name {
    cudaError_t code;
    const char *name;
};

#define ERROR_ROW(flag, name, text) ERROR_ROW_(flag, name, text)
#define ERROR_ROW_(flag, name, text) ERROR_ROW_##flag(name, text)
#define ERROR_ROW_0(name, text)
#define ERROR_ROW_1(name, text) {name, text},

/* Every enum cudaError value of this major version, with its name (cudaGetErrorName). */
static const struct error_name error_names[] = {
#define CUDART_ERROR(name, value, in12, in13) ERROR_ROW(VGPU_CUDART_IN(in12, in13), name, #name)
#include "cudart_errors.def"
#undef CUDART_ERROR
};

static const struct error_name *find_error(cudaError_t code) {
    for (size_t i = 0; i < sizeof(error_names) / sizeof(error_names[0]); i++)
        if (error_names[i].code == code) return &error_names[i];
    return NULL;
}

cudaError_t cudart_error(CUresult rc) {
    /* The runtime's codes were aligned with the driver's: the same number means the same
     * failure (CUDA_ERROR_OUT_OF_MEMORY = cudaErrorMemoryAllocation = 2, ...). */
    if (rc == CUDA_SUCCESS) return cudaSuccess;
    return find_error((cudaError_t)rc) != NULL ? (cudaError_t)rc : cudaErrorUnknown;
}

cudaError_t cudart_ret(cudaError_t err) {
    if (err != cudaSuccess) tls_last_error = err;
    return err;
}

CUDART_API cudaError_t cudaGetLastError(void) {
    cudaError_t err = tls_last_error;
    tls_last_error = cudaSuccess;
    return err;
}

CUDART_API cudaError_t cudaPeekAtLastError(void) { return tls_last_error; }

CUDART_API const char *cudaGetErrorName(cudaError_t error) {
    const struct error_name *e = find_error(error);
    return e != NULL ? e->name : "unrecognized error code";
}

/* Descriptions of the errors the simulated runtime and driver produce; any other known code is
 * described by its name. */
static const struct error_name error_texts[] = {
    {cudaSuccess, "no error"},
    {cudaErrorInvalidValue, "invalid argument"},
    {cudaErrorMemoryAllocation, "out of memory"},
    {cudaErrorInitializationError, "initialization error"},
    {cudaErrorCudartUnloading, "driver shutting down"},
    {cudaErrorInvalidConfiguration, "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver,
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorInvalidResourceHandle, "invalid resource handle"},
    {cudaErrorNoDevice, "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "invalid device ordinal"},
    {cudaErrorDevicesUnavailable, "CUDA-capable device(s) is/are busy or unavailable"},
    {cudaErrorDeviceUninitialized, "invalid device context"},
    {cudaErrorInvalidDeviceFunction, "invalid device function"},
    {cudaErrorSymbolNotFound, "named symbol not found"},
    {cudaErrorNotReady, "device not ready"},
    {cudaErrorIllegalAddress, "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "too many resources requested for launch"},
    {cudaErrorPeerAccessUnsupported, "peer access is not supported between these two devices"},
    {cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "peer access has not been enabled"},
    {cudaErrorCooperativeLaunchTooLarge, "too many blocks in cooperative launch"},
    {cudaErrorHostMemoryAlreadyRegistered,
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered,
     "pointer does not correspond to a registered memory region"},
    {cudaErrorNotPermitted, "operation not permitted"},
    {cudaErrorNotSupported, "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing"},
    {cudaErrorUnknown, "unknown error"},
};

CUDART_API const char *cudaGetErrorString(cudaError_t error) {
    for (size_t i = 0; i < sizeof(error_texts) / sizeof(error_texts[0]); i++)
        if (error_texts[i].code == error) return error_texts[i].name;
    const struct error_name *e = find_error(error);
    return e != NULL ? e->name : "unrecognized error code";
}

/* ---- Versions -------------------------------------------------------------------------------- */

CUDART_API cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
    if (runtimeVersion == NULL) return cudart_ret(cudaErrorInvalidValue);
    *runtimeVersion = cudart_runtime_version;
    return cudaSuccess;
}

/* 0 without a driver, as the real runtime reports. */
CUDART_API cudaError_t cudaDriverGetVersion(int *driverVersion) {
    if (driverVersion == NULL) return cudart_ret(cudaErrorInvalidValue);
    (void)cudart_init();
    *driverVersion = 0;
    if (cudart_drv.cuDriverGetVersion == NULL) return cudaSuccess;
    return cudart_ret(cudart_error(cudart_drv.cuDriverGetVersion(driverVersion)));
}

/* ---- Driver entry points --------------------------------------------------------------------- */

/* A driver function by base name, through the driver's cuGetProcAddress (and so through any
 * interposer on it): cudaSuccess with NULL when the driver has no such function or none old
 * enough, with the reason in driverStatus. The flag values are the driver's
 * (cudaEnableDefault = CU_GET_PROC_ADDRESS_DEFAULT, ...). */
static cudaError_t entry_point(const char *symbol, void **funcPtr, int cudaVersion,
                               unsigned long long flags,
                               enum cudaDriverEntryPointQueryResult *driverStatus) {
    if (symbol == NULL || funcPtr == NULL || flags > cudaEnablePerThreadDefaultStream)
        return cudart_ret(cudaErrorInvalidValue);
    *funcPtr = NULL;
    cudaError_t init = cudart_init();
    if (cudart_drv.cuGetProcAddress_v2 == NULL) return cudart_ret(init);
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult rc = cudart_drv.cuGetProcAddress_v2(symbol, funcPtr, cudaVersion, flags, &status);
    if (driverStatus != NULL) *driverStatus = (enum cudaDriverEntryPointQueryResult)status;
    if (rc == CUDA_ERROR_NOT_FOUND) {
        *funcPtr = NULL;
        return cudaSuccess;
    }
    return cudart_ret(cudart_error(rc));
}

CUDART_API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr,
                                               unsigned long long flags,
                                               enum cudaDriverEntryPointQueryResult *driverStatus) {
    return entry_point(symbol, funcPtr, cudart_runtime_version, flags, driverStatus);
}
CUDART_PER_THREAD(cudaGetDriverEntryPoint, cudaGetDriverEntryPoint_ptsz);

CUDART_API cudaError_t cudaGetDriverEntryPointByVersion(
    const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *driverStatus) {
    if (cudaVersion > 0x7fffffffu) return cudart_ret(cudaErrorInvalidValue);
    return entry_point(symbol, funcPtr, (int)cudaVersion, flags, driverStatus);
}
CUDART_PER_THREAD(cudaGetDriverEntryPointByVersion, cudaGetDriverEntryPointByVersion_ptsz);

/* No profiler is ever attached to a simulated GPU: starting and stopping collection succeed and
 * do nothing, as with the real runtime when no tool is attached. */
CUDART_API cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
CUDART_API cudaError_t cudaProfilerStop(void) { return cudaSuccess; }
