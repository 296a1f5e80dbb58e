/*
 * cudart_internal.h - private declarations shared by the simulated CUDA runtime's source files.
 *
 * The simulated libcudart.so.12 / libcudart.so.13 (one source tree, VGPU_CUDART_MAJOR picks the
 * ABI) is split by API family: cudart_init.c (lazy initialisation, the driver entry points,
 * current device and primary contexts, errors, versions), cudart_device.c, cudart_memory.c,
 * cudart_stream.c (streams, events, capture queries, host callbacks), cudart_launch.c (the nvcc
 * registration ABI, launches, function attributes, occupancy) and cudart_unsimulated.c (the
 * generated cudaErrorNotSupported stubs). It never touches the simulator's state itself: every
 * effect goes through the CUDA driver (the fake libcuda.so.1, or whatever interposes on it),
 * reached through the entry points resolved once with cuGetProcAddress (cudart_driver.def).
 * Nothing here is exported: the library is built with -fvisibility=hidden and a version script
 * generated from cudart_exports.def.
 */
#ifndef VGPU_FAKEGPU_CUDART_INTERNAL_H
#define VGPU_FAKEGPU_CUDART_INTERNAL_H

#include "cuda_abi.h"
#include "cudart_abi.h"

/* Marks an exported runtime function. */
#define CUDART_API __attribute__((visibility("default")))

/* Exports `ptname`, the per-thread-default-stream (_ptsz/_ptds) name of `target`, as a second
 * name of the same function (same translation unit only). The simulated driver runs the
 * per-thread default stream as the context's default stream, so the two behave the same. The
 * names must be the CUDART_ALIAS rows of cudart_exports.def: the link fails on a missing one. */
#define CUDART_PER_THREAD(target, ptname)                                                         \
    extern __typeof__(target) ptname __attribute__((alias(#target), visibility("default")))

/* The CUDART_VERSION this build reports (cudaRuntimeGetVersion), from the generated list. */
#define CUDART_RUNTIME_VERSION(major, version)                                                    \
    VGPU_CUDART_PICK(VGPU_CUDART_IS_##major, enum { cudart_runtime_version = version };)
#if VGPU_CUDART_MAJOR == 12
#define VGPU_CUDART_IS_12 1
#define VGPU_CUDART_IS_13 0
#else
#define VGPU_CUDART_IS_12 0
#define VGPU_CUDART_IS_13 1
#endif
#define CUDART_SIM(sym, in12, in13)
#define CUDART_ALIAS(sym, target, in12, in13)
#define CUDART_STUB(sym, in12, in13)
#include "cudart_exports.def"
#undef CUDART_SIM
#undef CUDART_ALIAS
#undef CUDART_STUB
#undef CUDART_RUNTIME_VERSION

/* ---- The driver (cudart_init.c) ------------------------------------------------------------ */

/* The driver entry points, one pointer per row of cudart_driver.def, typed as the symbol. */
struct cudart_driver {
#define CUDART_DRV(sym, base, version) __typeof__(&sym) sym;
#include "cudart_driver.def"
#undef CUDART_DRV
    __typeof__(&cuGetProcAddress_v2) cuGetProcAddress_v2; /* dlsym'd from libcuda.so.1 */
};

extern struct cudart_driver cudart_drv;

/* Lazy initialisation (once per process): load libcuda.so.1, resolve cudart_driver.def through
 * its cuGetProcAddress_v2, cuInit, check the driver's version. cudaSuccess or the error every
 * call that needs the driver then returns (cudaErrorInsufficientDriver without a usable driver,
 * cudaErrorNoDevice without a GPU). */
cudaError_t cudart_init(void);

/* The current context for a call that works on "the current device": the thread's current
 * driver context if it has one, else the primary context of the thread's device (default 0),
 * retained on first use and made current. Also returns the device ordinal when `dev` != NULL. */
cudaError_t cudart_ctx(CUcontext *ctx, int *dev);

/* The primary context of `dev`, retained once per process (cudaDeviceReset forgets it). */
cudaError_t cudart_primary(int dev, CUcontext *ctx);

/* The calling thread's device for the runtime (cudaSetDevice; 0 until set). */
int cudart_thread_device(void);
void cudart_set_thread_device(int dev);

/* Forget the retained primary context of `dev` (after cuDevicePrimaryCtxReset). */
void cudart_forget_primary(int dev);

/* A driver result as a runtime error (identical codes where the runtime has them). */
cudaError_t cudart_error(CUresult rc);

/* Record a call's result as the thread's last error (cudaGetLastError) and return it. Every
 * exported function returns through this. */
cudaError_t cudart_ret(cudaError_t err);

/* Call a driver entry point and return its result as a runtime error through cudart_ret. A
 * NULL entry point (the driver did not resolve it) is cudaErrorNotSupported. */
#define CUDART_DRIVER(fn, ...)                                                                    \
    (cudart_drv.fn == NULL ? cudart_ret(cudaErrorNotSupported)                                   \
                           : cudart_ret(cudart_error(cudart_drv.fn(__VA_ARGS__))))

/* Return early (through cudart_ret) unless `expr` is cudaSuccess. */
#define CUDART_TRY(expr)                                                                          \
    do {                                                                                          \
        cudaError_t cudart_try_rc_ = (expr);                                                      \
        if (cudart_try_rc_ != cudaSuccess) return cudart_ret(cudart_try_rc_);                     \
    } while (0)

/* Return early unless the driver call succeeded. */
#define CUDART_TRY_DRIVER(fn, ...)                                                                \
    do {                                                                                          \
        if (cudart_drv.fn == NULL) return cudart_ret(cudaErrorNotSupported);                      \
        CUDART_TRY(cudart_error(cudart_drv.fn(__VA_ARGS__)));                                     \
    } while (0)

/* The number of devices (after cudart_init succeeded). */
int cudart_device_count(void);

/* ---- Kernels (cudart_launch.c) -------------------------------------------------------------- */

/* The driver function a registered host function (`func`, the address nvcc's stub passes)
 * runs as in the current context: its fat binary is loaded as a driver library and the kernel
 * looked up on first use. cudaErrorInvalidDeviceFunction for an unregistered address. */
cudaError_t cudart_function(const void *func, CUfunction *out);

#endif /* VGPU_FAKEGPU_CUDART_INTERNAL_H */
