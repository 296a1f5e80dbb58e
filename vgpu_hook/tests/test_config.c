/*
 * test_config.c - proves the vgpu.conf parser:
 *  1. a well-formed file yields every device with its exact memory/cores/policy/oversubscribe;
 *  2. byte suffixes Ki/Mi/Gi are accepted, junk and overflow are rejected;
 *  3. unknown keys and directives are ignored with a warning (forward compatibility);
 *  4. a bad memory value fails closed (memory_invalid), a bad cores value means no cap;
 *  5. a device line without uuid, or a duplicate uuid, is dropped and counted as an error;
 *  6. comments, blank lines, CRLF-free whitespace and a missing version are tolerated;
 *  7. more than VGPU_MAX_DEVICES lines never overflow the table.
 */
#include <string.h>

#include "check.h"
#include "vgpu.h"

static void test_well_formed(void) {
    const char *text =
        "# vgpu-dra hook configuration\n"
        "version 1\n"
        "claim 1111-2222\n"
        "device uuid=GPU-aaaa-0001 memory=1073741824 cores=30 policy=fixed oversubscribe=0\n"
        "device uuid=GPU-aaaa-0002 memory=2Gi cores=0 policy=balance oversubscribe=1\n"
        "device uuid=GPU-aaaa-0003 memory=512Mi cores=100 policy=none oversubscribe=0\n";
    struct vgpu_claim_conf c;
    CHECK(vgpu_config_parse(text, "t1", &c) == 0);
    CHECK(c.version == 1);
    CHECK(strcmp(c.claim, "1111-2222") == 0);
    CHECK(c.device_count == 3);
    CHECK(c.errors == 0 && c.warnings == 0);
    CHECK(strcmp(c.devices[0].uuid, "GPU-aaaa-0001") == 0);
    CHECK_EQ_U64(c.devices[0].memory, 1073741824ULL);
    CHECK(c.devices[0].cores == 30 && c.devices[0].policy == VGPU_POLICY_FIXED);
    CHECK(!c.devices[0].oversubscribe && !c.devices[0].memory_invalid);
    CHECK_EQ_U64(c.devices[1].memory, 2ULL << 30);
    CHECK(c.devices[1].policy == VGPU_POLICY_BALANCE && c.devices[1].oversubscribe);
    CHECK_EQ_U64(c.devices[2].memory, 512ULL << 20);
    CHECK(c.devices[2].policy == VGPU_POLICY_NONE && c.devices[2].cores == 100);
}

static void test_sizes(void) {
    uint64_t v = 0;
    CHECK(vgpu_config_parse_size("0", &v) == 0 && v == 0);
    CHECK(vgpu_config_parse_size("3Ki", &v) == 0 && v == 3072);
    CHECK(vgpu_config_parse_size("1Ti", &v) == 0 && v == 1ULL << 40);
    CHECK(vgpu_config_parse_size("-1", &v) != 0);
    CHECK(vgpu_config_parse_size("12GB", &v) != 0);
    CHECK(vgpu_config_parse_size("abc", &v) != 0);
    CHECK(vgpu_config_parse_size("", &v) != 0);
    CHECK(vgpu_config_parse_size(NULL, &v) != 0);
    CHECK(vgpu_config_parse_size("99999999999999999999", &v) != 0);
    CHECK(vgpu_config_parse_size("17179869184Gi", &v) != 0); /* 2^34 Gi overflows */
}

static void test_unknown_ignored(void) {
    const char *text = "version 1\nfuture-directive x y\n"
                       "device uuid=GPU-b memory=100 cores=10 newkey=1 policy=fixed\n";
    struct vgpu_claim_conf c;
    CHECK(vgpu_config_parse(text, "t3", &c) == 0);
    CHECK(c.device_count == 1);
    CHECK(c.warnings == 2);
    CHECK(c.errors == 0);
    CHECK_EQ_U64(c.devices[0].memory, 100);
}

static void test_bad_values(void) {
    const char *text = "version 1\n"
                       "device uuid=GPU-c memory=lots cores=10\n"
                       "device uuid=GPU-d memory=100 cores=150 policy=turbo oversubscribe=yes\n"
                       "device uuid=GPU-e cores=5\n";
    struct vgpu_claim_conf c;
    CHECK(vgpu_config_parse(text, "t4", &c) == 0);
    CHECK(c.device_count == 3);
    CHECK(c.devices[0].memory_invalid); /* fail closed */
    CHECK(c.devices[0].cores == 10);
    CHECK(!c.devices[1].memory_invalid && c.devices[1].cores == 0); /* no compute cap */
    CHECK(c.devices[1].policy == VGPU_POLICY_FIXED && !c.devices[1].oversubscribe);
    CHECK(c.devices[2].memory_invalid); /* missing memory also fails closed */
    CHECK(c.errors == 5);
}

static void test_dropped_lines(void) {
    const char *text = "version 1\n"
                       "device memory=100\n"
                       "device uuid=bad/uuid memory=100\n"
                       "device uuid=GPU-f memory=100\n"
                       "device uuid=gpu-F memory=200\n";
    struct vgpu_claim_conf c;
    CHECK(vgpu_config_parse(text, "t5", &c) == 0);
    CHECK(c.device_count == 1);
    CHECK_EQ_U64(c.devices[0].memory, 100);
    CHECK(c.errors == 3);
}

static void test_tolerance(void) {
    const char *text = "\n   # only a comment\n\n  device   uuid=GPU-g\tmemory=7  # trailing\n";
    struct vgpu_claim_conf c;
    CHECK(vgpu_config_parse(text, "t6", &c) == 0);
    CHECK(c.version == 1); /* assumed */
    CHECK(c.device_count == 1);
    CHECK_EQ_U64(c.devices[0].memory, 7);
    CHECK(c.devices[0].policy == VGPU_POLICY_FIXED); /* default policy */
    struct vgpu_claim_conf e;
    CHECK(vgpu_config_parse("", "empty", &e) == 0 && e.device_count == 0);
    CHECK(vgpu_config_parse(NULL, "null", &e) == -1);
}

static void test_too_many(void) {
    char text[8192] = "version 1\n";
    for (int i = 0; i < VGPU_MAX_DEVICES + 4; i++) {
        char line[128];
        snprintf(line, sizeof line, "device uuid=GPU-%04d memory=%d\n", i, i + 1);
        strcat(text, line);
    }
    struct vgpu_claim_conf c;
    CHECK(vgpu_config_parse(text, "t7", &c) == 0);
    CHECK(c.device_count == VGPU_MAX_DEVICES);
    CHECK(c.errors == 4);
    CHECK_EQ_U64(c.devices[VGPU_MAX_DEVICES - 1].memory, VGPU_MAX_DEVICES);
}

int main(void) {
    test_well_formed();
    test_sizes();
    test_unknown_ignored();
    test_bad_values();
    test_dropped_lines();
    test_tolerance();
    test_too_many();
    CHECK_DONE();
}
