/* libmoneta: user-space access to an emulated Moneta-D array (C ABI).
 *
 * A handle is one channel: to a monetad (`moneta serve --socket PATH`) or to a
 * device embedded in this process. Calls return 0 (or a non-NULL pointer) on
 * success and -1 (or NULL) on failure; moneta_last_error() tells why (per
 * thread). A handle may be used from several threads at once; an individual
 * moneta_io_t belongs to one thread at a time.
 *
 * Link with -lmoneta (target/release/libmoneta.so).
 */
#ifndef MONETA_H
#define MONETA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Moneta moneta_t;
typedef struct Io moneta_io_t;

enum moneta_op { MONETA_READ = 0, MONETA_WRITE = 1 };

/* How a request's completion is noticed (SPEC §3.5). */
enum moneta_completion {
    MONETA_DMA = 0,         /* spin on the tag's status word */
    MONETA_FORWARDING = 1,  /* the kernel role forwards the interrupt; spin */
    MONETA_ISSUE_SLEEP = 2  /* sleep until the forwarded interrupt */
};

/* Why the last failing call on this thread failed. The text stays valid
 * until the next failing call on the same thread; copy it to keep it. */
const char *moneta_last_error(void);

moneta_t *moneta_connect(const char *socket_path);
/* A device of the named preset ("null", "onyx-late", ...) in this process,
 * on anonymous memory, the whole device granted read-write. */
moneta_t *moneta_embedded(const char *preset);
/* Wait for (and release) every request first: requests still in flight when
 * the handle closes are abandoned, their moneta_io_t leaked. */
void moneta_close(moneta_t *m);

uint64_t moneta_capacity(moneta_t *m);
/* Ask for a raw device range (the daemon's owner only). */
int moneta_grant_raw(moneta_t *m, uint64_t start, uint64_t len, int write);

/* Synchronous IO of any size and alignment (DMA completion). */
int moneta_read(moneta_t *m, uint64_t addr, void *buf, size_t len);
int moneta_write(moneta_t *m, uint64_t addr, const void *buf, size_t len);

/* Asynchronous IO: prepare (reserves tags), fill/read the zero-copy buffer,
 * submit, poll or wait, release. len ≤ 1 MiB; a request takes one tag per
 * 16 KiB of length, of the channel's 64. moneta_prepare never waits: it
 * returns NULL ("all tags are busy") when no run of free tags is left;
 * complete and release a request, then retry. */
moneta_io_t *moneta_prepare(moneta_t *m, int op, uint64_t addr, size_t len, int completion);
void *moneta_io_buffer(moneta_t *m, moneta_io_t *io);
int moneta_submit(moneta_t *m, moneta_io_t *io);
/* 1 done, 0 in flight, -1 failed. */
int moneta_poll(moneta_t *m, moneta_io_t *io);
int moneta_wait(moneta_t *m, moneta_io_t *io);
/* Only after the request finished (poll returned 1 or -1, or wait returned):
 * releasing a request in flight hands its buffer back while the device may
 * still be using it. */
void moneta_release(moneta_t *m, moneta_io_t *io);

/* Files on the Moneta file system (or the device's block device). The
 * caller opens the file with open(2) (the kernel checks its right to it;
 * the daemon checks the descriptor) and keeps it open until
 * moneta_file_close. O_RDONLY allows reads, O_WRONLY writes, O_RDWR both. */
typedef struct MonetaFile moneta_file_t;
typedef struct FileIo moneta_file_io_t;

moneta_file_t *moneta_file_open(moneta_t *m, int fd);
/* Drops the kernel's stale cached pages (read(2) then sees direct writes),
 * revokes the grant, frees f. Release every request of f first. */
int moneta_file_close(moneta_t *m, moneta_file_t *f);
/* Like pread/pwrite (bytes, or -1): growth, holes and data the device
 * does not serve go through the kernel. */
int64_t moneta_file_pread(moneta_t *m, moneta_file_t *f, void *buf, size_t len, uint64_t offset);
int64_t moneta_file_pwrite(moneta_t *m, moneta_file_t *f, const void *buf, size_t len,
                           uint64_t offset);
/* Makes direct writes the file system's data: growth grants (direct writes
 * into preallocated extents) are settled by monetad, stale cached pages
 * dropped. fsync(2) the descriptor afterwards, as for a kernel write. */
int moneta_file_sync(moneta_t *m, moneta_file_t *f);

/* Asynchronous file IO: one device request when the translation map sends
 * the whole range to the device. *status: 0 a request (returned), 1 no
 * free run of tags (complete and release one, retry), 2 not one device
 * request (growth, a hole, several extents, the kernel's data: use
 * moneta_file_pread/pwrite), -1 error. A request revoked or remapped while
 * in flight is done again synchronously inside moneta_file_poll. */
moneta_file_io_t *moneta_file_prepare(moneta_t *m, moneta_file_t *f, int op, uint64_t offset,
                                      size_t len, int completion, int *status);
void *moneta_file_io_buffer(moneta_t *m, moneta_file_io_t *io);
int moneta_file_submit(moneta_t *m, moneta_file_t *f, moneta_file_io_t *io);
/* 1 done, 0 in flight, -1 failed. */
int moneta_file_poll(moneta_t *m, moneta_file_t *f, moneta_file_io_t *io);
void moneta_file_release(moneta_t *m, moneta_file_io_t *io);

#ifdef __cplusplus
}
#endif

#endif /* MONETA_H */
