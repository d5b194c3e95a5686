/* libnvmm: a journaled, DRAM-cached flash main memory for real programs
 * (SPEC §7). nvmm_open maps a region far larger than its DRAM budget; the
 * resident 8 KB blocks are the DRAM cache, the file at `path` (on any file
 * system) is the flash, kept log-structured. Loads and stores to the region
 * are plain memory accesses; misses are served by userfaultfd.
 *
 * Calls return 0 / a non-NULL pointer / a non-zero token on success and
 * -1 / NULL / 0 on failure; nvmm_last_error() says why (per thread; the
 * text stays valid until the next failing call on that thread).
 *
 * Flash timing: misses and syncs complete when the flash says. By default
 * a fixed latency (0: the library's own cost; nvmm_options_t sets others);
 * with NVMM_TIMING=<preset> in the environment (nvmm-mlc, nvmm-slc, ...;
 * `moneta nvmm presets`), the NVMM model's flash subsystem: ONFI channels,
 * FTL and die queues, planes, the same component `moneta nvmm sim` runs.
 *
 * Link with -lnvmm (target/release/libnvmm.so).
 */
#ifndef NVMM_H
#define NVMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Nvmm nvmm_t;

/* Pages are 64 KB (8 segments of one 8 KB flash page each). */
#define NVMM_PAGE_BYTES 65536
#define NVMM_FLASH_PAGE_BYTES 8192

/* Page permissions (nvmm_setperms). A store to a page without
 * NVMM_PERM_WRITE is a SIGSEGV; NVMM_PERM_TEMPORARY pages are collected
 * when the application ends (nvmm_close, or the next open after a crash). */
#define NVMM_PERM_READ 0x10
#define NVMM_PERM_WRITE 0x20
#define NVMM_PERM_TEMPORARY 0x40

typedef struct nvmm_options {
    uint32_t ways;             /* cache associativity; 0 = fully associative (default 16) */
    uint32_t prefetch_blocks;  /* blocks read ahead after a miss (0..64) */
    uint64_t read_latency_ns;  /* fixed flash read time added to a miss (ignored under NVMM_TIMING) */
    uint64_t program_latency_ns; /* flash program time a sync waits for */
    int direct_io;             /* O_DIRECT on the backing file (never on tmpfs) */
} nvmm_options_t;

const char *nvmm_last_error(void);

/* Map a region of `size` bytes (rounded up to 64 KB; 0 = the size the file
 * was created with) over the log at `path` (created if missing), caching at
 * most `dram_bytes` of it. One process at a time may open a file. */
nvmm_t *nvmm_open(const char *path, uint64_t size, uint64_t dram_bytes);
nvmm_t *nvmm_open_ex(const char *path, uint64_t size, uint64_t dram_bytes,
                     const nvmm_options_t *opts);

void *nvmm_base(nvmm_t *n);
uint64_t nvmm_size(nvmm_t *n);

/* Flush every dirty block to the log and commit. Returns the token (a
 * Lamport time, ≥ 1) naming this state, or 0 on failure. */
uint64_t nvmm_sync(nvmm_t *n);
/* Restore the region as it was at `token` (0 = the empty region),
 * discarding everything since, including unsynced stores; commits that as a
 * new token, which it returns (0 on failure: unknown, rolled-back or
 * garbage-collected token). */
uint64_t nvmm_rollback(nvmm_t *n, uint64_t token);
/* The last committed token (after open: the last completed sync). */
uint64_t nvmm_last_token(nvmm_t *n);

/* A never-allocated (or deleted) page, zero-filled, or NULL if none. */
void *nvmm_alloc(nvmm_t *n);
/* Delete the page holding `page` at once: it reads as zero afterwards
 * (older tokens still hold its data until garbage-collected). */
int nvmm_delete(nvmm_t *n, const void *page);
int nvmm_setperms(nvmm_t *n, const void *page, int perms);

/* Collect temporary pages, sync, unmap and free the handle (freed even on
 * failure). Returns the final token or 0. Exiting without nvmm_close is a
 * crash: the next open sees the last completed sync. */
uint64_t nvmm_close(nvmm_t *n);

#ifdef __cplusplus
}
#endif

#endif /* NVMM_H */
