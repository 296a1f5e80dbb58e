/*
 * cudart_launch.c - the nvcc registration ABI, kernel launches, function attributes and
 * occupancy.
 *
 * A program built by nvcc registers, from its static initialisers, each fat binary
 * (__cudaRegisterFatBinary) and each kernel's host stub address with the kernel's device name
 * (__cudaRegisterFunction); a `kernel<<<grid, block, smem, stream>>>(args)` pushes the launch
 * configuration (__cudaPushCallConfiguration), and the stub pops it and calls
 * cudaLaunchKernel(stub address, ...) - or, from CUDA 13's nvcc, __cudaGetKernel once and then
 * __cudaLaunchKernel. Registration is only bookkeeping (a hash table from stub address to fat
 * binary and name): PyTorch registers thousands of kernels at import and launches few. A kernel's
 * first launch loads its fat binary into the driver (cuLibraryLoadData; the simulated driver
 * accepts any image and never reads it) and looks the kernel up by name (cuLibraryGetKernel);
 * every launch is then cuLaunchKernel of that kernel's function in the current context, so the
 * simulated driver times it with its kernel model (a "__ns<N>" part of the device name sets the
 * time of one wave of blocks, else VGPU_SIM_KERNEL_NS, default 20 us) and a preloaded vgpu_hook
 * paces it like any driver launch. Device variables (__cudaRegisterVar/ManagedVar) are accepted
 * and not simulated.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cudart_internal.h"

struct fatbin {
    const void *image;     /* what nvcc registered (its fat binary wrapper), handed to the driver */
    CUlibrary lib;         /* loaded on the first launch of one of its kernels */
    struct fatbin *next;   /* all registered fat binaries */
};

struct kernel {
    const void *host_fun;  /* the stub address launches name */
    struct fatbin *fb;
    char *name;            /* the device (mangled) name */
    CUkernel handle;       /* looked up on first launch */
    struct kernel *next;   /* hash chain */
};

#define BUCKETS 4096

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kernel *buckets[BUCKETS];
static struct fatbin *fatbins;

static size_t bucket_of(const void *host_fun) {
    uintptr_t p = (uintptr_t)host_fun;
    return (size_t)((p >> 4) ^ (p >> 16)) % BUCKETS;
}

/* The registered kernel of a stub address (lock held). */
static struct kernel *find_kernel(const void *host_fun) {
    struct kernel *k = buckets[bucket_of(host_fun)];
    while (k != NULL && k->host_fun != host_fun) k = k->next;
    return k;
}

static int is_fatbin(const struct fatbin *fb) {
    for (struct fatbin *f = fatbins; f != NULL; f = f->next)
        if (f == fb) return 1;
    return 0;
}

/* ---- Registration ---------------------------------------------------------------------------- */

CUDART_API void **__cudaRegisterFatBinary(void *fatCubin) {
    struct fatbin *fb = calloc(1, sizeof(*fb));
    if (fb == NULL) return NULL;
    fb->image = fatCubin;
    pthread_mutex_lock(&reg_lock);
    fb->next = fatbins;
    fatbins = fb;
    pthread_mutex_unlock(&reg_lock);
    return (void **)fb;
}

CUDART_API void __cudaRegisterFatBinaryEnd(void **fatCubinHandle) { (void)fatCubinHandle; }

/* Forgets the fat binary's kernels and unloads it from the driver if it was loaded. */
CUDART_API void __cudaUnregisterFatBinary(void **fatCubinHandle) {
    struct fatbin *fb = (struct fatbin *)fatCubinHandle;
    pthread_mutex_lock(&reg_lock);
    struct fatbin **pp = &fatbins;
    while (*pp != NULL && *pp != fb) pp = &(*pp)->next;
    if (*pp == NULL) {
        pthread_mutex_unlock(&reg_lock);
        return;
    }
    *pp = fb->next;
    for (size_t b = 0; b < BUCKETS; b++) {
        for (struct kernel **kp = &buckets[b]; *kp != NULL;) {
            struct kernel *k = *kp;
            if (k->fb != fb) {
                kp = &k->next;
                continue;
            }
            *kp = k->next;
            free(k->name);
            free(k);
        }
    }
    pthread_mutex_unlock(&reg_lock);
    if (fb->lib != NULL && cudart_drv.cuLibraryUnload != NULL) (void)cudart_drv.cuLibraryUnload(fb->lib);
    free(fb);
}

CUDART_API void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                                       const char *deviceName, int thread_limit, uint3 *tid,
                                       uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize) {
    (void)deviceFun, (void)thread_limit, (void)tid, (void)bid, (void)bDim, (void)gDim,
        (void)wSize;
    struct fatbin *fb = (struct fatbin *)fatCubinHandle;
    if (hostFun == NULL || deviceName == NULL) return;
    struct kernel *k = calloc(1, sizeof(*k));
    char *name = strdup(deviceName);
    if (k == NULL || name == NULL) {
        free(k);
        free(name);
        return;
    }
    k->host_fun = hostFun;
    k->fb = fb;
    k->name = name;
    pthread_mutex_lock(&reg_lock);
    if (!is_fatbin(fb) || find_kernel(hostFun) != NULL) { /* unknown binary, or registered twice */
        pthread_mutex_unlock(&reg_lock);
        free(name);
        free(k);
        return;
    }
    size_t b = bucket_of(hostFun);
    k->next = buckets[b];
    buckets[b] = k;
    pthread_mutex_unlock(&reg_lock);
}

CUDART_API void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                                  const char *deviceName, int ext, size_t size, int constant,
                                  int global) {
    (void)fatCubinHandle, (void)hostVar, (void)deviceAddress, (void)deviceName, (void)ext,
        (void)size, (void)constant, (void)global;
}

CUDART_API void __cudaRegisterManagedVar(void **fatCubinHandle, void **hostVarPtrAddress,
                                         char *deviceAddress, const char *deviceName, int ext,
                                         size_t size, int constant, int global) {
    (void)fatCubinHandle, (void)hostVarPtrAddress, (void)deviceAddress, (void)deviceName,
        (void)ext, (void)size, (void)constant, (void)global;
}

CUDART_API char __cudaInitModule(void **fatCubinHandle) {
    (void)fatCubinHandle;
    return 1;
}

/* ---- Launch configuration (<<<grid, block, smem, stream>>>) ----------------------------------- */

struct call_config {
    dim3 grid, block;
    size_t shared;
    cudaStream_t stream;
};

#define CONFIG_DEPTH 16

static __thread struct call_config tls_configs[CONFIG_DEPTH];
static __thread int tls_config_depth;

CUDART_API unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                                struct CUstream_st *stream) {
    if (tls_config_depth >= CONFIG_DEPTH) return 1;
    tls_configs[tls_config_depth++] = (struct call_config){gridDim, blockDim, sharedMem, stream};
    return 0;
}

CUDART_API cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                                  void *stream) {
    if (tls_config_depth == 0) return cudart_ret(cudaErrorMissingConfiguration);
    const struct call_config *c = &tls_configs[--tls_config_depth];
    if (gridDim != NULL) *gridDim = c->grid;
    if (blockDim != NULL) *blockDim = c->block;
    if (sharedMem != NULL) *sharedMem = c->shared;
    if (stream != NULL) *(cudaStream_t *)stream = c->stream;
    return cudaSuccess;
}

/* ---- Kernels --------------------------------------------------------------------------------- */

/* The driver kernel of a registered stub, loading its fat binary on first use. */
static cudaError_t kernel_handle(const void *func, CUkernel *out) {
    CUDART_TRY(cudart_init());
    if (cudart_drv.cuLibraryLoadData == NULL || cudart_drv.cuLibraryGetKernel == NULL)
        return cudaErrorNotSupported;
    pthread_mutex_lock(&reg_lock);
    struct kernel *k = find_kernel(func);
    CUresult rc = CUDA_SUCCESS;
    if (k != NULL && k->fb->lib == NULL)
        rc = cudart_drv.cuLibraryLoadData(&k->fb->lib, k->fb->image, NULL, NULL, 0, NULL, NULL, 0);
    if (k != NULL && rc == CUDA_SUCCESS && k->handle == NULL)
        rc = cudart_drv.cuLibraryGetKernel(&k->handle, k->fb->lib, k->name);
    CUkernel handle = k != NULL ? k->handle : NULL;
    pthread_mutex_unlock(&reg_lock);
    if (k == NULL) return cudaErrorInvalidDeviceFunction;
    if (rc != CUDA_SUCCESS) return cudart_error(rc);
    *out = handle;
    return cudaSuccess;
}

/* A kernel's function in the current context. */
static cudaError_t kernel_function(CUkernel kernel, CUfunction *out) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    if (cudart_drv.cuKernelGetFunction == NULL) return cudaErrorNotSupported;
    CUresult rc = cudart_drv.cuKernelGetFunction(out, kernel);
    return rc == CUDA_ERROR_INVALID_HANDLE ? cudaErrorInvalidDeviceFunction : cudart_error(rc);
}

cudaError_t cudart_function(const void *func, CUfunction *out) {
    CUkernel kernel;
    CUDART_TRY(kernel_handle(func, &kernel));
    return kernel_function(kernel, out);
}

static cudaError_t check_config(dim3 grid, dim3 block) {
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 ||
        block.z == 0 || (unsigned long long)block.x * block.y * block.z > 1024)
        return cudaErrorInvalidConfiguration;
    return cudaSuccess;
}

static cudaError_t launch(CUfunction f, dim3 grid, dim3 block, void **args, size_t smem,
                          cudaStream_t stream, int cooperative) {
    CUDART_TRY(check_config(grid, block));
    if (smem > 0xffffffffu) return cudart_ret(cudaErrorInvalidValue);
    if (cooperative)
        return CUDART_DRIVER(cuLaunchCooperativeKernel, f, grid.x, grid.y, grid.z, block.x,
                             block.y, block.z, (unsigned int)smem, stream, args);
    return CUDART_DRIVER(cuLaunchKernel, f, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                         (unsigned int)smem, stream, args, NULL);
}

CUDART_API cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                        size_t sharedMem, cudaStream_t stream) {
    CUfunction f;
    CUDART_TRY(cudart_function(func, &f));
    return launch(f, gridDim, blockDim, args, sharedMem, stream, 0);
}
CUDART_PER_THREAD(cudaLaunchKernel, cudaLaunchKernel_ptsz);

CUDART_API cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim,
                                                   void **args, size_t sharedMem,
                                                   cudaStream_t stream) {
    CUfunction f;
    CUDART_TRY(cudart_function(func, &f));
    return launch(f, gridDim, blockDim, args, sharedMem, stream, 1);
}
CUDART_PER_THREAD(cudaLaunchCooperativeKernel, cudaLaunchCooperativeKernel_ptsz);

/* Launch attributes other than cooperative are accepted and have no simulated effect. */
CUDART_API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
                                           void **args) {
    if (config == NULL || (config->numAttrs > 0 && config->attrs == NULL))
        return cudart_ret(cudaErrorInvalidValue);
    int cooperative = 0;
    for (unsigned int i = 0; i < config->numAttrs; i++)
        if (config->attrs[i].id == cudaLaunchAttributeCooperative)
            cooperative = config->attrs[i].val.cooperative != 0;
    CUfunction f;
    CUDART_TRY(cudart_function(func, &f));
    return launch(f, config->gridDim, config->blockDim, args, config->dynamicSmemBytes,
                  config->stream, cooperative);
}
CUDART_PER_THREAD(cudaLaunchKernelExC, cudaLaunchKernelExC_ptsz);

/* CUDA 13's <<<>>> stubs: look the kernel up once, then launch it by handle. */
CUDART_API cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun) {
    if (kernel == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUkernel k;
    CUDART_TRY(kernel_handle(hostFun, &k));
    *kernel = (cudaKernel_t)k;
    return cudaSuccess;
}

CUDART_API cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                          void **args, size_t sharedMem, cudaStream_t stream) {
    CUfunction f;
    CUDART_TRY(kernel_function((CUkernel)kernel, &f));
    return launch(f, gridDim, blockDim, args, sharedMem, stream, 0);
}
CUDART_PER_THREAD(__cudaLaunchKernel, __cudaLaunchKernel_ptsz);

CUDART_API cudaError_t cudaGetKernel(cudaKernel_t *kernelPtr, const void *entryFuncAddr) {
    return __cudaGetKernel(kernelPtr, entryFuncAddr);
}

CUDART_API cudaError_t cudaGetFuncBySymbol(cudaFunction_t *functionPtr, const void *symbolPtr) {
    if (functionPtr == NULL) return cudart_ret(cudaErrorInvalidValue);
    return cudart_ret(cudart_function(symbolPtr, functionPtr));
}

CUDART_API cudaError_t cudaFuncGetName(const char **name, const void *func) {
    if (name == NULL || func == NULL) return cudart_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&reg_lock);
    struct kernel *k = find_kernel(func);
    *name = k != NULL ? k->name : NULL;
    pthread_mutex_unlock(&reg_lock);
    return k != NULL ? cudaSuccess : cudart_ret(cudaErrorInvalidDeviceFunction);
}

/* ---- Attributes and occupancy ---------------------------------------------------------------- */

static int func_attr(CUfunction f, CUfunction_attribute a) {
    int v = 0;
    if (cudart_drv.cuFuncGetAttribute == NULL ||
        cudart_drv.cuFuncGetAttribute(&v, a, f) != CUDA_SUCCESS)
        v = 0;
    return v;
}

CUDART_API cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func) {
    if (attr == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUfunction f;
    CUDART_TRY(cudart_function(func, &f));
    memset(attr, 0, sizeof(*attr));
    attr->sharedSizeBytes = (size_t)func_attr(f, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
    attr->constSizeBytes = (size_t)func_attr(f, CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES);
    attr->localSizeBytes = (size_t)func_attr(f, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
    attr->maxThreadsPerBlock = func_attr(f, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    attr->numRegs = func_attr(f, CU_FUNC_ATTRIBUTE_NUM_REGS);
    attr->ptxVersion = func_attr(f, CU_FUNC_ATTRIBUTE_PTX_VERSION);
    attr->binaryVersion = func_attr(f, CU_FUNC_ATTRIBUTE_BINARY_VERSION);
    attr->cacheModeCA = func_attr(f, CU_FUNC_ATTRIBUTE_CACHE_MODE_CA);
    attr->maxDynamicSharedSizeBytes = func_attr(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
    return cudaSuccess;
}

/* The cudaFuncAttribute values are the driver's CU_FUNC_ATTRIBUTE values. */
CUDART_API cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr,
                                            int value) {
    CUfunction f;
    CUDART_TRY(cudart_function(func, &f));
    return CUDART_DRIVER(cuFuncSetAttribute, f, (CUfunction_attribute)attr, value);
}

CUDART_API cudaError_t cudaFuncSetCacheConfig(const void *func, enum cudaFuncCache cacheConfig) {
    CUfunction f;
    CUDART_TRY(cudart_function(func, &f));
    return CUDART_DRIVER(cuFuncSetCacheConfig, f, (CUfunc_cache)cacheConfig);
}

CUDART_API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int *numBlocks, const void *func, int blockSize, size_t dynamicSMemSize, unsigned int flags) {
    if (flags > 1) return cudart_ret(cudaErrorInvalidValue); /* cudaOccupancyDisableCachingOverride */
    CUfunction f;
    CUDART_TRY(cudart_function(func, &f));
    return CUDART_DRIVER(cuOccupancyMaxActiveBlocksPerMultiprocessor, numBlocks, f, blockSize,
                         dynamicSMemSize);
}

CUDART_API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks,
                                                                     const void *func,
                                                                     int blockSize,
                                                                     size_t dynamicSMemSize) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize,
                                                                  dynamicSMemSize,
                                                                  cudaOccupancyDefault);
}
