/*
 * abi_shim/crt/host_defines.h - what the official CUDA runtime headers need from nvcc's
 * crt/host_defines.h, for a plain host C compiler.
 *
 * The runtime wheels (PyPI nvidia-cuda-runtime-cu12 / nvidia-cuda-runtime) ship
 * cuda_runtime_api.h and driver_types.h but not crt/host_defines.h, which comes with nvcc. Only
 * the ABI tooling reads the official headers (gen_cudart.py lists their functions, `make
 * abi-check` compiles our declarations against them); the library build never does. Every macro
 * here is the meaning a host compiler gives it: execution-space and API markers are empty,
 * default arguments exist only in C++, alignment is GCC's aligned attribute (the only one that
 * changes a layout).
 */
#ifndef VGPU_ABI_SHIM_HOST_DEFINES_H
#define VGPU_ABI_SHIM_HOST_DEFINES_H

#define __host__
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __managed__
#define __cudart_builtin__
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define CUDARTAPI
#define CUDARTAPI_CDECL
#define CUDART_CB
#define __dv(v)
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(a) __align__(a)
#define __CUDA_ALIGN__(n) __align__(n)
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __thread__ __thread
#define __import__
#define __export__
#define __cdecl
#define __annotate__(a) __attribute__((a))
#define __location__(a) __annotate__(a)
#define __specialization_static
#define __no_return__ __attribute__((noreturn))

#endif
