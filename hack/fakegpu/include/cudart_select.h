/*
 * cudart_select.h - picks this build's rows out of the simulated runtime's generated X-macro
 * lists (include/cudart_errors.def, src/cudart_exports.def), whose rows carry an "in CUDA 12"
 * and an "in CUDA 13" flag. Included by cudart_abi.h and by the linker version script template
 * (src/cudart.map.in), so it holds macros only.
 */
#ifndef VGPU_FAKEGPU_CUDART_SELECT_H
#define VGPU_FAKEGPU_CUDART_SELECT_H

#if !defined(VGPU_CUDART_MAJOR)
#error "define VGPU_CUDART_MAJOR (12 or 13): the CUDA major version whose runtime ABI to declare"
#endif

/* VGPU_CUDART_IN picks this build's flag; VGPU_CUDART_PICK(flag, x) keeps x (which must have
 * no top-level comma) when the flag is 1. */
#if VGPU_CUDART_MAJOR == 12
#define VGPU_CUDART_IN(in12, in13) in12
#else
#define VGPU_CUDART_IN(in12, in13) in13
#endif
#define VGPU_CUDART_PICK(flag, x) VGPU_CUDART_PICK_(flag, x)
#define VGPU_CUDART_PICK_(flag, x) VGPU_CUDART_PICK_##flag(x)
#define VGPU_CUDART_PICK_0(x)
#define VGPU_CUDART_PICK_1(x) x

#endif /* VGPU_FAKEGPU_CUDART_SELECT_H */
