/* GUPS (random read-modify-write updates) and MMAP-style random reads over
 * a table far larger than DRAM, on libnvmm or on plain mmap(2) of a file
 * (SPEC §7 evaluation; issue 13 item 3). Run it under a memory limit (the
 * benchmark puts it in a cgroup) to compare the two.
 *
 *   gups nvmm|mmap|mmap-random FILE TABLE_BYTES DRAM_BYTES OPS SEED gups|randread
 *
 * The table is initialized (word i = i) and made durable (nvmm_sync /
 * msync), then OPS random operations are timed, then made durable again
 * (timed separately). Prints one line of key=value results, including a
 * checksum that is equal across modes for equal arguments. DRAM_BYTES is
 * libnvmm's cache budget; mmap is bounded by the cgroup alone. */
#include <fcntl.h>
#include <nvmm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: %s nvmm|mmap|mmap-random FILE TABLE_BYTES DRAM_BYTES OPS SEED gups|randread\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1], *path = argv[2], *kind = argv[7];
    uint64_t table_bytes = strtoull(argv[3], 0, 0), dram = strtoull(argv[4], 0, 0);
    uint64_t ops = strtoull(argv[5], 0, 0), seed = strtoull(argv[6], 0, 0);
    int use_nvmm = strcmp(mode, "nvmm") == 0;
    int gups = strcmp(kind, "gups") == 0;
    uint64_t *t;
    nvmm_t *n = NULL;
    int fd = -1;
    if (use_nvmm) {
        n = nvmm_open(path, table_bytes, dram);
        if (!n) {
            fprintf(stderr, "nvmm_open: %s\n", nvmm_last_error());
            return 1;
        }
        t = nvmm_base(n);
    } else {
        fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)table_bytes) != 0) {
            perror("open/ftruncate");
            return 1;
        }
        t = mmap(NULL, table_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (t == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        if (strcmp(mode, "mmap-random") == 0) madvise(t, table_bytes, MADV_RANDOM);
    }
    uint64_t words = table_bytes / 8;
    double t0 = now();
    for (uint64_t i = 0; i < words; i++) t[i] = i;
    if (use_nvmm ? nvmm_sync(n) == 0 : msync(t, table_bytes, MS_SYNC) != 0) {
        fprintf(stderr, "initial sync failed\n");
        return 1;
    }
    double t1 = now();
    uint64_t s = seed, sum = 0;
    for (uint64_t i = 0; i < ops; i++) {
        uint64_t r = splitmix(&s);
        uint64_t *w = &t[(r >> 3) % words];
        if (gups)
            *w ^= r;
        else
            sum += *w;
    }
    double t2 = now();
    if (gups && (use_nvmm ? nvmm_sync(n) == 0 : msync(t, table_bytes, MS_SYNC) != 0)) {
        fprintf(stderr, "final sync failed\n");
        return 1;
    }
    double t3 = now();
    /* Checksum: the updated words (gups) or the sum read (randread). */
    if (gups) {
        s = seed;
        for (uint64_t i = 0; i < ops && i < 2000; i++) sum ^= t[(splitmix(&s) >> 3) % words];
    }
    printf("program=c mode=%s kind=%s table_bytes=%llu dram_bytes=%llu ops=%llu init_s=%.4f ops_s=%.4f sync_s=%.4f ops_per_s=%.0f checksum=%llu\n",
           mode, kind, (unsigned long long)table_bytes, (unsigned long long)dram, (unsigned long long)ops,
           t1 - t0, t2 - t1, t3 - t2, ops / (t3 - t1), (unsigned long long)sum);
    if (use_nvmm)
        nvmm_close(n);
    else {
        munmap(t, table_bytes);
        close(fd);
    }
    return 0;
}
