/*
 * abi_protos.c - compiled with -fsyntax-only: the official headers declare every function
 * first, then our headers redeclare them. C rejects an incompatible redeclaration, so this
 * compiling proves each of our prototypes matches the official one (CUDA 12 and 13).
 * __CUDA_API_VERSION_INTERNAL exposes the versioned names (_v2, _ptsz, legacy v1) the way
 * the driver itself sees them.
 */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <nvml.h>

#define VGPU_ABI_OFFICIAL_TYPES 1
#include "cuda_abi.h"
#include "nvml_abi.h"
