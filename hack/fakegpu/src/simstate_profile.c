/*
 * simstate_profile.c - parse the text profile that vgpu_testbed/fakegpu/simulator.py writes.
 *
 * Called once per node, by the process that creates the state file (simstate.c). The format is
 * deliberately trivial to parse in C: one `key=value` per line, `#` comments, no quoting.
 *   node.name=dgx-h100              node.driver_version=580.95.05
 *   node.cuda_driver_version=13000  gpu.count=8
 *   gpu.<i>.<field>=<value>         for the fields in kGpuFields below
 * Every key is required except those marked optional; unknown keys are errors (a typo must not
 * silently produce a different machine). Python validates the profile first, so these errors
 * mostly catch hand-edited files.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "simstate_layout.h"

uint64_t sim_profile_hash(const char *text)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ULL;
    }
    return h;
}

enum field_kind { F_STR, F_I32, F_U32, F_U64, F_HEX32, F_CC, F_BRAND, F_ARCH, F_LINKS };

struct field {
    const char *key;
    enum field_kind kind;
    size_t offset;
    size_t size;  /* for strings */
    int optional;
};

#define STR(k, m) {k, F_STR, offsetof(struct sim_gpu_info, m), sizeof(((struct sim_gpu_info *)0)->m), 0}
#define NUM(k, kind, m, opt) {k, kind, offsetof(struct sim_gpu_info, m), 0, opt}

static const struct field kGpuFields[] = {
    STR("name", name),
    STR("uuid", uuid),
    STR("serial", serial),
    STR("pci_bus_id", pci_bus_id),
    STR("pcie_root", pcie_root),
    {"brand", F_BRAND, 0, 0, 0},
    {"architecture", F_ARCH, offsetof(struct sim_gpu_info, arch), 0, 0},
    {"compute_capability", F_CC, 0, 0, 0},
    NUM("memory_bytes", F_U64, memory_total, 0),
    NUM("sm_count", F_U32, sm_count, 0),
    NUM("cores_per_sm", F_U32, cores_per_sm, 0),
    NUM("pci_device_id", F_HEX32, pci_device_id, 0),
    NUM("pci_subsystem_id", F_HEX32, pci_subsystem_id, 1),
    NUM("minor", F_I32, minor, 0),
    NUM("numa_node", F_I32, numa_node, 0),
    NUM("mig_capable", F_I32, mig_capable, 1),
    NUM("power_limit_mw", F_U32, power_limit_mw, 1),
    NUM("max_sm_clock_mhz", F_U32, max_sm_clock_mhz, 1),
    NUM("max_mem_clock_mhz", F_U32, max_mem_clock_mhz, 1),
    NUM("memory_bus_width", F_U32, memory_bus_width, 1),
    {"nvlink", F_LINKS, 0, 0, 1},
};
#define NFIELDS (sizeof(kGpuFields) / sizeof(kGpuFields[0]))

static const struct {
    const char *name;
    int code; /* nvmlBrandType_t */
} kBrands[] = {
    {"unknown", 0}, {"quadro", 1}, {"tesla", 2},  {"nvs", 3},          {"grid", 4},
    {"geforce", 5}, {"titan", 6},  {"quadro_rtx", 12}, {"nvidia_rtx", 13}, {"nvidia", 14},
};

static const struct {
    const char *name;
    int code;
} kArchs[] = {
    {"kepler", SIM_ARCH_KEPLER}, {"maxwell", SIM_ARCH_MAXWELL}, {"pascal", SIM_ARCH_PASCAL},
    {"volta", SIM_ARCH_VOLTA},   {"turing", SIM_ARCH_TURING},   {"ampere", SIM_ARCH_AMPERE},
    {"ada", SIM_ARCH_ADA},       {"hopper", SIM_ARCH_HOPPER},   {"blackwell", SIM_ARCH_BLACKWELL},
};

static int parse_u64(const char *v, int base, unsigned long long max, unsigned long long *out)
{
    char *end;
    if (*v == '\0' || *v == '-')
        return -1;
    errno = 0;
    unsigned long long x = strtoull(v, &end, base);
    if (errno || *end != '\0' || x > max)
        return -1;
    *out = x;
    return 0;
}

static int parse_i32(const char *v, int32_t *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || errno || *end != '\0' || x < -2147483647L - 1 || x > 2147483647L)
        return -1;
    *out = (int32_t)x;
    return 0;
}

static int parse_links(const char *v, struct sim_gpu_info *g)
{
    g->nlinks = 0;
    while (*v) {
        char *end;
        long peer = strtol(v, &end, 10);
        if (end == v || *end != ':')
            return -1;
        v = end + 1;
        long count = strtol(v, &end, 10);
        if (end == v || count <= 0 || peer < 0 || peer >= SIM_MAX_GPUS)
            return -1;
        if (g->nlinks >= SIM_MAX_LINKS)
            return -1;
        g->links[g->nlinks].peer = (int32_t)peer;
        g->links[g->nlinks].count = (int32_t)count;
        g->nlinks++;
        v = end;
        if (*v == ',')
            v++;
        else if (*v != '\0')
            return -1;
    }
    int total = 0;
    for (int i = 0; i < g->nlinks; i++)
        total += g->links[i].count;
    return total <= SIM_MAX_LINKS ? 0 : -1;
}

/* Apply one gpu.<i>.<field> value; returns the field index or -1 (unknown), -2 (bad value). */
static int set_gpu_field(struct sim_gpu_info *g, const char *key, const char *v)
{
    for (size_t i = 0; i < NFIELDS; i++) {
        const struct field *f = &kGpuFields[i];
        if (strcmp(f->key, key) != 0)
            continue;
        char *dst = (char *)g + f->offset;
        unsigned long long u;
        switch (f->kind) {
        case F_STR:
            if (*v == '\0' || strlen(v) >= f->size)
                return -2;
            memcpy(dst, v, strlen(v) + 1);
            break;
        case F_I32:
            if (parse_i32(v, (int32_t *)(void *)dst))
                return -2;
            break;
        case F_U32:
            if (parse_u64(v, 10, 0xffffffffULL, &u))
                return -2;
            *(uint32_t *)(void *)dst = (uint32_t)u;
            break;
        case F_U64:
            if (parse_u64(v, 10, ~0ULL, &u))
                return -2;
            *(uint64_t *)(void *)dst = u;
            break;
        case F_HEX32:
            if (parse_u64(v, 16, 0xffffffffULL, &u))
                return -2;
            *(uint32_t *)(void *)dst = (uint32_t)u;
            break;
        case F_CC: {
            int maj, min, n = 0;
            if (sscanf(v, "%d.%d%n", &maj, &min, &n) != 2 || v[n] != '\0' || maj <= 0 || min < 0)
                return -2;
            g->cc_major = maj;
            g->cc_minor = min;
            break;
        }
        case F_BRAND: {
            size_t b;
            for (b = 0; b < sizeof(kBrands) / sizeof(kBrands[0]); b++)
                if (strcasecmp(kBrands[b].name, v) == 0)
                    break;
            if (b == sizeof(kBrands) / sizeof(kBrands[0]) || strlen(v) >= sizeof(g->brand))
                return -2;
            memcpy(g->brand, v, strlen(v) + 1);
            g->brand_code = kBrands[b].code;
            break;
        }
        case F_ARCH: {
            size_t a;
            for (a = 0; a < sizeof(kArchs) / sizeof(kArchs[0]); a++)
                if (strcasecmp(kArchs[a].name, v) == 0)
                    break;
            if (a == sizeof(kArchs) / sizeof(kArchs[0]))
                return -2;
            g->arch = kArchs[a].code;
            break;
        }
        case F_LINKS:
            if (parse_links(v, g))
                return -2;
            break;
        }
        return (int)i;
    }
    return -1;
}

int sim_profile_parse(const char *text, struct sim_node_info *node, struct sim_gpu_info *gpus,
                      char *err, unsigned long errlen)
{
    /* seen[gpu] is a bitmask of the fields set, to report the first missing one. */
    unsigned long long seen[SIM_MAX_GPUS] = {0};
    int have_name = 0, have_driver = 0, have_cuda = 0;
    memset(node, 0, sizeof(*node));
    memset(gpus, 0, sizeof(*gpus) * SIM_MAX_GPUS);
    node->gpu_count = -1;
    for (int i = 0; i < SIM_MAX_GPUS; i++) {
        gpus[i].numa_node = -1;
        gpus[i].cores_per_sm = 128;
        gpus[i].power_limit_mw = 300000;
        gpus[i].max_sm_clock_mhz = 1980;
        gpus[i].max_mem_clock_mhz = 2619;
        gpus[i].memory_bus_width = 5120;
    }

    int lineno = 0;
    const char *p = text;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[512];
        lineno++;
        if (len >= sizeof(line)) {
            snprintf(err, errlen, "line %d: longer than %zu bytes", lineno, sizeof(line) - 1);
            return -1;
        }
        memcpy(line, p, len);
        line[len] = '\0';
        p += len + (eol ? 1 : 0);
        if (len && line[len - 1] == '\r')
            line[--len] = '\0';
        if (line[0] == '\0' || line[0] == '#')
            continue;
        char *eq = strchr(line, '=');
        if (!eq) {
            snprintf(err, errlen, "line %d: expected key=value, got '%s'", lineno, line);
            return -1;
        }
        *eq = '\0';
        const char *key = line, *val = eq + 1;
        int bad = 0;
        if (strcmp(key, "node.name") == 0) {
            bad = *val == '\0' || strlen(val) >= sizeof(node->name);
            if (!bad)
                memcpy(node->name, val, strlen(val) + 1);
            have_name = 1;
        } else if (strcmp(key, "node.driver_version") == 0) {
            bad = *val == '\0' || strlen(val) >= sizeof(node->driver_version);
            if (!bad)
                memcpy(node->driver_version, val, strlen(val) + 1);
            have_driver = 1;
        } else if (strcmp(key, "node.cuda_driver_version") == 0) {
            bad = parse_i32(val, &node->cuda_driver_version) || node->cuda_driver_version <= 0;
            have_cuda = 1;
        } else if (strcmp(key, "gpu.count") == 0) {
            bad = parse_i32(val, &node->gpu_count) || node->gpu_count < 0 ||
                  node->gpu_count > SIM_MAX_GPUS;
        } else if (strncmp(key, "gpu.", 4) == 0) {
            char *end;
            long idx = strtol(key + 4, &end, 10);
            if (end == key + 4 || *end != '.' || idx < 0 || idx >= SIM_MAX_GPUS) {
                snprintf(err, errlen, "line %d: bad GPU index in key '%s' (0..%d)", lineno, key,
                         SIM_MAX_GPUS - 1);
                return -1;
            }
            int r = set_gpu_field(&gpus[idx], end + 1, val);
            if (r == -1) {
                snprintf(err, errlen, "line %d: unknown key '%s'", lineno, key);
                return -1;
            }
            bad = r < 0;
            if (!bad)
                seen[idx] |= 1ULL << r;
        } else {
            snprintf(err, errlen, "line %d: unknown key '%s'", lineno, key);
            return -1;
        }
        if (bad) {
            snprintf(err, errlen, "line %d: invalid value '%s' for key '%s'", lineno, val, key);
            return -1;
        }
    }
    if (!have_name || !have_driver || !have_cuda || node->gpu_count < 0) {
        snprintf(err, errlen, "missing key '%s'",
                 !have_name     ? "node.name"
                 : !have_driver ? "node.driver_version"
                 : !have_cuda   ? "node.cuda_driver_version"
                                : "gpu.count");
        return -1;
    }
    for (int i = 0; i < SIM_MAX_GPUS; i++) {
        if (i >= node->gpu_count) {
            if (seen[i]) {
                snprintf(err, errlen, "keys for gpu.%d but gpu.count=%d", i, node->gpu_count);
                return -1;
            }
            continue;
        }
        for (size_t f = 0; f < NFIELDS; f++) {
            if (!kGpuFields[f].optional && !(seen[i] & (1ULL << f))) {
                snprintf(err, errlen, "missing key 'gpu.%d.%s'", i, kGpuFields[f].key);
                return -1;
            }
        }
        for (int l = 0; l < gpus[i].nlinks; l++) {
            int peer = gpus[i].links[l].peer;
            if (peer >= node->gpu_count || peer == i) {
                snprintf(err, errlen, "gpu.%d.nvlink: peer %d is not another GPU of this node", i,
                         peer);
                return -1;
            }
        }
    }
    return 0;
}
