/*
 * cuda_launch.c - modules, libraries, kernels, launches and graphs: the simulated compute.
 *
 * Code images are never executed: cuModuleLoad* and cuLibraryLoadData accept any image and
 * cuModuleGetFunction / cuLibraryGetKernel accept any name. What a launch does is occupy the SMs
 * of the stream's GPU in the node state for
 *     duration = launch_ns + ceil(blocks / sm_count) * wave_ns
 * where blocks = gridDimX * gridDimY * gridDimZ. wave_ns (the time one wave of blocks takes) is
 * chosen per kernel by a "__ns<N>" part in its name (e.g. "spin__ns250000" -> 250 us per wave),
 * else by VGPU_SIM_KERNEL_NS (default 20000); launch_ns comes from VGPU_SIM_LAUNCH_NS (default
 * 2000). The launch returns at once; the stream records the completion time the state assigns
 * (GPUs are time-sliced FIFO across processes), and synchronisation sleeps until it.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

struct CUfunc_st {
    unsigned long long wave_ns; /* 0 = the configured default */
    int max_dynamic_smem;
    struct CUfunc_st *next;     /* the owning module's list */
    char name[];                /* any length: C++ template kernels' mangled names run to KiBs */
};

/* A module or a library: a named bag of functions (a library's "kernels" are functions too;
 * a CUkernel handle is the address of its struct CUfunc_st). */
struct CUmod_st {
    struct CUctx_st *ctx;        /* NULL for libraries (context-independent) */
    struct CUfunc_st *funcs;
    struct CUmod_st *next;       /* list of all modules and libraries */
};

struct CUlib_st {
    struct CUmod_st mod;
};

struct kernel_node {
    struct CUfunc_st *fn;
    unsigned int grid[3];
    unsigned int block[3];
};

struct CUgraphNode_st {
    struct kernel_node k;
};

struct CUgraph_st {
    struct CUgraphNode_st **nodes;
    size_t count, cap;
};

struct CUgraphExec_st {
    struct kernel_node *nodes;
    size_t count;
};

static struct CUmod_st *modules; /* guarded by cu_drv.lock */

unsigned long long cu_kernel_duration(unsigned long long blocks, unsigned int sm_count,
                                      unsigned long long wave_ns, unsigned long long launch_ns) {
    unsigned long long sms = sm_count ? sm_count : 1;
    return launch_ns + (blocks + sms - 1) / sms * wave_ns;
}

unsigned long long cu_kernel_name_wave_ns(const char *name) {
    const char *hit = NULL;
    for (const char *p = strstr(name, "__ns"); p != NULL; p = strstr(p + 1, "__ns"))
        if (p[4] >= '0' && p[4] <= '9') hit = p + 4;
    if (hit == NULL) return 0;
    unsigned long long v = 0;
    while (*hit >= '0' && *hit <= '9' && v < (1ULL << 50)) v = v * 10 + (unsigned)(*hit++ - '0');
    return v;
}

/* ---- Modules and libraries ------------------------------------------------------------------- */

static CUresult module_new(struct CUmod_st *m, struct CUctx_st *ctx, enum cu_kind kind) {
    m->ctx = ctx;
    pthread_mutex_lock(&cu_drv.lock);
    int rc = cu_handle_add(m, kind);
    if (rc == 0) {
        m->next = modules;
        modules = m;
    }
    pthread_mutex_unlock(&cu_drv.lock);
    return rc == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Unregister and free a module and its functions (lock held). */
static void module_free_locked(struct CUmod_st *m) {
    cu_handle_remove(m);
    struct CUmod_st **pp = &modules;
    while (*pp != NULL && *pp != m) pp = &(*pp)->next;
    if (*pp != NULL) *pp = m->next;
    for (struct CUfunc_st *f = m->funcs, *next; f != NULL; f = next) {
        next = f->next;
        cu_handle_remove(f);
        free(f);
    }
}

static CUresult load_module(CUmodule *module, const void *image) {
    if (module == NULL || image == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    struct CUmod_st *m = calloc(1, sizeof(*m));
    if (m == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = module_new(m, ctx, CU_KIND_MODULE);
    if (rc != CUDA_SUCCESS) {
        free(m);
        return rc;
    }
    *module = m;
    return CUDA_SUCCESS;
}

CU_API CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    if (module == NULL || fname == NULL) return CUDA_ERROR_INVALID_VALUE;
    FILE *f = fopen(fname, "rb");
    if (f == NULL) return CUDA_ERROR_FILE_NOT_FOUND;
    fclose(f);
    return load_module(module, fname);
}

CU_API CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    return load_module(module, image);
}

CU_API CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                   CUjit_option *options, void **optionValues) {
    if (numOptions > 0 && (options == NULL || optionValues == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    return load_module(module, image);
}

CU_API CUresult cuModuleUnload(CUmodule hmod) {
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    int live = cu_handle_is(hmod, CU_KIND_MODULE);
    if (live) module_free_locked(hmod);
    pthread_mutex_unlock(&cu_drv.lock);
    if (!live) return CUDA_ERROR_INVALID_HANDLE;
    free(hmod);
    return CUDA_SUCCESS;
}

/* The function `name` of a module, created on first request (the same handle afterwards). */
static CUresult get_function(struct CUmod_st *m, enum cu_kind kind, const char *name,
                             struct CUfunc_st **out) {
    if (name == NULL || out == NULL) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    size_t len = strlen(name);
    struct CUfunc_st *fresh = calloc(1, sizeof(*fresh) + len + 1);
    if (fresh == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(fresh->name, name, len + 1);
    fresh->wave_ns = cu_kernel_name_wave_ns(name);
    pthread_mutex_lock(&cu_drv.lock);
    CUresult rc = CUDA_SUCCESS;
    struct CUfunc_st *f = NULL;
    if (!cu_handle_is(m, kind)) {
        rc = CUDA_ERROR_INVALID_HANDLE;
    } else {
        for (f = m->funcs; f != NULL && strcmp(f->name, name) != 0; f = f->next) {
        }
        if (f == NULL) {
            if (cu_handle_add(fresh, CU_KIND_FUNCTION) != 0) {
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                fresh->next = m->funcs;
                m->funcs = fresh;
                f = fresh;
                fresh = NULL;
            }
        }
    }
    pthread_mutex_unlock(&cu_drv.lock);
    free(fresh);
    if (rc == CUDA_SUCCESS) *out = f;
    return rc;
}

CU_API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    return get_function(hmod, CU_KIND_MODULE, name, hfunc);
}

/* Lazy loading is the default from CUDA 12.2 on (opt-in with CUDA_MODULE_LOADING=LAZY since 11.7);
 * CUDA_MODULE_LOADING, read at cuInit, overrides it. The simulator loads nothing either way:
 * only the answer differs. */
#define LAZY_LOADING_DEFAULT_SINCE 12020

CU_API CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode *mode) {
    if (mode == NULL) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    if (cu_drv.cfg.module_loading != 0) {
        *mode = (CUmoduleLoadingMode)cu_drv.cfg.module_loading;
        return CUDA_SUCCESS;
    }
    const struct sim_node_info *node = sim_node();
    int version = node != NULL ? node->cuda_driver_version : 0;
    *mode = version >= LAZY_LOADING_DEFAULT_SINCE ? CU_MODULE_LAZY_LOADING
                                                  : CU_MODULE_EAGER_LOADING;
    return CUDA_SUCCESS;
}

CU_API CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                  void **jitOptionsValues, unsigned int numJitOptions,
                                  CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                  unsigned int numLibraryOptions) {
    if (library == NULL || code == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (numJitOptions > 0 && (jitOptions == NULL || jitOptionsValues == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    if (numLibraryOptions > 0 && (libraryOptions == NULL || libraryOptionValues == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    struct CUlib_st *lib = calloc(1, sizeof(*lib));
    if (lib == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = module_new(&lib->mod, NULL, CU_KIND_LIBRARY);
    if (rc != CUDA_SUCCESS) {
        free(lib);
        return rc;
    }
    *library = lib;
    return CUDA_SUCCESS;
}

CU_API CUresult cuLibraryUnload(CUlibrary library) {
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    int live = cu_handle_is(library, CU_KIND_LIBRARY);
    if (live) module_free_locked(&library->mod);
    pthread_mutex_unlock(&cu_drv.lock);
    if (!live) return CUDA_ERROR_INVALID_HANDLE;
    free(library);
    return CUDA_SUCCESS;
}

CU_API CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
    struct CUfunc_st *f;
    CU_TRY(get_function(library ? &library->mod : NULL, CU_KIND_LIBRARY, name, &f));
    *pKernel = (CUkernel)(void *)f;
    return CUDA_SUCCESS;
}

static CUresult function_get(CUfunction h, struct CUfunc_st **out) {
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    int live = cu_handle_is(h, CU_KIND_FUNCTION);
    pthread_mutex_unlock(&cu_drv.lock);
    if (!live) return CUDA_ERROR_INVALID_HANDLE;
    *out = h;
    return CUDA_SUCCESS;
}

CU_API CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
    if (pFunc == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *f;
    CU_TRY(function_get((CUfunction)(void *)kernel, &f));
    *pFunc = f;
    return CUDA_SUCCESS;
}

CU_API CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc) {
    if (pi == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *f;
    CU_TRY(function_get(hfunc, &f));
    switch ((int)attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = 90; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = f->max_dynamic_smem; break;
    default: *pi = 0; break; /* no static shared/const/local memory in a simulated kernel */
    }
    return CUDA_SUCCESS;
}

CU_API CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
    struct CUfunc_st *f;
    CU_TRY(function_get(hfunc, &f));
    if (attrib != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES || value < 0)
        return CUDA_ERROR_INVALID_VALUE;
    f->max_dynamic_smem = value;
    return CUDA_SUCCESS;
}

/* Cache preferences are accepted and ignored: simulated kernels have no cache. */
CU_API CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
    struct CUfunc_st *f;
    CU_TRY(function_get(hfunc, &f));
    return (unsigned int)config <= CU_FUNC_CACHE_PREFER_EQUAL ? CUDA_SUCCESS
                                                              : CUDA_ERROR_INVALID_VALUE;
}

CU_API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func,
                                                            int blockSize,
                                                            size_t dynamicSMemSize) {
    (void)dynamicSMemSize;
    if (numBlocks == NULL || blockSize <= 0 || blockSize > 1024) return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *f;
    CU_TRY(function_get(func, &f));
    int blocks = 2048 / blockSize;
    *numBlocks = blocks > 32 ? 32 : blocks;
    return CUDA_SUCCESS;
}

/* Blocks per cooperative launch allowed on a device: every block must be resident at once. */
static unsigned long long cooperative_limit(const struct sim_gpu_info *g) {
    return (unsigned long long)g->sm_count * 32;
}

/* ---- Launches -------------------------------------------------------------------------------- */

static CUresult launch(struct CUfunc_st *f, const unsigned int grid[3], const unsigned int block[3],
                       struct CUstream_st *s, int cooperative) {
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0 || block[0] == 0 || block[1] == 0 ||
        block[2] == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned long long)block[0] * block[1] * block[2] > 1024 || block[2] > 64)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sim_gpu_info *g = sim_gpu(s->ctx->phys);
    if (g == NULL) return CUDA_ERROR_INVALID_DEVICE;
    unsigned long long blocks = (unsigned long long)grid[0] * grid[1] * grid[2];
    if (cooperative && blocks > cooperative_limit(g)) return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    unsigned long long wave = f->wave_ns ? f->wave_ns : cu_drv.cfg.kernel_wave_ns;
    return cu_stream_submit(s, cu_kernel_duration(blocks, g->sm_count, wave,
                                                  cu_drv.cfg.launch_ns));
}

static CUresult launch_handles(CUfunction fn, const unsigned int grid[3],
                               const unsigned int block[3], CUstream hStream, int cooperative) {
    struct CUfunc_st *f;
    struct CUstream_st *s;
    CU_TRY(function_get(fn, &f));
    CU_TRY(cu_stream_resolve(hStream, &s));
    return launch(f, grid, block, s, cooperative);
}

CU_API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                               unsigned int gridDimZ, unsigned int blockDimX,
                               unsigned int blockDimY, unsigned int blockDimZ,
                               unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                               void **extra) {
    (void)sharedMemBytes;
    (void)kernelParams;
    /* kernelParams and extra are mutually exclusive, as in the real driver. */
    if (kernelParams != NULL && extra != NULL) return CUDA_ERROR_INVALID_VALUE;
    const unsigned int grid[3] = {gridDimX, gridDimY, gridDimZ};
    const unsigned int block[3] = {blockDimX, blockDimY, blockDimZ};
    return launch_handles(f, grid, block, hStream, 0);
}
CU_ALIAS(cuLaunchKernel, cuLaunchKernel_ptsz);

CU_API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                          unsigned int gridDimY, unsigned int gridDimZ,
                                          unsigned int blockDimX, unsigned int blockDimY,
                                          unsigned int blockDimZ, unsigned int sharedMemBytes,
                                          CUstream hStream, void **kernelParams) {
    (void)sharedMemBytes;
    (void)kernelParams;
    const unsigned int grid[3] = {gridDimX, gridDimY, gridDimZ};
    const unsigned int block[3] = {blockDimX, blockDimY, blockDimZ};
    return launch_handles(f, grid, block, hStream, 1);
}
CU_ALIAS(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz);

CU_API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                 void **extra) {
    if (config == NULL || (config->numAttrs > 0 && config->attrs == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    if (kernelParams != NULL && extra != NULL) return CUDA_ERROR_INVALID_VALUE;
    int cooperative = 0;
    for (unsigned int i = 0; i < config->numAttrs; i++)
        if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
            cooperative = config->attrs[i].value.cooperative != 0;
    const unsigned int grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
    const unsigned int block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
    return launch_handles(f, grid, block, config->hStream, cooperative);
}
CU_ALIAS(cuLaunchKernelEx, cuLaunchKernelEx_ptsz);

/* The host function runs once the stream's prior work is complete. Simplification: it runs on
 * the calling thread, which waits for that point (the real driver returns at once and runs it on
 * a driver thread); work queued afterwards is ordered after it either way. */
CU_API CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData) {
    if (fn == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s;
    CU_TRY(cu_stream_resolve(hStream, &s));
    cu_sleep_until(cu_stream_done(s));
    fn(userData);
    return CUDA_SUCCESS;
}
CU_ALIAS(cuLaunchHostFunc, cuLaunchHostFunc_ptsz);

/* ---- Graphs: a graph is an ordered list of kernel nodes -------------------------------------- */

static CUresult graph_get(CUgraph h, enum cu_kind kind) {
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    int live = cu_handle_is(h, kind);
    pthread_mutex_unlock(&cu_drv.lock);
    return live ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CU_API CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    if (phGraph == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    struct CUgraph_st *g = calloc(1, sizeof(*g));
    if (g == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&cu_drv.lock);
    int rc = cu_handle_add(g, CU_KIND_GRAPH);
    pthread_mutex_unlock(&cu_drv.lock);
    if (rc != 0) {
        free(g);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *phGraph = g;
    return CUDA_SUCCESS;
}

CU_API CUresult cuGraphDestroy(CUgraph hGraph) {
    CU_TRY(graph_get(hGraph, CU_KIND_GRAPH));
    pthread_mutex_lock(&cu_drv.lock);
    cu_handle_remove(hGraph);
    pthread_mutex_unlock(&cu_drv.lock);
    for (size_t i = 0; i < hGraph->count; i++) free(hGraph->nodes[i]);
    free(hGraph->nodes);
    free(hGraph);
    return CUDA_SUCCESS;
}

CU_API CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                        const CUgraphNode *dependencies, size_t numDependencies,
                                        const CUDA_KERNEL_NODE_PARAMS *nodeParams) {
    if (phGraphNode == NULL || nodeParams == NULL || (numDependencies > 0 && dependencies == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(graph_get(hGraph, CU_KIND_GRAPH));
    /* A node names a function, or (CUDA 12) a library kernel when func is NULL. */
    CUfunction fn = nodeParams->func ? nodeParams->func : (CUfunction)(void *)nodeParams->kern;
    struct CUfunc_st *f;
    CU_TRY(function_get(fn, &f));
    struct CUgraphNode_st *node = malloc(sizeof(*node));
    if (node == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    node->k = (struct kernel_node){
        .fn = f,
        .grid = {nodeParams->gridDimX, nodeParams->gridDimY, nodeParams->gridDimZ},
        .block = {nodeParams->blockDimX, nodeParams->blockDimY, nodeParams->blockDimZ},
    };
    /* Dependencies are implied by insertion order: nodes run one after another. */
    if (hGraph->count == hGraph->cap) {
        size_t ncap = hGraph->cap ? hGraph->cap * 2 : 8;
        struct CUgraphNode_st **nn = realloc(hGraph->nodes, ncap * sizeof(*nn));
        if (nn == NULL) {
            free(node);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        hGraph->nodes = nn;
        hGraph->cap = ncap;
    }
    hGraph->nodes[hGraph->count++] = node;
    *phGraphNode = node;
    return CUDA_SUCCESS;
}

CU_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                            unsigned long long flags) {
    (void)flags;
    if (phGraphExec == NULL) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(graph_get(hGraph, CU_KIND_GRAPH));
    struct CUgraphExec_st *x = calloc(1, sizeof(*x));
    if (x == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    x->count = hGraph->count;
    x->nodes = calloc(x->count ? x->count : 1, sizeof(*x->nodes));
    if (x->nodes == NULL) {
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < x->count; i++) x->nodes[i] = hGraph->nodes[i]->k;
    pthread_mutex_lock(&cu_drv.lock);
    int rc = cu_handle_add(x, CU_KIND_GRAPH_EXEC);
    pthread_mutex_unlock(&cu_drv.lock);
    if (rc != 0) {
        free(x->nodes);
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *phGraphExec = x;
    return CUDA_SUCCESS;
}

/* The CUDA 10/11 ABI, with an error node and a log buffer that instantiation never needs. */
CU_API CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                                   CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize) {
    if (phErrorNode != NULL) *phErrorNode = NULL;
    if (logBuffer != NULL && bufferSize > 0) logBuffer[0] = '\0';
    return cuGraphInstantiateWithFlags(phGraphExec, hGraph, 0);
}

CU_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    CU_TRY(graph_get((CUgraph)(void *)hGraphExec, CU_KIND_GRAPH_EXEC));
    struct CUstream_st *s;
    CU_TRY(cu_stream_resolve(hStream, &s));
    for (size_t i = 0; i < hGraphExec->count; i++) {
        const struct kernel_node *k = &hGraphExec->nodes[i];
        struct CUfunc_st *f;
        CU_TRY(function_get(k->fn, &f)); /* its module may have been unloaded since */
        CU_TRY(launch(f, k->grid, k->block, s, 0));
    }
    return CUDA_SUCCESS;
}
CU_ALIAS(cuGraphLaunch, cuGraphLaunch_ptsz);

CU_API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    CU_TRY(graph_get((CUgraph)(void *)hGraphExec, CU_KIND_GRAPH_EXEC));
    pthread_mutex_lock(&cu_drv.lock);
    cu_handle_remove(hGraphExec);
    pthread_mutex_unlock(&cu_drv.lock);
    free(hGraphExec->nodes);
    free(hGraphExec);
    return CUDA_SUCCESS;
}

void cu_launch_release_ctx(struct CUctx_st *ctx) {
    for (;;) {
        pthread_mutex_lock(&cu_drv.lock);
        struct CUmod_st *m = modules;
        while (m != NULL && (m->ctx != ctx || ctx == NULL)) m = m->next;
        if (m != NULL) module_free_locked(m);
        pthread_mutex_unlock(&cu_drv.lock);
        if (m == NULL) return;
        free(m);
    }
}
