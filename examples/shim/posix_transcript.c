/* A transcript of POSIX file calls on files in DIR: every call's result and
 * a checksum of the data read, one line each. Run once through the Moneta
 * shim and once through the kernel on the same mount; the transcripts must
 * be identical (crates/moneta-cli/tests/programs.rs). Covers the calls the
 * shim interposes: open/openat/creat, read/write, pread/pwrite,
 * readv/writev/preadv/pwritev, lseek (SET/CUR/END), dup/dup2/dup3,
 * fcntl(F_DUPFD, F_GETFL, F_SETFL O_APPEND), O_APPEND writes, ftruncate,
 * fallocate, fsync/fdatasync, holes and writes past the end, threads and
 * fork. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[4096];

static uint64_t sum(const unsigned char *p, ssize_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (ssize_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 9));
}

#define SAY(...) (printf(__VA_ARGS__), fflush(stdout))

static const char *path(const char *name) {
    static char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static void show_read(const char *what, int fd, size_t n) {
    unsigned char *b = malloc(n);
    ssize_t r = read(fd, b, n);
    SAY("%s read %zd %016llx\n", what, r, (unsigned long long)sum(b, r > 0 ? r : 0));
    free(b);
}

struct job { int fd; unsigned seed; };

static void *worker(void *arg) {
    struct job *j = arg;
    unsigned char b[4096];
    for (int i = 0; i < 200; i++) {
        fill(b, sizeof b, j->seed + i);
        off_t at = (off_t)((j->seed * 200 + i) % 256) * 4096;
        if (pwrite(j->fd, b, sizeof b, at) != (ssize_t)sizeof b) return (void *)1;
        unsigned char c[4096];
        if (pread(j->fd, c, sizeof c, at) != (ssize_t)sizeof c) return (void *)2;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: posix_transcript DIR\n"); return 2; }
    snprintf(dir, sizeof dir, "%s", argv[1]);
    unsigned char buf[65536], back[65536];

    /* open, write, lseek, read, offsets. */
    int fd = open(path("a"), O_RDWR | O_CREAT | O_TRUNC, 0644);
    SAY("open %d\n", fd >= 0);
    fill(buf, 10000, 1);
    SAY("write %zd\n", write(fd, buf, 10000));
    /* A file being created is the kernel's until its first fsync (and what
       it wrote stays on the kernel path for that open file): reopened,
       the shim serves it directly. */
    SAY("fsync %d\n", fsync(fd));
    close(fd);
    fd = open(path("a"), O_RDWR);
    SAY("reopen %d\n", fd >= 0);
    SAY("lseek cur %lld\n", (long long)lseek(fd, 0, SEEK_CUR));
    SAY("lseek set %lld\n", (long long)lseek(fd, 1000, SEEK_SET));
    show_read("after set", fd, 3000);
    SAY("lseek cur %lld\n", (long long)lseek(fd, -500, SEEK_CUR));
    show_read("after cur", fd, 100000);
    show_read("at end", fd, 10);
    SAY("lseek end %lld\n", (long long)lseek(fd, -10, SEEK_END));
    show_read("tail", fd, 100);
    SAY("lseek bad %lld\n", (long long)lseek(fd, -1, SEEK_SET));

    /* pread/pwrite leave the offset alone; unaligned and past the end. */
    fill(buf, 777, 2);
    SAY("pwrite %zd\n", pwrite(fd, buf, 777, 4097));
    SAY("pread %zd\n", pread(fd, back, 777, 4097));
    SAY("pread same %d\n", memcmp(buf, back, 777) == 0);
    SAY("offset kept %lld\n", (long long)lseek(fd, 0, SEEK_CUR));
    SAY("pwrite far %zd\n", pwrite(fd, buf, 777, 3 * 1048576 + 123));
    struct stat st;
    fstat(fd, &st);
    SAY("size %lld\n", (long long)st.st_size);
    SAY("pread hole %zd %016llx\n", pread(fd, back, 4096, 2 * 1048576),
        (unsigned long long)sum(back, 4096));

    /* dup shares the offset; dup2 and dup3 alias; the original can close. */
    lseek(fd, 100, SEEK_SET);
    int d = dup(fd);
    show_read("dup", d, 50);
    SAY("shared offset %lld\n", (long long)lseek(fd, 0, SEEK_CUR));
    int d2 = dup2(fd, 40);
    SAY("dup2 %d\n", d2);
    int d3 = dup3(fd, 41, O_CLOEXEC);
    SAY("dup3 %d\n", d3);
    int d4 = fcntl(fd, F_DUPFD, 50);
    SAY("F_DUPFD %d\n", d4 >= 50);
    close(fd);
    SAY("after close pread %zd\n", pread(d2, back, 100, 0));
    SAY("same data %d\n", memcmp(back, back, 100) == 0);

    /* readv / writev / preadv / pwritev. */
    struct iovec iov[3];
    fill(buf, 3000, 3);
    iov[0] = (struct iovec){buf, 1000};
    iov[1] = (struct iovec){buf + 1000, 1};
    iov[2] = (struct iovec){buf + 1001, 1999};
    lseek(d, 5000, SEEK_SET);
    SAY("writev %zd\n", writev(d, iov, 3));
    SAY("offset %lld\n", (long long)lseek(d, 0, SEEK_CUR));
    memset(back, 0, 3000);
    iov[0] = (struct iovec){back, 10};
    iov[1] = (struct iovec){back + 10, 2990};
    SAY("preadv %zd same %d\n", preadv(d, iov, 2, 5000), memcmp(buf, back, 3000) == 0);
    SAY("pwritev %zd\n", pwritev(d, iov, 2, 20000));
    lseek(d, 19990, SEEK_SET);
    iov[0] = (struct iovec){back, 20};
    iov[1] = (struct iovec){back + 20, 40000};
    SAY("readv %zd %016llx\n", readv(d, iov, 2), (unsigned long long)sum(back, 3010));

    /* fcntl flags and O_APPEND writes (through the kernel). */
    int fl = fcntl(d, F_GETFL);
    SAY("getfl rdwr %d\n", (fl & O_ACCMODE) == O_RDWR);
    SAY("setfl append %d\n", fcntl(d, F_SETFL, fl | O_APPEND));
    fill(buf, 333, 4);
    SAY("append %zd\n", write(d, buf, 333));
    fstat(d, &st);
    SAY("size after append %lld\n", (long long)st.st_size);
    SAY("offset after append %lld\n", (long long)lseek(d, 0, SEEK_CUR));
    SAY("pread appended %zd same %d\n", pread(d, back, 333, st.st_size - 333),
        memcmp(buf, back, 333) == 0);
    fcntl(d, F_SETFL, fl);

    /* ftruncate, fallocate, fsync, fdatasync. */
    SAY("ftruncate %d\n", ftruncate(d, 6000));
    fstat(d, &st);
    SAY("size %lld\n", (long long)st.st_size);
    SAY("pread past end %zd\n", pread(d, back, 100, 7000));
    SAY("ftruncate grow %d\n", ftruncate(d, 200000));
    SAY("pread grown %zd %016llx\n", pread(d, back, 1000, 100000),
        (unsigned long long)sum(back, 1000));
    SAY("fallocate %d\n", fallocate(d, 0, 300000, 65536));
    fill(buf, 65536, 5);
    SAY("pwrite allocated %zd\n", pwrite(d, buf, 65536, 300000));
    SAY("pread allocated same %d\n",
        pread(d, back, 65536, 300000) == 65536 && memcmp(buf, back, 65536) == 0);
    SAY("fsync %d fdatasync %d\n", fsync(d), fdatasync(d));
    close(d);
    close(d2);
    close(d3);
    close(d4);

    /* creat, openat, O_RDONLY, threads sharing a descriptor. */
    int c = creat(path("b"), 0644);
    fill(buf, 4096, 6);
    SAY("creat write %zd\n", write(c, buf, 4096));
    close(c);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    int r = openat(dfd, "b", O_RDONLY);
    show_read("openat", r, 8192);
    SAY("write read-only %zd\n", write(r, buf, 10));
    close(r);
    close(dfd);
    int t = open(path("c"), O_RDWR | O_CREAT | O_TRUNC, 0644);
    ftruncate(t, 256 * 4096);
    pthread_t th[4];
    struct job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (struct job){t, (unsigned)i};
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        void *rv;
        pthread_join(th[i], &rv);
        bad |= rv != NULL;
    }
    SAY("threads ok %d\n", !bad);

    /* fork: the child uses an inherited descriptor and its own. */
    pid_t pid = fork();
    if (pid == 0) {
        fill(buf, 4096, 7);
        int ok = pwrite(t, buf, 4096, 0) == 4096;
        int f = open(path("d"), O_RDWR | O_CREAT | O_TRUNC, 0644);
        ok &= write(f, buf, 4096) == 4096 && fsync(f) == 0;
        close(f);
        fsync(t);
        _exit(ok ? 0 : 1);
    }
    int status;
    waitpid(pid, &status, 0);
    SAY("child ok %d\n", WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fill(buf, 4096, 7);
    SAY("parent sees child's write %d\n",
        pread(t, back, 4096, 0) == 4096 && memcmp(buf, back, 4096) == 0);
    int f = open(path("d"), O_RDONLY);
    show_read("child's file", f, 8192);
    close(f);
    close(t);
    return 0;
}
