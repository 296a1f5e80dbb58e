/*
 * abi_nvml_dump.c - prints the sizes, field offsets and constant values of every NVML type and
 * constant that include/nvml_abi.h declares. `make abi-check` builds it once against our header
 * and once against each official nvml.h (force-included, -DUSE_OFFICIAL_NVML_H) and diffs the
 * outputs: any difference is an ABI bug in our declarations.
 */
#include <stddef.h>
#include <stdio.h>

#ifndef USE_OFFICIAL_NVML_H
#include "nvml_abi.h"
#endif

#define SIZE(t) printf("sizeof %s %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("offsetof %s.%s %zu size %zu\n", #t, #f, offsetof(t, f), sizeof(((t *)0)->f))
#define VAL(v) printf("value %s %lld\n", #v, (long long)(v))

int main(void)
{
    SIZE(nvmlPciInfo_t);
    OFF(nvmlPciInfo_t, busIdLegacy);
    OFF(nvmlPciInfo_t, domain);
    OFF(nvmlPciInfo_t, bus);
    OFF(nvmlPciInfo_t, device);
    OFF(nvmlPciInfo_t, pciDeviceId);
    OFF(nvmlPciInfo_t, pciSubSystemId);
    OFF(nvmlPciInfo_t, busId);
    SIZE(nvmlMemory_t);
    OFF(nvmlMemory_t, total);
    OFF(nvmlMemory_t, free);
    OFF(nvmlMemory_t, used);
    SIZE(nvmlMemory_v2_t);
    OFF(nvmlMemory_v2_t, version);
    OFF(nvmlMemory_v2_t, total);
    OFF(nvmlMemory_v2_t, reserved);
    OFF(nvmlMemory_v2_t, free);
    OFF(nvmlMemory_v2_t, used);
    VAL(nvmlMemory_v2);
    SIZE(nvmlBAR1Memory_t);
    OFF(nvmlBAR1Memory_t, bar1Total);
    OFF(nvmlBAR1Memory_t, bar1Free);
    OFF(nvmlBAR1Memory_t, bar1Used);
    SIZE(nvmlProcessInfo_v1_t);
    OFF(nvmlProcessInfo_v1_t, pid);
    OFF(nvmlProcessInfo_v1_t, usedGpuMemory);
    SIZE(nvmlProcessInfo_v2_t);
    SIZE(nvmlProcessInfo_t);
    OFF(nvmlProcessInfo_t, pid);
    OFF(nvmlProcessInfo_t, usedGpuMemory);
    OFF(nvmlProcessInfo_t, gpuInstanceId);
    OFF(nvmlProcessInfo_t, computeInstanceId);
    SIZE(nvmlProcessDetail_v1_t);
    OFF(nvmlProcessDetail_v1_t, pid);
    OFF(nvmlProcessDetail_v1_t, usedGpuMemory);
    OFF(nvmlProcessDetail_v1_t, gpuInstanceId);
    OFF(nvmlProcessDetail_v1_t, computeInstanceId);
    OFF(nvmlProcessDetail_v1_t, usedGpuCcProtectedMemory);
    SIZE(nvmlProcessDetailList_t);
    OFF(nvmlProcessDetailList_t, version);
    OFF(nvmlProcessDetailList_t, mode);
    OFF(nvmlProcessDetailList_t, numProcArrayEntries);
    OFF(nvmlProcessDetailList_t, procArray);
    VAL(nvmlProcessDetailList_v1);
    SIZE(nvmlUtilization_t);
    OFF(nvmlUtilization_t, gpu);
    OFF(nvmlUtilization_t, memory);
    SIZE(nvmlProcessUtilizationSample_t);
    OFF(nvmlProcessUtilizationSample_t, pid);
    OFF(nvmlProcessUtilizationSample_t, timeStamp);
    OFF(nvmlProcessUtilizationSample_t, smUtil);
    OFF(nvmlProcessUtilizationSample_t, memUtil);
    OFF(nvmlProcessUtilizationSample_t, encUtil);
    OFF(nvmlProcessUtilizationSample_t, decUtil);
    SIZE(nvmlProcessUtilizationInfo_v1_t);
    OFF(nvmlProcessUtilizationInfo_v1_t, timeStamp);
    OFF(nvmlProcessUtilizationInfo_v1_t, pid);
    OFF(nvmlProcessUtilizationInfo_v1_t, smUtil);
    OFF(nvmlProcessUtilizationInfo_v1_t, memUtil);
    OFF(nvmlProcessUtilizationInfo_v1_t, ofaUtil);
    SIZE(nvmlProcessesUtilizationInfo_t);
    OFF(nvmlProcessesUtilizationInfo_t, version);
    OFF(nvmlProcessesUtilizationInfo_t, processSamplesCount);
    OFF(nvmlProcessesUtilizationInfo_t, lastSeenTimeStamp);
    OFF(nvmlProcessesUtilizationInfo_t, procUtilArray);
    VAL(nvmlProcessesUtilizationInfo_v1);
    SIZE(nvmlEventData_t);
    OFF(nvmlEventData_t, device);
    OFF(nvmlEventData_t, eventType);
    OFF(nvmlEventData_t, eventData);
    OFF(nvmlEventData_t, gpuInstanceId);
    OFF(nvmlEventData_t, computeInstanceId);
    SIZE(nvmlTemperature_t);
    OFF(nvmlTemperature_t, version);
    OFF(nvmlTemperature_t, sensorType);
    OFF(nvmlTemperature_t, temperature);
    VAL(nvmlTemperature_v1);
    SIZE(nvmlConfComputeMemSizeInfo_t);
    OFF(nvmlConfComputeMemSizeInfo_t, protectedMemSizeKib);
    OFF(nvmlConfComputeMemSizeInfo_t, unprotectedMemSizeKib);
    SIZE(nvmlDriverModel_t);
    VAL(NVML_DRIVER_WDDM); VAL(NVML_DRIVER_WDM); VAL(NVML_DRIVER_MCDM);
    SIZE(nvmlDeviceAttributes_t);
    OFF(nvmlDeviceAttributes_t, multiprocessorCount);
    OFF(nvmlDeviceAttributes_t, sharedCopyEngineCount);
    OFF(nvmlDeviceAttributes_t, sharedDecoderCount);
    OFF(nvmlDeviceAttributes_t, sharedEncoderCount);
    OFF(nvmlDeviceAttributes_t, sharedJpegCount);
    OFF(nvmlDeviceAttributes_t, sharedOfaCount);
    OFF(nvmlDeviceAttributes_t, gpuInstanceSliceCount);
    OFF(nvmlDeviceAttributes_t, computeInstanceSliceCount);
    OFF(nvmlDeviceAttributes_t, memorySizeMB);
    SIZE(nvmlIntNvLinkDeviceType_t);
    VAL(NVML_NVLINK_DEVICE_TYPE_GPU); VAL(NVML_NVLINK_DEVICE_TYPE_IBMNPU);
    VAL(NVML_NVLINK_DEVICE_TYPE_SWITCH); VAL(NVML_NVLINK_DEVICE_TYPE_UNKNOWN);
    SIZE(nvmlDevice_t);
    SIZE(nvmlEventSet_t);
    SIZE(nvmlReturn_t);
    SIZE(nvmlBrandType_t);
    SIZE(nvmlDeviceArchitecture_t);
    SIZE(nvmlGpuTopologyLevel_t);
    SIZE(nvmlEnableState_t);

    VAL(NVML_SUCCESS); VAL(NVML_ERROR_UNINITIALIZED); VAL(NVML_ERROR_INVALID_ARGUMENT);
    VAL(NVML_ERROR_NOT_SUPPORTED); VAL(NVML_ERROR_NO_PERMISSION);
    VAL(NVML_ERROR_ALREADY_INITIALIZED); VAL(NVML_ERROR_NOT_FOUND);
    VAL(NVML_ERROR_INSUFFICIENT_SIZE); VAL(NVML_ERROR_INSUFFICIENT_POWER);
    VAL(NVML_ERROR_DRIVER_NOT_LOADED); VAL(NVML_ERROR_TIMEOUT); VAL(NVML_ERROR_IRQ_ISSUE);
    VAL(NVML_ERROR_LIBRARY_NOT_FOUND); VAL(NVML_ERROR_FUNCTION_NOT_FOUND);
    VAL(NVML_ERROR_CORRUPTED_INFOROM); VAL(NVML_ERROR_GPU_IS_LOST);
    VAL(NVML_ERROR_RESET_REQUIRED); VAL(NVML_ERROR_OPERATING_SYSTEM);
    VAL(NVML_ERROR_LIB_RM_VERSION_MISMATCH); VAL(NVML_ERROR_IN_USE); VAL(NVML_ERROR_MEMORY);
    VAL(NVML_ERROR_NO_DATA); VAL(NVML_ERROR_VGPU_ECC_NOT_SUPPORTED);
    VAL(NVML_ERROR_INSUFFICIENT_RESOURCES); VAL(NVML_ERROR_FREQ_NOT_SUPPORTED);
    VAL(NVML_ERROR_ARGUMENT_VERSION_MISMATCH); VAL(NVML_ERROR_DEPRECATED);
    VAL(NVML_ERROR_NOT_READY); VAL(NVML_ERROR_GPU_NOT_FOUND); VAL(NVML_ERROR_INVALID_STATE);
    VAL(NVML_ERROR_UNKNOWN);
    VAL(NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE); VAL(NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE);
    VAL(NVML_DEVICE_UUID_BUFFER_SIZE); VAL(NVML_DEVICE_UUID_V2_BUFFER_SIZE);
    VAL(NVML_DEVICE_NAME_BUFFER_SIZE); VAL(NVML_DEVICE_NAME_V2_BUFFER_SIZE);
    VAL(NVML_DEVICE_SERIAL_BUFFER_SIZE); VAL(NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE);
    VAL(NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE); VAL(NVML_VALUE_NOT_AVAILABLE);
    VAL(NVML_INIT_FLAG_NO_GPUS); VAL(NVML_INIT_FLAG_NO_ATTACH);
    VAL(NVML_AFFINITY_SCOPE_NODE); VAL(NVML_AFFINITY_SCOPE_SOCKET);
    VAL(nvmlEventTypeNone); VAL(nvmlEventTypeSingleBitEccError);
    VAL(nvmlEventTypeDoubleBitEccError); VAL(nvmlEventTypePState);
    VAL(nvmlEventTypeXidCriticalError); VAL(nvmlEventTypeClock);
    VAL(NVML_BRAND_UNKNOWN); VAL(NVML_BRAND_QUADRO); VAL(NVML_BRAND_TESLA); VAL(NVML_BRAND_NVS);
    VAL(NVML_BRAND_GRID); VAL(NVML_BRAND_GEFORCE); VAL(NVML_BRAND_TITAN);
    VAL(NVML_BRAND_QUADRO_RTX); VAL(NVML_BRAND_NVIDIA_RTX); VAL(NVML_BRAND_NVIDIA);
    VAL(NVML_DEVICE_ARCH_AMPERE); VAL(NVML_DEVICE_ARCH_ADA); VAL(NVML_DEVICE_ARCH_HOPPER);
    VAL(NVML_DEVICE_ARCH_BLACKWELL);
    VAL(NVML_TOPOLOGY_INTERNAL); VAL(NVML_TOPOLOGY_SINGLE); VAL(NVML_TOPOLOGY_MULTIPLE);
    VAL(NVML_TOPOLOGY_HOSTBRIDGE); VAL(NVML_TOPOLOGY_NODE); VAL(NVML_TOPOLOGY_SYSTEM);
    VAL(NVML_P2P_STATUS_OK); VAL(NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED);
    VAL(NVML_P2P_STATUS_GPU_NOT_SUPPORTED); VAL(NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED);
    VAL(NVML_P2P_STATUS_DISABLED_BY_REGKEY); VAL(NVML_P2P_STATUS_NOT_SUPPORTED);
    VAL(NVML_P2P_STATUS_UNKNOWN);
    VAL(NVML_P2P_CAPS_INDEX_READ); VAL(NVML_P2P_CAPS_INDEX_WRITE);
    VAL(NVML_P2P_CAPS_INDEX_NVLINK); VAL(NVML_P2P_CAPS_INDEX_ATOMICS);
    VAL(NVML_P2P_CAPS_INDEX_PCI); VAL(NVML_P2P_CAPS_INDEX_PROP); VAL(NVML_P2P_CAPS_INDEX_UNKNOWN);
    VAL(NVML_FEATURE_DISABLED); VAL(NVML_FEATURE_ENABLED);
    VAL(NVML_COMPUTEMODE_DEFAULT); VAL(NVML_COMPUTEMODE_EXCLUSIVE_THREAD);
    VAL(NVML_COMPUTEMODE_PROHIBITED); VAL(NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);
    VAL(NVML_TEMPERATURE_GPU);
    VAL(NVML_TEMPERATURE_THRESHOLD_SHUTDOWN); VAL(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN);
    VAL(NVML_TEMPERATURE_THRESHOLD_MEM_MAX); VAL(NVML_TEMPERATURE_THRESHOLD_GPU_MAX);
    VAL(NVML_CLOCK_GRAPHICS); VAL(NVML_CLOCK_SM); VAL(NVML_CLOCK_MEM); VAL(NVML_CLOCK_VIDEO);
    VAL(NVML_PSTATE_0); VAL(NVML_PSTATE_8); VAL(NVML_PSTATE_15); VAL(NVML_PSTATE_UNKNOWN);
    VAL(NVML_NVLINK_CAP_P2P_SUPPORTED); VAL(NVML_NVLINK_CAP_SYSMEM_ACCESS);
    VAL(NVML_NVLINK_CAP_P2P_ATOMICS); VAL(NVML_NVLINK_CAP_SYSMEM_ATOMICS);
    VAL(NVML_NVLINK_CAP_SLI_BRIDGE); VAL(NVML_NVLINK_CAP_VALID);
    VAL(NVML_MEMORY_ERROR_TYPE_CORRECTED); VAL(NVML_MEMORY_ERROR_TYPE_UNCORRECTED);
    VAL(NVML_VOLATILE_ECC); VAL(NVML_AGGREGATE_ECC);
    VAL(NVML_PCIE_UTIL_TX_BYTES); VAL(NVML_PCIE_UTIL_RX_BYTES);
    return 0;
}
