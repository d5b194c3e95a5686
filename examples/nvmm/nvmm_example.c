/* libnvmm from C: a region 8x its DRAM budget, stores across it, sync,
 * more stores, rollback, and the data checked after a reopen.
 * Usage: nvmm_example FILE   (the file is created; remove it afterwards) */
#include <nvmm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REGION (8u << 20)
#define DRAM (1u << 20)

static int fail(const char *what) {
    fprintf(stderr, "%s: %s\n", what, nvmm_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE\n", argv[0]);
        return 2;
    }
    nvmm_t *n = nvmm_open(argv[1], REGION, DRAM);
    if (!n) return fail("nvmm_open");
    uint64_t *words = nvmm_base(n);
    size_t count = nvmm_size(n) / sizeof(uint64_t) / 2; /* the other half stays unallocated */

    for (size_t i = 0; i < count; i += 512) words[i] = i * 3 + 1;
    uint64_t t1 = nvmm_sync(n);
    if (!t1) return fail("nvmm_sync");
    for (size_t i = 0; i < count; i += 512) words[i] = 0xdead;
    if (!nvmm_rollback(n, t1)) return fail("nvmm_rollback");
    for (size_t i = 0; i < count; i += 512)
        if (words[i] != i * 3 + 1) {
            fprintf(stderr, "word %zu is %llu after rollback\n", i, (unsigned long long)words[i]);
            return 1;
        }

    char *page = nvmm_alloc(n);
    if (!page) return fail("nvmm_alloc");
    strcpy(page, "hello, flash");
    if (nvmm_setperms(n, page, NVMM_PERM_READ) != 0) return fail("nvmm_setperms");
    if (nvmm_delete(n, (char *)words - 1) == 0) {
        fprintf(stderr, "nvmm_delete outside the region succeeded\n");
        return 1;
    }
    size_t page_off = (size_t)(page - (char *)words);
    if (!nvmm_close(n)) return fail("nvmm_close");

    n = nvmm_open(argv[1], 0, DRAM);
    if (!n) return fail("nvmm_open (again)");
    words = nvmm_base(n);
    for (size_t i = 0; i < count; i += 512)
        if (words[i] != i * 3 + 1) {
            fprintf(stderr, "word %zu is %llu after reopen\n", i, (unsigned long long)words[i]);
            return 1;
        }
    if (strcmp((char *)words + page_off, "hello, flash") != 0) {
        fprintf(stderr, "the allocated page lost its text\n");
        return 1;
    }
    printf("token %llu, %llu bytes over %u bytes of DRAM\n",
           (unsigned long long)nvmm_last_token(n), (unsigned long long)nvmm_size(n), DRAM);
    nvmm_close(n);
    printf("ok\n");
    return 0;
}
