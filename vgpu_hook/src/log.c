/*
 * log.c - leveled log lines on stderr, level from VGPU_LOG_LEVEL (error|warn|info|debug).
 *
 * Uses write(2) on a stack buffer rather than stdio so that logging never interleaves with or
 * flushes the host application's own stdio buffers, and works inside fork children.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vgpu.h"

static _Atomic int g_level = -1;

static int parse_level(const char *s) {
    if (s == NULL || *s == '\0') return VGPU_LOG_WARN;
    if (strcmp(s, "error") == 0) return VGPU_LOG_ERROR;
    if (strcmp(s, "warn") == 0 || strcmp(s, "warning") == 0) return VGPU_LOG_WARN;
    if (strcmp(s, "info") == 0) return VGPU_LOG_INFO;
    if (strcmp(s, "debug") == 0) return VGPU_LOG_DEBUG;
    return VGPU_LOG_WARN;
}

int vgpu_log_level(void) {
    int level = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (level < 0) {
        level = parse_level(getenv("VGPU_LOG_LEVEL"));
        atomic_store_explicit(&g_level, level, memory_order_relaxed);
    }
    return level;
}

void vgpu_log_write(int level, const char *file, int line, const char *fmt, ...) {
    static const char *const names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    int saved_errno = errno;
    char buf[1024];
    const char *base = strrchr(file, '/');
    int n = snprintf(buf, sizeof buf, "[vgpu %d] %s %s:%d: ", (int)getpid(),
                     names[level & 3], base ? base + 1 : file, line);
    if (n < 0) n = 0;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2) len = sizeof buf - 2;
    buf[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
    errno = saved_errno;
}
