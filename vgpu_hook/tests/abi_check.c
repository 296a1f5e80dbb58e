/*
 * abi_check.c - prints the layout of every struct and the value of every enum constant the
 * hook declares itself. Built twice (against the official cuda.h/nvml.h with
 * VGPU_ABI_OFFICIAL=1, and against include/cuda_abi.h + nvml_abi.h); `make abi-check` diffs
 * the two outputs for CUDA 12 and CUDA 13 headers.
 */
#include <stddef.h>
#include <stdio.h>

#if VGPU_ABI_OFFICIAL
#define __CUDA_API_VERSION_INTERNAL 1 /* exposes the legacy CUdeviceptr_v1 */
#include <cuda.h>
#include <nvml.h>
#else
#include "cuda_abi.h"
#include "nvml_abi.h"
#endif

#define SIZE(t) printf("sizeof %s = %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("offsetof %s.%s = %zu\n", #t, #f, offsetof(t, f))
#define VAL(v) printf("value %s = %lld\n", #v, (long long)(v))

int main(void) {
    SIZE(CUresult); SIZE(CUdevice); SIZE(CUdeviceptr); SIZE(CUdeviceptr_v1); SIZE(cuuint64_t);
    SIZE(CUmemGenericAllocationHandle); SIZE(CUuuid); SIZE(CUarray_format);
    SIZE(CUDA_ARRAY_DESCRIPTOR);
    OFF(CUDA_ARRAY_DESCRIPTOR, Width); OFF(CUDA_ARRAY_DESCRIPTOR, Height);
    OFF(CUDA_ARRAY_DESCRIPTOR, Format); OFF(CUDA_ARRAY_DESCRIPTOR, NumChannels);
    SIZE(CUDA_ARRAY3D_DESCRIPTOR);
    OFF(CUDA_ARRAY3D_DESCRIPTOR, Width); OFF(CUDA_ARRAY3D_DESCRIPTOR, Height);
    OFF(CUDA_ARRAY3D_DESCRIPTOR, Depth); OFF(CUDA_ARRAY3D_DESCRIPTOR, Format);
    OFF(CUDA_ARRAY3D_DESCRIPTOR, NumChannels); OFF(CUDA_ARRAY3D_DESCRIPTOR, Flags);
    SIZE(CUmemLocation); OFF(CUmemLocation, type); OFF(CUmemLocation, id);
    SIZE(CUmemAllocationProp);
    OFF(CUmemAllocationProp, type); OFF(CUmemAllocationProp, requestedHandleTypes);
    OFF(CUmemAllocationProp, location); OFF(CUmemAllocationProp, win32HandleMetaData);
    OFF(CUmemAllocationProp, allocFlags);
    SIZE(CUlaunchConfig);
    OFF(CUlaunchConfig, gridDimX); OFF(CUlaunchConfig, gridDimY); OFF(CUlaunchConfig, gridDimZ);
    OFF(CUlaunchConfig, blockDimX); OFF(CUlaunchConfig, blockDimY);
    OFF(CUlaunchConfig, blockDimZ); OFF(CUlaunchConfig, sharedMemBytes);
    OFF(CUlaunchConfig, hStream); OFF(CUlaunchConfig, attrs); OFF(CUlaunchConfig, numAttrs);
    VAL(CUDA_SUCCESS); VAL(CUDA_ERROR_INVALID_VALUE); VAL(CUDA_ERROR_OUT_OF_MEMORY);
    VAL(CUDA_ERROR_NOT_INITIALIZED); VAL(CUDA_ERROR_INVALID_CONTEXT); VAL(CUDA_ERROR_NOT_FOUND);
    VAL(CUDA_ERROR_UNKNOWN);
    VAL(CU_AD_FORMAT_UNSIGNED_INT8); VAL(CU_AD_FORMAT_UNSIGNED_INT16);
    VAL(CU_AD_FORMAT_UNSIGNED_INT32); VAL(CU_AD_FORMAT_SIGNED_INT8);
    VAL(CU_AD_FORMAT_SIGNED_INT16); VAL(CU_AD_FORMAT_SIGNED_INT32); VAL(CU_AD_FORMAT_HALF);
    VAL(CU_AD_FORMAT_FLOAT);
    VAL(CU_MEM_ALLOCATION_TYPE_PINNED); VAL(CU_MEM_LOCATION_TYPE_DEVICE);
    VAL(CU_MEM_HANDLE_TYPE_NONE); VAL(CU_MEM_ATTACH_GLOBAL);
    VAL(CU_GET_PROC_ADDRESS_DEFAULT); VAL(CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    VAL(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    VAL(CU_GET_PROC_ADDRESS_SUCCESS); VAL(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    VAL(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    SIZE(nvmlReturn_t); SIZE(nvmlDevice_t);
    SIZE(nvmlMemory_t); OFF(nvmlMemory_t, total); OFF(nvmlMemory_t, free); OFF(nvmlMemory_t, used);
    SIZE(nvmlMemory_v2_t); OFF(nvmlMemory_v2_t, version); OFF(nvmlMemory_v2_t, total);
    OFF(nvmlMemory_v2_t, reserved); OFF(nvmlMemory_v2_t, free); OFF(nvmlMemory_v2_t, used);
    SIZE(nvmlUtilization_t); OFF(nvmlUtilization_t, gpu); OFF(nvmlUtilization_t, memory);
    SIZE(nvmlProcessUtilizationSample_t); OFF(nvmlProcessUtilizationSample_t, pid);
    OFF(nvmlProcessUtilizationSample_t, timeStamp); OFF(nvmlProcessUtilizationSample_t, smUtil);
    OFF(nvmlProcessUtilizationSample_t, memUtil); OFF(nvmlProcessUtilizationSample_t, encUtil);
    OFF(nvmlProcessUtilizationSample_t, decUtil);
    VAL(NVML_SUCCESS); VAL(NVML_ERROR_UNINITIALIZED); VAL(NVML_ERROR_INVALID_ARGUMENT);
    VAL(NVML_ERROR_NOT_SUPPORTED); VAL(NVML_ERROR_INSUFFICIENT_SIZE);
    VAL(NVML_ERROR_FUNCTION_NOT_FOUND); VAL(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    VAL(NVML_ERROR_UNKNOWN); VAL(NVML_DEVICE_UUID_V2_BUFFER_SIZE);
    return 0;
}
