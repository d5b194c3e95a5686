/* moneta_example: the libmoneta C API in one page.
 *
 *   moneta_example embedded:PRESET   a device of PRESET inside this process
 *   moneta_example SOCKET            a monetad (`moneta serve --socket SOCKET`)
 *
 * Build (from the workspace root, after `cargo build --release -p libmoneta`):
 *   gcc -O2 -Wall -Wextra -Werror -I include examples/c/moneta_example.c \
 *       -L target/release -lmoneta -Wl,-rpath,$PWD/target/release \
 *       -o target/moneta_example
 * or `make -C examples/c run`.
 *
 * Prints "ok" and exits 0 when every check passes; otherwise says what
 * failed and exits 1.
 */
#include <moneta.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB (1024u * 1024u)
#define BATCH 16          /* requests per asynchronous batch */
#define IO_BYTES 4096     /* bytes per asynchronous request */
#define BATCH_BASE MIB    /* where the batch goes on the device */

/* Mixed into the data so that a second run against the same daemon cannot
 * pass by reading back what the first run wrote. */
static uint64_t seed;

/* The byte expected at device address `addr`: every address gets its own
 * value, so data landing at the wrong offset is caught too. */
static unsigned char pattern(uint64_t addr)
{
    return (unsigned char)(((addr ^ seed) * 0x9E3779B97F4A7C15ull) >> 56);
}

static void fill(unsigned char *buf, uint64_t addr, size_t len)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = pattern(addr + i);
}

/* 0 if `buf` holds the pattern of [addr, addr + len), else 1 (and says where). */
static int check(const unsigned char *buf, uint64_t addr, size_t len, const char *what)
{
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != pattern(addr + i)) {
            fprintf(stderr, "moneta_example: %s: byte at %llu is %u, expected %u\n", what,
                    (unsigned long long)(addr + i), buf[i], pattern(addr + i));
            return 1;
        }
    }
    return 0;
}

static int fail(const char *what)
{
    fprintf(stderr, "moneta_example: %s: %s\n", what, moneta_last_error());
    return 1;
}

static uint64_t batch_addr(int i)
{
    return BATCH_BASE + (uint64_t)i * IO_BYTES;
}

/* Synchronous IO: any size, any alignment. */
static int sync_round_trip(moneta_t *m)
{
    enum { ADDR = 1000, LEN = 3000 };
    unsigned char out[LEN], in[LEN];

    fill(out, ADDR, LEN);
    if (moneta_write(m, ADDR, out, LEN) != 0)
        return fail("moneta_write");
    if (moneta_read(m, ADDR, in, LEN) != 0)
        return fail("moneta_read");
    if (memcmp(in, out, LEN) != 0)
        return check(in, ADDR, LEN, "synchronous read-back");
    printf("sync: wrote and read back %d B at %d\n", LEN, ADDR);
    return 0;
}

/* Asynchronous writes: prepare all, fill each request's DMA slice in place
 * (no copy), submit all, then wait for all. */
static int async_writes(moneta_t *m)
{
    moneta_io_t *io[BATCH] = {0};
    int rc = 0, submitted = 0;

    for (int i = 0; i < BATCH && rc == 0; i++) {
        io[i] = moneta_prepare(m, MONETA_WRITE, batch_addr(i), IO_BYTES, MONETA_DMA);
        unsigned char *buf = io[i] ? moneta_io_buffer(m, io[i]) : NULL;
        if (buf == NULL)
            rc = fail("moneta_prepare (write)");
        else
            fill(buf, batch_addr(i), IO_BYTES);
    }
    while (rc == 0 && submitted < BATCH) {
        if (moneta_submit(m, io[submitted]) != 0)
            rc = fail("moneta_submit (write)");
        else
            submitted++;
    }
    /* Wait even after a failure: a submitted request's slice belongs to the
     * device until the request completes. */
    for (int i = 0; i < submitted; i++)
        if (moneta_wait(m, io[i]) != 0 && rc == 0)
            rc = fail("moneta_wait (write)");
    for (int i = 0; i < BATCH; i++)
        moneta_release(m, io[i]); /* NULL is ignored */
    if (rc == 0)
        printf("async: %d writes of %d B (DMA completion)\n", BATCH, IO_BYTES);
    return rc;
}

/* Asynchronous reads of the same range, completed by interrupt (forwarded,
 * or issue-sleep), polled round-robin: moneta_poll never blocks, whatever
 * the mode; moneta_wait would sleep for MONETA_ISSUE_SLEEP. */
static int async_reads(moneta_t *m)
{
    moneta_io_t *io[BATCH] = {0};
    int done[BATCH] = {0};
    int rc = 0, submitted = 0;

    for (int i = 0; i < BATCH && rc == 0; i++) {
        int mode = i % 2 ? MONETA_ISSUE_SLEEP : MONETA_FORWARDING;
        io[i] = moneta_prepare(m, MONETA_READ, batch_addr(i), IO_BYTES, mode);
        if (io[i] == NULL)
            rc = fail("moneta_prepare (read)");
    }
    while (rc == 0 && submitted < BATCH) {
        if (moneta_submit(m, io[submitted]) != 0)
            rc = fail("moneta_submit (read)");
        else
            submitted++;
    }
    for (int pending = submitted; pending > 0;) {
        for (int i = 0; i < submitted; i++) {
            if (done[i])
                continue;
            int state = moneta_poll(m, io[i]);
            if (state == 0)
                continue;
            done[i] = 1;
            pending--;
            if (state < 0) {
                if (rc == 0)
                    rc = fail("moneta_poll (read)");
            } else if (rc == 0) {
                rc = check(moneta_io_buffer(m, io[i]), batch_addr(i), IO_BYTES,
                           "asynchronous read");
            }
        }
    }
    for (int i = 0; i < BATCH; i++)
        moneta_release(m, io[i]);
    if (rc == 0)
        printf("async: %d reads of %d B (forwarding and issue-sleep), data verified\n",
               BATCH, IO_BYTES);
    return rc;
}

/* Errors come back as -1, with the reason in moneta_last_error(). */
static int refused_read(moneta_t *m)
{
    unsigned char buf[512];
    uint64_t end = moneta_capacity(m);

    if (moneta_read(m, end, buf, sizeof buf) != -1) {
        fprintf(stderr, "moneta_example: a read at the device's end (%llu) succeeded\n",
                (unsigned long long)end);
        return 1;
    }
    if (moneta_last_error()[0] == '\0') {
        fprintf(stderr, "moneta_example: a refused read left no error message\n");
        return 1;
    }
    printf("expected error: %s\n", moneta_last_error());
    return 0;
}

int main(int argc, char **argv)
{
    static const char embedded[] = "embedded:";
    moneta_t *m;

    if (argc != 2) {
        fprintf(stderr, "usage: %s embedded:PRESET | SOCKET\n", argv[0]);
        return 2;
    }
    seed = (uint64_t)getpid();
    if (strncmp(argv[1], embedded, strlen(embedded)) == 0) {
        /* An embedded device grants this process all of itself. */
        m = moneta_embedded(argv[1] + strlen(embedded));
        if (m == NULL)
            return fail("moneta_embedded");
    } else {
        /* A daemon grants raw ranges on request, to its owner only. */
        m = moneta_connect(argv[1]);
        if (m == NULL)
            return fail("moneta_connect");
        if (moneta_grant_raw(m, 0, 64 * MIB, 1) != 0) {
            int rc = fail("moneta_grant_raw");
            moneta_close(m);
            return rc;
        }
    }
    printf("device: %llu bytes\n", (unsigned long long)moneta_capacity(m));

    int rc = sync_round_trip(m);
    if (rc == 0)
        rc = async_writes(m);
    if (rc == 0)
        rc = async_reads(m);
    if (rc == 0)
        rc = refused_read(m);
    moneta_close(m);
    if (rc == 0)
        printf("ok\n");
    return rc;
}
