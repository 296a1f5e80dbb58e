/*
 * contract_note.c: the hook's contract version, readable without loading the library.
 *
 * The kubelet plugin refuses to prepare claims when the library at --hook-path does not speak
 * the formats it writes (vgpu.conf, the shared region): glibc silently skips a preload entry it
 * cannot load, so a wrong library would mean uncapped containers. The plugin finds this ELF note
 * (name "vgpu-dra", type 1) through the program headers, like the loader would, so it survives
 * `strip`. Bump VGPU_CONTRACT_VERSION on any change a plugin must know about; the config and
 * region versions are recorded beside it so a mismatch message can say which format moved.
 */
#include <stdint.h>

#include "region.h"

#define VGPU_CONTRACT_VERSION 1u
#define VGPU_CONF_FORMAT_VERSION 1u /* the "version" line of vgpu.conf (src/config.c) */
#define VGPU_NOTE_TYPE_CONTRACT 1u

struct vgpu_contract_note {
    uint32_t namesz;
    uint32_t descsz;
    uint32_t type;
    char name[12]; /* "vgpu-dra" + NUL, padded to 4 bytes */
    uint32_t desc[3];
};

/* Own allocated note section: the linker puts it in a PT_NOTE segment. */
__attribute__((used, aligned(4), section(".note.vgpu-dra"))) static const struct vgpu_contract_note
    vgpu_contract_note = {
        .namesz = 9,
        .descsz = 3 * sizeof(uint32_t),
        .type = VGPU_NOTE_TYPE_CONTRACT,
        .name = "vgpu-dra",
        .desc = {VGPU_CONTRACT_VERSION, VGPU_CONF_FORMAT_VERSION, VGPU_REGION_VERSION},
};
