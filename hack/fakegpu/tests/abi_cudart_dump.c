/*
 * abi_cudart_dump.c - prints the sizes, field offsets and constant values of every runtime type
 * and constant that include/cudart_abi.h declares for one major version (VGPU_CUDART_MAJOR).
 * `make abi-check` builds it once against our header and once against the official
 * cuda_runtime_api.h of that version (-DUSE_OFFICIAL_CUDART_H) and diffs the outputs: any
 * difference is an ABI bug in our declarations. Fields that exist in one major version only are
 * dumped under the same #if as in cudart_abi.h.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef USE_OFFICIAL_CUDART_H
#include <cuda_runtime_api.h>
#include "cudart_select.h"
#else
#include "cudart_abi.h"
#endif

#define SIZE(t) printf("sizeof %s %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("offsetof %s.%s %zu size %zu\n", #t, #f, offsetof(t, f), sizeof(((t *)0)->f))
#define VAL(v) printf("value %s %lld\n", #v, (long long)(intptr_t)(v))

int main(void)
{
    SIZE(cudaUUID_t);
    OFF(cudaUUID_t, bytes);
    SIZE(struct uint3);
    OFF(struct uint3, x);
    OFF(struct uint3, y);
    OFF(struct uint3, z);
    SIZE(struct dim3);
    OFF(struct dim3, x);
    OFF(struct dim3, y);
    OFF(struct dim3, z);
    SIZE(struct cudaDeviceProp);
    OFF(struct cudaDeviceProp, name);
    OFF(struct cudaDeviceProp, uuid);
    OFF(struct cudaDeviceProp, luid);
    OFF(struct cudaDeviceProp, luidDeviceNodeMask);
    OFF(struct cudaDeviceProp, totalGlobalMem);
    OFF(struct cudaDeviceProp, sharedMemPerBlock);
    OFF(struct cudaDeviceProp, regsPerBlock);
    OFF(struct cudaDeviceProp, warpSize);
    OFF(struct cudaDeviceProp, memPitch);
    OFF(struct cudaDeviceProp, maxThreadsPerBlock);
    OFF(struct cudaDeviceProp, maxThreadsDim);
    OFF(struct cudaDeviceProp, maxGridSize);
#if VGPU_CUDART_MAJOR == 12
    OFF(struct cudaDeviceProp, clockRate);
#endif
    OFF(struct cudaDeviceProp, totalConstMem);
    OFF(struct cudaDeviceProp, major);
    OFF(struct cudaDeviceProp, minor);
    OFF(struct cudaDeviceProp, textureAlignment);
    OFF(struct cudaDeviceProp, texturePitchAlignment);
#if VGPU_CUDART_MAJOR == 12
    OFF(struct cudaDeviceProp, deviceOverlap);
#endif
    OFF(struct cudaDeviceProp, multiProcessorCount);
#if VGPU_CUDART_MAJOR == 12
    OFF(struct cudaDeviceProp, kernelExecTimeoutEnabled);
#endif
    OFF(struct cudaDeviceProp, integrated);
    OFF(struct cudaDeviceProp, canMapHostMemory);
#if VGPU_CUDART_MAJOR == 12
    OFF(struct cudaDeviceProp, computeMode);
#endif
    OFF(struct cudaDeviceProp, maxTexture1D);
    OFF(struct cudaDeviceProp, maxTexture1DMipmap);
#if VGPU_CUDART_MAJOR == 12
    OFF(struct cudaDeviceProp, maxTexture1DLinear);
#endif
    OFF(struct cudaDeviceProp, maxTexture2D);
    OFF(struct cudaDeviceProp, maxTexture2DMipmap);
    OFF(struct cudaDeviceProp, maxTexture2DLinear);
    OFF(struct cudaDeviceProp, maxTexture2DGather);
    OFF(struct cudaDeviceProp, maxTexture3D);
    OFF(struct cudaDeviceProp, maxTexture3DAlt);
    OFF(struct cudaDeviceProp, maxTextureCubemap);
    OFF(struct cudaDeviceProp, maxTexture1DLayered);
    OFF(struct cudaDeviceProp, maxTexture2DLayered);
    OFF(struct cudaDeviceProp, maxTextureCubemapLayered);
    OFF(struct cudaDeviceProp, maxSurface1D);
    OFF(struct cudaDeviceProp, maxSurface2D);
    OFF(struct cudaDeviceProp, maxSurface3D);
    OFF(struct cudaDeviceProp, maxSurface1DLayered);
    OFF(struct cudaDeviceProp, maxSurface2DLayered);
    OFF(struct cudaDeviceProp, maxSurfaceCubemap);
    OFF(struct cudaDeviceProp, maxSurfaceCubemapLayered);
    OFF(struct cudaDeviceProp, surfaceAlignment);
    OFF(struct cudaDeviceProp, concurrentKernels);
    OFF(struct cudaDeviceProp, ECCEnabled);
    OFF(struct cudaDeviceProp, pciBusID);
    OFF(struct cudaDeviceProp, pciDeviceID);
    OFF(struct cudaDeviceProp, pciDomainID);
    OFF(struct cudaDeviceProp, tccDriver);
    OFF(struct cudaDeviceProp, asyncEngineCount);
    OFF(struct cudaDeviceProp, unifiedAddressing);
#if VGPU_CUDART_MAJOR == 12
    OFF(struct cudaDeviceProp, memoryClockRate);
#endif
    OFF(struct cudaDeviceProp, memoryBusWidth);
    OFF(struct cudaDeviceProp, l2CacheSize);
    OFF(struct cudaDeviceProp, persistingL2CacheMaxSize);
    OFF(struct cudaDeviceProp, maxThreadsPerMultiProcessor);
    OFF(struct cudaDeviceProp, streamPrioritiesSupported);
    OFF(struct cudaDeviceProp, globalL1CacheSupported);
    OFF(struct cudaDeviceProp, localL1CacheSupported);
    OFF(struct cudaDeviceProp, sharedMemPerMultiprocessor);
    OFF(struct cudaDeviceProp, regsPerMultiprocessor);
    OFF(struct cudaDeviceProp, managedMemory);
    OFF(struct cudaDeviceProp, isMultiGpuBoard);
    OFF(struct cudaDeviceProp, multiGpuBoardGroupID);
    OFF(struct cudaDeviceProp, hostNativeAtomicSupported);
#if VGPU_CUDART_MAJOR == 12
    OFF(struct cudaDeviceProp, singleToDoublePrecisionPerfRatio);
#endif
    OFF(struct cudaDeviceProp, pageableMemoryAccess);
    OFF(struct cudaDeviceProp, concurrentManagedAccess);
    OFF(struct cudaDeviceProp, computePreemptionSupported);
    OFF(struct cudaDeviceProp, canUseHostPointerForRegisteredMem);
    OFF(struct cudaDeviceProp, cooperativeLaunch);
#if VGPU_CUDART_MAJOR == 12
    OFF(struct cudaDeviceProp, cooperativeMultiDeviceLaunch);
#endif
    OFF(struct cudaDeviceProp, sharedMemPerBlockOptin);
    OFF(struct cudaDeviceProp, pageableMemoryAccessUsesHostPageTables);
    OFF(struct cudaDeviceProp, directManagedMemAccessFromHost);
    OFF(struct cudaDeviceProp, maxBlocksPerMultiProcessor);
    OFF(struct cudaDeviceProp, accessPolicyMaxWindowSize);
    OFF(struct cudaDeviceProp, reservedSharedMemPerBlock);
    OFF(struct cudaDeviceProp, hostRegisterSupported);
    OFF(struct cudaDeviceProp, sparseCudaArraySupported);
    OFF(struct cudaDeviceProp, hostRegisterReadOnlySupported);
    OFF(struct cudaDeviceProp, timelineSemaphoreInteropSupported);
    OFF(struct cudaDeviceProp, memoryPoolsSupported);
    OFF(struct cudaDeviceProp, gpuDirectRDMASupported);
    OFF(struct cudaDeviceProp, gpuDirectRDMAFlushWritesOptions);
    OFF(struct cudaDeviceProp, gpuDirectRDMAWritesOrdering);
    OFF(struct cudaDeviceProp, memoryPoolSupportedHandleTypes);
    OFF(struct cudaDeviceProp, deferredMappingCudaArraySupported);
    OFF(struct cudaDeviceProp, ipcEventSupported);
    OFF(struct cudaDeviceProp, clusterLaunch);
    OFF(struct cudaDeviceProp, unifiedFunctionPointers);
#if VGPU_CUDART_MAJOR == 12
    OFF(struct cudaDeviceProp, reserved);
#else
    OFF(struct cudaDeviceProp, deviceNumaConfig);
    OFF(struct cudaDeviceProp, deviceNumaId);
    OFF(struct cudaDeviceProp, mpsEnabled);
    OFF(struct cudaDeviceProp, hostNumaId);
    OFF(struct cudaDeviceProp, gpuPciDeviceID);
    OFF(struct cudaDeviceProp, gpuPciSubsystemID);
    OFF(struct cudaDeviceProp, hostNumaMultinodeIpcSupported);
    OFF(struct cudaDeviceProp, reserved);
#endif
    SIZE(struct cudaPointerAttributes);
    OFF(struct cudaPointerAttributes, type);
    OFF(struct cudaPointerAttributes, device);
    OFF(struct cudaPointerAttributes, devicePointer);
    OFF(struct cudaPointerAttributes, hostPointer);
#if VGPU_CUDART_MAJOR >= 13
    OFF(struct cudaPointerAttributes, reserved);
#endif
    SIZE(struct cudaFuncAttributes);
    OFF(struct cudaFuncAttributes, sharedSizeBytes);
    OFF(struct cudaFuncAttributes, constSizeBytes);
    OFF(struct cudaFuncAttributes, localSizeBytes);
    OFF(struct cudaFuncAttributes, maxThreadsPerBlock);
    OFF(struct cudaFuncAttributes, numRegs);
    OFF(struct cudaFuncAttributes, ptxVersion);
    OFF(struct cudaFuncAttributes, binaryVersion);
    OFF(struct cudaFuncAttributes, cacheModeCA);
    OFF(struct cudaFuncAttributes, maxDynamicSharedSizeBytes);
    OFF(struct cudaFuncAttributes, preferredShmemCarveout);
    OFF(struct cudaFuncAttributes, clusterDimMustBeSet);
    OFF(struct cudaFuncAttributes, requiredClusterWidth);
    OFF(struct cudaFuncAttributes, requiredClusterHeight);
    OFF(struct cudaFuncAttributes, requiredClusterDepth);
    OFF(struct cudaFuncAttributes, clusterSchedulingPolicyPreference);
    OFF(struct cudaFuncAttributes, nonPortableClusterSizeAllowed);
#if VGPU_CUDART_MAJOR == 12
    OFF(struct cudaFuncAttributes, reserved);
#else
    OFF(struct cudaFuncAttributes, deviceNodeUpdateStatus);
    OFF(struct cudaFuncAttributes, sharedMemoryMode);
    OFF(struct cudaFuncAttributes, reserved);
#endif
    SIZE(struct cudaMemLocation);
    OFF(struct cudaMemLocation, type);
#if VGPU_CUDART_MAJOR == 12
    OFF(struct cudaMemLocation, id);
#else
#endif
    SIZE(struct cudaMemPoolProps);
    OFF(struct cudaMemPoolProps, allocType);
    OFF(struct cudaMemPoolProps, handleTypes);
    OFF(struct cudaMemPoolProps, location);
    OFF(struct cudaMemPoolProps, win32SecurityAttributes);
    OFF(struct cudaMemPoolProps, maxSize);
    OFF(struct cudaMemPoolProps, usage);
#if VGPU_CUDART_MAJOR == 12
    OFF(struct cudaMemPoolProps, reserved);
#else
    OFF(struct cudaMemPoolProps, reserved);
    OFF(struct cudaMemPoolProps, reserved1);
#endif
    OFF(struct cudaMemLocation, id); /* in CUDA 13 a member of an anonymous union */
    SIZE(struct cudaMemAccessDesc);
    OFF(struct cudaMemAccessDesc, location);
    OFF(struct cudaMemAccessDesc, flags);
    SIZE(struct cudaExtent);
    OFF(struct cudaExtent, width);
    OFF(struct cudaExtent, height);
    OFF(struct cudaExtent, depth);
    SIZE(struct cudaPitchedPtr);
    OFF(struct cudaPitchedPtr, ptr);
    OFF(struct cudaPitchedPtr, pitch);
    OFF(struct cudaPitchedPtr, xsize);
    OFF(struct cudaPitchedPtr, ysize);
    SIZE(struct cudaChannelFormatDesc);
    OFF(struct cudaChannelFormatDesc, x);
    OFF(struct cudaChannelFormatDesc, y);
    OFF(struct cudaChannelFormatDesc, z);
    OFF(struct cudaChannelFormatDesc, w);
    OFF(struct cudaChannelFormatDesc, f);
    SIZE(cudaLaunchAttributeValue);
    OFF(cudaLaunchAttributeValue, pad);
    OFF(cudaLaunchAttributeValue, cooperative);
    SIZE(cudaLaunchAttribute);
    OFF(cudaLaunchAttribute, id);
    OFF(cudaLaunchAttribute, val);
    SIZE(cudaLaunchConfig_t);
    OFF(cudaLaunchConfig_t, gridDim);
    OFF(cudaLaunchConfig_t, blockDim);
    OFF(cudaLaunchConfig_t, dynamicSmemBytes);
    OFF(cudaLaunchConfig_t, stream);
    OFF(cudaLaunchConfig_t, attrs);
    OFF(cudaLaunchConfig_t, numAttrs);
    SIZE(cudaError_t);
#define CUDART_ERROR(name, value, in12, in13) VGPU_CUDART_PICK(VGPU_CUDART_IN(in12, in13), VAL(name);)
#include "cudart_errors.def"
#undef CUDART_ERROR
    SIZE(enum cudaMemcpyKind);
    VAL(cudaMemcpyHostToHost);
    VAL(cudaMemcpyHostToDevice);
    VAL(cudaMemcpyDeviceToHost);
    VAL(cudaMemcpyDeviceToDevice);
    VAL(cudaMemcpyDefault);
    SIZE(enum cudaMemoryType);
    VAL(cudaMemoryTypeUnregistered);
    VAL(cudaMemoryTypeHost);
    VAL(cudaMemoryTypeDevice);
    VAL(cudaMemoryTypeManaged);
    SIZE(enum cudaStreamCaptureStatus);
    VAL(cudaStreamCaptureStatusNone);
    VAL(cudaStreamCaptureStatusActive);
    VAL(cudaStreamCaptureStatusInvalidated);
    SIZE(enum cudaStreamCaptureMode);
    VAL(cudaStreamCaptureModeGlobal);
    VAL(cudaStreamCaptureModeThreadLocal);
    VAL(cudaStreamCaptureModeRelaxed);
    SIZE(enum cudaDriverEntryPointQueryResult);
    VAL(cudaDriverEntryPointSuccess);
    VAL(cudaDriverEntryPointSymbolNotFound);
    VAL(cudaDriverEntryPointVersionNotSufficent);
    SIZE(enum cudaLimit);
    VAL(cudaLimitStackSize);
    VAL(cudaLimitPrintfFifoSize);
    VAL(cudaLimitMallocHeapSize);
    VAL(cudaLimitDevRuntimeSyncDepth);
    VAL(cudaLimitDevRuntimePendingLaunchCount);
    VAL(cudaLimitMaxL2FetchGranularity);
    VAL(cudaLimitPersistingL2CacheSize);
    SIZE(enum cudaFuncCache);
    VAL(cudaFuncCachePreferNone);
    VAL(cudaFuncCachePreferShared);
    VAL(cudaFuncCachePreferL1);
    VAL(cudaFuncCachePreferEqual);
    SIZE(enum cudaSharedMemConfig);
    VAL(cudaSharedMemBankSizeDefault);
    VAL(cudaSharedMemBankSizeFourByte);
    VAL(cudaSharedMemBankSizeEightByte);
    SIZE(enum cudaDeviceAttr);
    VAL(cudaDevAttrMaxThreadsPerBlock);
    VAL(cudaDevAttrMultiProcessorCount);
    VAL(cudaDevAttrPciBusId);
    VAL(cudaDevAttrComputeCapabilityMajor);
    VAL(cudaDevAttrComputeCapabilityMinor);
    VAL(cudaDevAttrMemoryPoolsSupported);
    SIZE(enum cudaFuncAttribute);
    VAL(cudaFuncAttributeMaxDynamicSharedMemorySize);
    VAL(cudaFuncAttributePreferredSharedMemoryCarveout);
    SIZE(enum cudaMemPoolAttr);
    VAL(cudaMemPoolReuseFollowEventDependencies);
    VAL(cudaMemPoolReuseAllowOpportunistic);
    VAL(cudaMemPoolReuseAllowInternalDependencies);
    VAL(cudaMemPoolAttrReleaseThreshold);
    VAL(cudaMemPoolAttrReservedMemCurrent);
    VAL(cudaMemPoolAttrReservedMemHigh);
    VAL(cudaMemPoolAttrUsedMemCurrent);
    VAL(cudaMemPoolAttrUsedMemHigh);
    SIZE(enum cudaMemLocationType);
    VAL(cudaMemLocationTypeInvalid);
    VAL(cudaMemLocationTypeDevice);
    VAL(cudaMemLocationTypeHost);
    VAL(cudaMemLocationTypeHostNuma);
    VAL(cudaMemLocationTypeHostNumaCurrent);
    SIZE(enum cudaMemAllocationType);
    VAL(cudaMemAllocationTypeInvalid);
    VAL(cudaMemAllocationTypePinned);
    VAL(cudaMemAllocationTypeMax);
    SIZE(enum cudaMemAllocationHandleType);
    VAL(cudaMemHandleTypeNone);
    VAL(cudaMemHandleTypePosixFileDescriptor);
    VAL(cudaMemHandleTypeWin32);
    VAL(cudaMemHandleTypeWin32Kmt);
    VAL(cudaMemHandleTypeFabric);
    SIZE(enum cudaMemAccessFlags);
    VAL(cudaMemAccessFlagsProtNone);
    VAL(cudaMemAccessFlagsProtRead);
    VAL(cudaMemAccessFlagsProtReadWrite);
    SIZE(enum cudaChannelFormatKind);
    VAL(cudaChannelFormatKindSigned);
    VAL(cudaChannelFormatKindUnsigned);
    VAL(cudaChannelFormatKindFloat);
    VAL(cudaChannelFormatKindNone);
    SIZE(cudaLaunchAttributeID);
    VAL(cudaLaunchAttributeIgnore);
    VAL(cudaLaunchAttributeCooperative);
#if VGPU_CUDART_MAJOR >= 13
    SIZE(cudaSharedMemoryMode);
    VAL(cudaSharedMemoryModeDefault);
    VAL(cudaSharedMemoryModeRequirePortable);
    VAL(cudaSharedMemoryModeAllowNonPortable);
#endif
    VAL(cudaHostAllocDefault);
    VAL(cudaHostAllocPortable);
    VAL(cudaHostAllocMapped);
    VAL(cudaHostAllocWriteCombined);
    VAL(cudaHostRegisterDefault);
    VAL(cudaHostRegisterPortable);
    VAL(cudaHostRegisterMapped);
    VAL(cudaHostRegisterIoMemory);
    VAL(cudaHostRegisterReadOnly);
    VAL(cudaStreamDefault);
    VAL(cudaStreamNonBlocking);
    VAL(cudaStreamLegacy);
    VAL(cudaStreamPerThread);
    VAL(cudaEventDefault);
    VAL(cudaEventBlockingSync);
    VAL(cudaEventDisableTiming);
    VAL(cudaEventInterprocess);
    VAL(cudaEventRecordDefault);
    VAL(cudaEventRecordExternal);
    VAL(cudaDeviceScheduleAuto);
    VAL(cudaDeviceScheduleSpin);
    VAL(cudaDeviceScheduleYield);
    VAL(cudaDeviceScheduleBlockingSync);
    VAL(cudaDeviceScheduleMask);
    VAL(cudaDeviceMapHost);
    VAL(cudaDeviceLmemResizeToMax);
    VAL(cudaDeviceSyncMemops);
    VAL(cudaDeviceMask);
    VAL(cudaMemAttachGlobal);
    VAL(cudaMemAttachHost);
    VAL(cudaMemAttachSingle);
    VAL(cudaOccupancyDefault);
    VAL(cudaCpuDeviceId);
    VAL(cudaInvalidDeviceId);
    VAL(cudaInitDeviceFlagsAreValid);
    VAL(cudaEnableDefault);
    VAL(cudaEnableLegacyStream);
    VAL(cudaEnablePerThreadDefaultStream);
    return 0;
}
