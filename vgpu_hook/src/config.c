/*
 * config.c - parser for vgpu.conf, the file the kubelet plugin writes at prepare.
 *
 * Pure: text in, struct out, no I/O besides log lines, so it is unit-tested without a GPU
 * (tests/test_config.c). Grammar (line based, '#' comments):
 *   version 1
 *   claim <claimUID>
 *   device uuid=<GPU-uuid> memory=<bytes> cores=<0..100> policy=<fixed|balance|none>
 *          oversubscribe=<0|1>
 * Failure policy (documented in docs/vgpu-hook.md):
 *   - a device line without a usable uuid is dropped (error): the hook cannot know which GPU
 *     it is, so that GPU runs uncapped by this line;
 *   - a missing or unparsable memory value fails closed: the device allows no allocation;
 *   - an unparsable cores/policy/oversubscribe value falls back to "no compute cap" /
 *     "fixed" / "0" with an error (compute overuse only slows neighbours, never breaks them);
 *   - unknown keys and directives are ignored with a warning (forward compatibility);
 *   - a version newer than 1 is parsed best-effort with a warning.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "vgpu.h"

int vgpu_config_parse_size(const char *token, uint64_t *out) {
    if (token == NULL || !isdigit((unsigned char)token[0])) return -1;
    errno = 0;
    char *end = NULL;
    unsigned long long value = strtoull(token, &end, 10);
    if (errno != 0) return -1;
    unsigned long long mult = 1;
    if (strcmp(end, "") == 0) mult = 1;
    else if (strcmp(end, "Ki") == 0) mult = 1ULL << 10;
    else if (strcmp(end, "Mi") == 0) mult = 1ULL << 20;
    else if (strcmp(end, "Gi") == 0) mult = 1ULL << 30;
    else if (strcmp(end, "Ti") == 0) mult = 1ULL << 40;
    else return -1;
    if (value > UINT64_MAX / mult) return -1;
    *out = value * mult;
    return 0;
}

static int parse_uint(const char *token, unsigned long max, unsigned long *out) {
    if (token == NULL || !isdigit((unsigned char)token[0])) return -1;
    errno = 0;
    char *end = NULL;
    unsigned long value = strtoul(token, &end, 10);
    if (errno != 0 || *end != '\0' || value > max) return -1;
    *out = value;
    return 0;
}

static bool valid_uuid(const char *s) {
    size_t n = strlen(s);
    if (n < 5 || n >= VGPU_UUID_LEN) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(isalnum(c) || c == '-' || c == '_' || c == ':' || c == '.')) return false;
    }
    return true;
}

/* Parse one `device` line's key=value tokens into dev. Returns false when the line is unusable. */
static bool parse_device(char *rest, const char *source, int lineno, struct vgpu_device_conf *dev,
                         struct vgpu_claim_conf *out) {
    memset(dev, 0, sizeof *dev);
    dev->policy = VGPU_POLICY_FIXED;
    bool have_memory = false;
    char *save = NULL;
    for (char *tok = strtok_r(rest, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        char *eq = strchr(tok, '=');
        if (eq == NULL) {
            LOG_WARN("%s:%d: ignoring token '%s' (expected key=value)", source, lineno, tok);
            out->warnings++;
            continue;
        }
        *eq = '\0';
        const char *key = tok, *val = eq + 1;
        unsigned long num = 0;
        if (strcmp(key, "uuid") == 0) {
            if (!valid_uuid(val)) {
                LOG_ERROR("%s:%d: device uuid '%s' is not a GPU UUID; line ignored", source,
                          lineno, val);
                return false;
            }
            snprintf(dev->uuid, sizeof dev->uuid, "%s", val);
        } else if (strcmp(key, "memory") == 0) {
            if (vgpu_config_parse_size(val, &dev->memory) != 0) {
                LOG_ERROR("%s:%d: memory='%s' is not a byte count; allocations on this device "
                          "are refused until the configuration is fixed", source, lineno, val);
                out->errors++;
                dev->memory_invalid = true;
            } else {
                have_memory = true;
            }
        } else if (strcmp(key, "cores") == 0) {
            if (parse_uint(val, 100, &num) != 0) {
                LOG_ERROR("%s:%d: cores='%s' is not 0..100; no compute cap applied", source,
                          lineno, val);
                out->errors++;
                num = 0;
            }
            dev->cores = (uint32_t)num;
        } else if (strcmp(key, "policy") == 0) {
            if (strcmp(val, "fixed") == 0) dev->policy = VGPU_POLICY_FIXED;
            else if (strcmp(val, "balance") == 0) dev->policy = VGPU_POLICY_BALANCE;
            else if (strcmp(val, "none") == 0) dev->policy = VGPU_POLICY_NONE;
            else {
                LOG_ERROR("%s:%d: policy='%s' is not fixed|balance|none; using fixed", source,
                          lineno, val);
                out->errors++;
            }
        } else if (strcmp(key, "oversubscribe") == 0) {
            if (strcmp(val, "1") == 0 || strcmp(val, "0") == 0) dev->oversubscribe = val[0] == '1';
            else {
                LOG_ERROR("%s:%d: oversubscribe='%s' is not 0|1; using 0", source, lineno, val);
                out->errors++;
            }
        } else {
            LOG_WARN("%s:%d: ignoring unknown device key '%s'", source, lineno, key);
            out->warnings++;
        }
    }
    if (dev->uuid[0] == '\0') {
        LOG_ERROR("%s:%d: device line without uuid=; line ignored", source, lineno);
        return false;
    }
    if (!have_memory && !dev->memory_invalid) {
        LOG_ERROR("%s:%d: device %s has no memory=; allocations on it are refused", source,
                  lineno, dev->uuid);
        out->errors++;
        dev->memory_invalid = true;
    }
    return true;
}

int vgpu_config_parse(const char *text, const char *source, struct vgpu_claim_conf *out) {
    memset(out, 0, sizeof *out);
    if (text == NULL) return -1;
    size_t len = strlen(text);
    char *copy = malloc(len + 1);
    if (copy == NULL) return -1;
    memcpy(copy, text, len + 1);
    int lineno = 0;
    /* strtok_r on "\n" would skip empty lines and lose line numbers: split by hand. */
    char *cursor = copy;
    while (cursor != NULL) {
        char *line = cursor;
        char *nl = strchr(cursor, '\n');
        if (nl) {
            *nl = '\0';
            cursor = nl + 1;
        } else {
            cursor = NULL;
        }
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        size_t l = strlen(line);
        while (l > 0 && isspace((unsigned char)line[l - 1])) line[--l] = '\0';
        while (isspace((unsigned char)*line)) line++;
        if (*line == '\0') continue;
        char *rest = NULL;
        char *word = strtok_r(line, " \t", &rest);
        if (word == NULL) continue;
        if (strcmp(word, "version") == 0) {
            unsigned long v = 0;
            char *val = strtok_r(NULL, " \t", &rest);
            if (parse_uint(val, 1000000, &v) != 0) {
                LOG_ERROR("%s:%d: version '%s' is not a number", source, lineno,
                          val ? val : "");
                out->errors++;
            } else {
                out->version = (int)v;
                if (v > 1) {
                    LOG_WARN("%s:%d: version %lu is newer than this hook (1); parsing "
                             "best-effort", source, lineno, v);
                    out->warnings++;
                }
            }
        } else if (strcmp(word, "claim") == 0) {
            char *val = strtok_r(NULL, " \t", &rest);
            snprintf(out->claim, sizeof out->claim, "%s", val ? val : "");
        } else if (strcmp(word, "device") == 0) {
            if (out->device_count >= VGPU_MAX_DEVICES) {
                LOG_ERROR("%s:%d: more than %d devices; line ignored", source, lineno,
                          VGPU_MAX_DEVICES);
                out->errors++;
                continue;
            }
            struct vgpu_device_conf dev;
            if (parse_device(rest, source, lineno, &dev, out)) {
                bool dup = false;
                for (int i = 0; i < out->device_count; i++)
                    if (strcasecmp(out->devices[i].uuid, dev.uuid) == 0) dup = true;
                if (dup) {
                    LOG_ERROR("%s:%d: device %s listed twice; second line ignored", source,
                              lineno, dev.uuid);
                    out->errors++;
                } else {
                    out->devices[out->device_count++] = dev;
                }
            } else {
                out->errors++;
            }
        } else {
            LOG_WARN("%s:%d: ignoring unknown directive '%s'", source, lineno, word);
            out->warnings++;
        }
    }
    free(copy);
    if (out->version == 0) {
        LOG_WARN("%s: no 'version' line; assuming version 1", source);
        out->version = 1;
        out->warnings++;
    }
    return 0;
}
