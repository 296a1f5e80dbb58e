/*
 * cuda_internal.h - private declarations shared by the fake CUDA driver's source files.
 *
 * The fake libcuda.so.1 is split by API family (cuda_init.c, cuda_device.c, cuda_context.c,
 * cuda_memory.c, cuda_vmm.c, cuda_pool.c, cuda_array.c, cuda_stream.c, cuda_launch.c,
 * cuda_procaddr.c). This header holds the object layouts behind the opaque CUDA handles and the
 * helpers those files call into each other. Nothing here is exported: the library is built with
 * -fvisibility=hidden and only functions marked CU_API (the entries of cuda_entry_points.def)
 * are visible to the dynamic linker.
 */
#ifndef VGPU_FAKEGPU_CUDA_INTERNAL_H
#define VGPU_FAKEGPU_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "cuda_abi.h"
#include "simstate.h"

/* Marks an exported driver entry point. */
#define CU_API SIM_EXPORT

/* Exports `other_name` as a second name of the function `target` (same translation unit only); used
 * for the _ptds/_ptsz per-thread-default-stream names listed in cuda_entry_points.def. */
#define CU_ALIAS(target, other_name)                                                              \
    extern __typeof__(target) other_name __attribute__((alias(#target), visibility("default")))

/* Return early with the result of `expr` unless it is CUDA_SUCCESS. */
#define CU_TRY(expr)                                                                              \
    do {                                                                                          \
        CUresult cu_try_rc_ = (expr);                                                             \
        if (cu_try_rc_ != CUDA_SUCCESS) return cu_try_rc_;                                        \
    } while (0)

/* ---- Driver-wide state (cuda_init.c) ------------------------------------------------------- */

/* Tunables read from the environment once, at cuInit. */
struct cu_config {
    unsigned long long kernel_wave_ns;  /* VGPU_SIM_KERNEL_NS: SM time of one wave of blocks */
    unsigned long long launch_ns;       /* VGPU_SIM_LAUNCH_NS: fixed GPU cost of every launch */
    unsigned long long max_queue_ns;    /* VGPU_SIM_MAX_QUEUE_NS: how far ahead of now a stream
                                           may queue work before a launch blocks */
    unsigned long long backing_max;     /* VGPU_SIM_BACKING_MAX: largest allocation whose
                                           contents are kept for memcpy round trips */
    unsigned long long host_memory;     /* VGPU_SIM_HOST_MEMORY: host memory the process's managed
                                           allocations may spill into beyond free device
                                           memory (default: the machine's physical RAM) */
    int trace;                          /* VGPU_SIM_CUDA_TRACE=1: log unresolved entry points */
    int module_loading;                 /* CUDA_MODULE_LOADING: a CUmoduleLoadingMode, or 0 for
                                           unset/DEFAULT (the driver version's default) */
};

/* The devices this process sees, in CUDA ordinal order, after NVIDIA_VISIBLE_DEVICES (state)
 * and CUDA_VISIBLE_DEVICES (applied here). */
struct cu_driver {
    int initialized;                 /* cuInit succeeded */
    CUresult init_result;            /* result every cuInit call returns */
    int count;
    int phys[SIM_MAX_GPUS];          /* ordinal -> physical GPU index in the state */
    struct cu_config cfg;
    unsigned long long managed_host_bytes; /* host-resident part of live managed allocations */
    pthread_mutex_t lock;            /* guards every table below and in the other files */
};

extern struct cu_driver cu_drv;

/* CUDA_ERROR_NOT_INITIALIZED until cuInit has succeeded. */
CUresult cu_check_init(void);

/* Validates a device ordinal; on success stores its physical index. Lost GPUs give
 * CUDA_ERROR_DEVICE_UNAVAILABLE. */
CUresult cu_device_phys(CUdevice dev, int *phys_out);

/* CUDA_ERROR_DEVICE_UNAVAILABLE if the physical GPU is flagged lost, else CUDA_SUCCESS. */
CUresult cu_phys_alive(int phys);

/* Parse a CUDA_VISIBLE_DEVICES value against the GPUs visible after NVIDIA_VISIBLE_DEVICES.
 * Writes the selected physical indices to out and returns how many (the first invalid, unknown,
 * ambiguous or repeated entry ends the list, as the real driver does). Pure over the state's
 * static GPU info (tests/test_cuda_device.c covers it through cuInit). */
int cu_parse_visible_devices(const char *spec, const int *visible, int nvisible, int *out,
                             int max);

/* Sleep until CLOCK_MONOTONIC reaches t_ns (the busy-timeline clock). */
void cu_sleep_until(unsigned long long t_ns);

/* ---- Handle registry (cuda_handles.c) -------------------------------------------------------
 * Every handle given to the application is registered with its kind, so a stale or foreign
 * pointer is rejected with CUDA_ERROR_INVALID_HANDLE/CONTEXT instead of being dereferenced. */
enum cu_kind {
    CU_KIND_CONTEXT = 1,
    CU_KIND_STREAM,
    CU_KIND_EVENT,
    CU_KIND_MODULE,
    CU_KIND_FUNCTION,
    CU_KIND_LIBRARY,
    CU_KIND_POOL,
    CU_KIND_ARRAY,
    CU_KIND_MIPMAPPED_ARRAY,
    CU_KIND_GRAPH,
    CU_KIND_GRAPH_EXEC,
    CU_KIND_MEM_HANDLE,
};

/* All three must be called with cu_drv.lock held. handle_add returns 0, or -1 if out of memory. */
int cu_handle_add(const void *p, enum cu_kind kind);
void cu_handle_remove(const void *p);
int cu_handle_is(const void *p, enum cu_kind kind);

/* ---- Contexts (cuda_context.c) ------------------------------------------------------------- */

struct CUstream_st {
    struct CUctx_st *ctx;
    unsigned int flags;
    int priority;
    unsigned long long id;
    unsigned long long done_ns;      /* completion time of the last work queued on it */
    struct CUstream_st *next;        /* the context's list of created streams */
};

struct CUctx_st {
    int ordinal;                     /* CUDA device ordinal */
    int phys;                        /* physical GPU */
    unsigned int flags;
    int primary;                     /* 1 for a device's primary context */
    int refcount;                    /* primary: retain count; created: 1 */
    unsigned long long id;
    unsigned long long done_ns;      /* latest completion time of any work in the context */
    struct CUstream_st null_stream;  /* the context's default (NULL) stream */
    struct CUstream_st *streams;     /* streams created in this context */
    size_t limits[CU_LIMIT_PERSISTING_L2_CACHE_SIZE + 1]; /* cuCtxGetLimit/SetLimit values */
    unsigned int peers;              /* ordinals whose contexts it has peer access to (bits) */
};

/* The calling thread's current context, or NULL. */
struct CUctx_st *cu_ctx_current(void);

/* The current context, validated (CUDA_ERROR_INVALID_CONTEXT if none; DEVICE_UNAVAILABLE if its
 * GPU is lost). */
CUresult cu_ctx_require(struct CUctx_st **out);

/* Resolve a stream handle (NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD mean the current
 * context's default stream). Lock must NOT be held. */
CUresult cu_stream_resolve(CUstream h, struct CUstream_st **out);

/* Queue `duration_ns` of SM time on a stream's GPU and record its completion. Blocks while the
 * stream is more than cfg.max_queue_ns ahead of now, as a full launch queue does. */
CUresult cu_stream_submit(struct CUstream_st *s, unsigned long long duration_ns);

/* Record that a stream's work now also ends no earlier than t_ns (copies, event waits). */
void cu_stream_extend(struct CUstream_st *s, unsigned long long t_ns);

/* Completion time of all work queued so far on the stream. */
unsigned long long cu_stream_done(const struct CUstream_st *s);

/* ---- Memory (cuda_memory.c) ---------------------------------------------------------------- */

enum cu_mem_kind {
    CU_MEM_DEVICE = 1,   /* cuMemAlloc / cuMemAllocPitch */
    CU_MEM_MANAGED,      /* cuMemAllocManaged (charged: its device-resident part only) */
    CU_MEM_POOL,         /* stream-ordered / pool allocations */
    CU_MEM_HOST,         /* cuMemAllocHost / cuMemHostAlloc: real host memory, not counted */
    CU_MEM_HOST_REGISTERED, /* cuMemHostRegister: the application's memory, never freed here */
    CU_MEM_VA_RANGE,     /* cuMemAddressReserve: address space only */
};

/* One range of the unified address space the application can name. */
struct cu_alloc {
    CUdeviceptr base;
    size_t size;
    enum cu_mem_kind kind;
    int phys;                        /* GPU charged (-1 for host memory and VA ranges) */
    unsigned long long charged;      /* bytes reserved in the state for this range */
    struct CUctx_st *ctx;
    struct CUmemPoolHandle_st *pool; /* CU_MEM_POOL only */
    int owner_pid;                   /* the process that reserved `charged` (fork safety) */
    unsigned char *backing;          /* lazily allocated contents (device kinds); host: base */
};

/* Reserve `bytes` on `phys` for this process: CUDA_ERROR_OUT_OF_MEMORY when it does not fit,
 * CUDA_ERROR_DEVICE_UNAVAILABLE when the GPU is lost. */
CUresult cu_charge(int phys, unsigned long long bytes);
void cu_uncharge(int phys, unsigned long long bytes, int owner_pid);

/* Create a device-kind allocation of `size` bytes charged to the context's GPU and record it.
 * Lock must NOT be held. */
CUresult cu_alloc_device(struct CUctx_st *ctx, size_t size, enum cu_mem_kind kind,
                         struct CUmemPoolHandle_st *pool, CUdeviceptr *out);

/* Free the allocation starting exactly at `base` (uncharging it). `expect` restricts the kinds
 * accepted (0 = any device kind). Lock must NOT be held. */
CUresult cu_free_device(CUdeviceptr base, enum cu_mem_kind expect);

/* The host bytes behind [p, p+n) of a reserved VMM range, allocated on first use (lock held):
 * NULL when that part is not mapped, spans two mappings or its memory keeps no contents. */
unsigned char *cu_vmm_contents_locked(CUdeviceptr p, size_t n);

/* Pick a free, aligned range of the fake device address space (lock held). 0 if exhausted. */
CUdeviceptr cu_va_pick(size_t size, size_t align);

/* Insert/find/remove address-space records (lock held). */
int cu_alloc_insert(const struct cu_alloc *a);
struct cu_alloc *cu_alloc_find(CUdeviceptr p);        /* the range containing p, or NULL */
void cu_alloc_remove(CUdeviceptr base);

/* Release every allocation of a context (cuCtxDestroy, primary reset). Lock must NOT be held. */
void cu_mem_release_ctx(struct CUctx_st *ctx);

/* Release every allocation made from a pool (cuMemPoolDestroy). Lock must NOT be held. */
void cu_mem_release_pool(const struct CUmemPoolHandle_st *pool);

/* Bytes currently charged by pools in a context to this process (for pool attributes). */
unsigned long long cu_alloc_charged_by_pool(const struct CUmemPoolHandle_st *pool);

/* ---- VMM, pools, arrays: ctx teardown hooks ------------------------------------------------ */
void cu_vmm_release_ctx(struct CUctx_st *ctx);
void cu_pool_release_ctx(struct CUctx_st *ctx);
void cu_array_release_ctx(struct CUctx_st *ctx);
void cu_launch_release_ctx(struct CUctx_st *ctx);

/* ---- Launch model (cuda_launch.c) ---------------------------------------------------------- */

/* SM time of a launch of `blocks` blocks on a GPU with `sm_count` SMs, when one wave of blocks
 * takes wave_ns: launch_ns + ceil(blocks / sm_count) * wave_ns. Pure. */
unsigned long long cu_kernel_duration(unsigned long long blocks, unsigned int sm_count,
                                      unsigned long long wave_ns, unsigned long long launch_ns);

/* Per-wave time encoded in a kernel name: a "__ns<digits>" suffix, e.g. "busy__ns250000";
 * 0 if the name carries none. Pure. */
unsigned long long cu_kernel_name_wave_ns(const char *name);

#endif /* VGPU_FAKEGPU_CUDA_INTERNAL_H */
