/* A fio ioengine for Moneta-D's user-space channel (SPEC §3.2-§3.5,
 * dissertation §4.4.4's asynchronous interface), on libmoneta's C ABI
 * (include/moneta.h).
 *
 *   fio --ioengine=external:target/release/libmoneta_fio.so \
 *       --moneta_socket=/run/moneta/<name>/monetad.sock --filename=/mnt/moneta/f ...
 *
 * Files (the default): fio opens each file with open(2), so the kernel
 * checks the caller's right to it; the engine passes the descriptor to
 * the daemon (moneta_file_open), which checks it again, and the device
 * enforces the grant. A request the file's translation map sends to the
 * device whole is one asynchronous device request on the channel's tags
 * (moneta_file_prepare/submit/poll); anything else (growth, holes,
 * unwritten extents, several extents, data the device does not serve)
 * is served synchronously by libmoneta's file path, after the requests in
 * flight finished, so the kernel never rewrites a page a direct write is
 * changing.
 *
 * The raw device (--moneta_raw=1): offsets are device addresses, the
 * channel asks for a raw grant of the whole device (the daemon's owner
 * only), and --filename is not opened: it must name an existing file or
 * device (fio would otherwise create it), e.g. /dev/null.
 *
 * Queue depth: a request takes one tag per 16 KiB of its length, of the
 * channel's 64; a job whose --iodepth cannot fit (iodepth x tags per
 * largest request > 64) fails at init with a message saying the limit.
 * fio's verify works as with any engine (the data goes through the
 * device both ways).
 *
 * Built against the installed fio's own headers (Makefile: the Debian
 * source of the same version); FIO_IOOPS_VERSION is fio's check. */

#include "fio.h"
#include "optgroup.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moneta.h"

#define CHANNEL_TAGS 64u
#define SLICE_BYTES (16u << 10)
#define MAX_REQUEST (1u << 20)

struct mfio_options {
	void *pad; /* fio's convention: the first member */
	char *socket;
	unsigned int raw;
	char *completion;
};

static struct fio_option options[] = {
	{
		.name = "moneta_socket",
		.lname = "monetad socket",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct mfio_options, socket),
		.help = "monetad's socket (default: $MONETA_SOCKET)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "moneta_raw",
		.lname = "raw device",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct mfio_options, raw),
		.help = "Offsets are device addresses (a raw grant; the daemon's owner only)",
		.def = "0",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "moneta_completion",
		.lname = "completion",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct mfio_options, completion),
		.help = "How completions are noticed: dma (default), forwarding, sleep",
		.def = "dma",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = NULL,
	},
};

/* One request fio gave the engine. */
struct mfio_req {
	struct io_u *io_u;
	moneta_io_t *raw;       /* raw mode */
	moneta_file_io_t *file; /* file mode */
	moneta_file_t *mf;
};

struct mfio_data {
	moneta_t *m;
	int raw;
	int completion;
	/* Requests in flight, and finished ones not yet returned. */
	struct mfio_req *flight;
	unsigned int in_flight;
	struct io_u **done;
	unsigned int nr_done;
	/* What getevents returned, for event(). */
	struct io_u **events;
	unsigned int depth;
};

static void fail(struct thread_data *td, const char *what)
{
	log_err("moneta: %s: %s\n", what, moneta_last_error());
	td_vmsg(td, EIO, moneta_last_error(), what);
}

static int completion_mode(const char *s)
{
	if (!s || !strcmp(s, "dma"))
		return MONETA_DMA;
	if (!strcmp(s, "forwarding"))
		return MONETA_FORWARDING;
	if (!strcmp(s, "sleep"))
		return MONETA_ISSUE_SLEEP;
	return -1;
}

static int mfio_init(struct thread_data *td)
{
	struct mfio_options *o = td->eo;
	const char *socket = o->socket ? o->socket : getenv("MONETA_SOCKET");
	unsigned long long max_bs = td_max_bs(td);
	unsigned int tags = (max_bs + SLICE_BYTES - 1) / SLICE_BYTES;
	struct mfio_data *d;

	if (!socket || !*socket) {
		log_err("moneta: no socket: --moneta_socket=PATH or MONETA_SOCKET\n");
		return 1;
	}
	if (completion_mode(o->completion) < 0) {
		log_err("moneta: --moneta_completion=%s: dma, forwarding or sleep\n", o->completion);
		return 1;
	}
	if (max_bs == 0 || max_bs > MAX_REQUEST) {
		log_err("moneta: block size %llu: a request is 1 byte to 1 MiB\n", max_bs);
		return 1;
	}
	if ((unsigned long long)td->o.iodepth * tags > CHANNEL_TAGS) {
		log_err("moneta: --iodepth=%u does not fit the channel: a %llu-byte request takes %u "
			"of its %u tags (one per 16 KiB), so at most --iodepth=%u\n",
			td->o.iodepth, max_bs, tags, CHANNEL_TAGS, CHANNEL_TAGS / tags);
		return 1;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return 1;
	d->depth = td->o.iodepth;
	d->raw = o->raw;
	d->completion = completion_mode(o->completion);
	d->flight = calloc(d->depth, sizeof(*d->flight));
	d->done = calloc(d->depth, sizeof(*d->done));
	d->events = calloc(d->depth, sizeof(*d->events));
	d->m = moneta_connect(socket);
	if (!d->flight || !d->done || !d->events || !d->m) {
		if (!d->m)
			log_err("moneta: connect to %s: %s\n", socket, moneta_last_error());
		moneta_close(d->m);
		free(d->flight);
		free(d->done);
		free(d->events);
		free(d);
		return 1;
	}
	if (d->raw && moneta_grant_raw(d->m, 0, moneta_capacity(d->m), td_write(td)) < 0) {
		log_err("moneta: raw grant of the device: %s\n", moneta_last_error());
		moneta_close(d->m);
		free(d->flight);
		free(d->done);
		free(d->events);
		free(d);
		return 1;
	}
	td->io_ops_data = d;
	return 0;
}

/* Finish request i of the flight list: copy a read's data out, release
 * its tags, hand the io_u to the done list. */
static void finish(struct mfio_data *d, unsigned int i, int ok)
{
	struct mfio_req *r = &d->flight[i];
	struct io_u *io_u = r->io_u;

	if (ok && io_u->ddir == DDIR_READ) {
		void *buf = r->raw ? moneta_io_buffer(d->m, r->raw)
				   : moneta_file_io_buffer(d->m, r->file);
		if (buf)
			memcpy(io_u->xfer_buf, buf, io_u->xfer_buflen);
		else
			ok = 0;
	}
	if (!ok) {
		log_err("moneta: %s of %llu bytes at %llu: %s\n",
			io_u->ddir == DDIR_READ ? "read" : "write", io_u->xfer_buflen,
			io_u->offset, moneta_last_error());
		io_u->error = EIO;
	} else {
		io_u->resid = 0;
		io_u->error = 0;
	}
	if (r->raw)
		moneta_release(d->m, r->raw);
	else
		moneta_file_release(d->m, r->file);
	d->done[d->nr_done++] = io_u;
	d->flight[i] = d->flight[--d->in_flight];
}

/* Poll every request in flight once: how many finished. */
static unsigned int reap(struct mfio_data *d)
{
	unsigned int i = 0, n = 0;

	while (i < d->in_flight) {
		struct mfio_req *r = &d->flight[i];
		int s = r->raw ? moneta_poll(d->m, r->raw) : moneta_file_poll(d->m, r->mf, r->file);

		if (s == 0) {
			i++;
			continue;
		}
		finish(d, i, s == 1);
		n++;
	}
	return n;
}

static void drain(struct mfio_data *d)
{
	while (d->in_flight)
		reap(d);
}

/* A request libmoneta serves synchronously (raw: never; files: growth,
 * holes, several extents, the kernel's data). */
static enum fio_q_status synchronous(struct thread_data *td, struct mfio_data *d,
				     moneta_file_t *mf, struct io_u *io_u)
{
	int64_t n;

	drain(d);
	if (io_u->ddir == DDIR_READ)
		n = moneta_file_pread(d->m, mf, io_u->xfer_buf, io_u->xfer_buflen, io_u->offset);
	else
		n = moneta_file_pwrite(d->m, mf, io_u->xfer_buf, io_u->xfer_buflen, io_u->offset);
	if (n < 0) {
		log_err("moneta: synchronous %s at %llu: %s\n",
			io_u->ddir == DDIR_READ ? "read" : "write", io_u->offset,
			moneta_last_error());
		io_u->error = EIO;
	} else {
		io_u->resid = io_u->xfer_buflen - n;
		io_u->error = 0;
	}
	(void)td;
	return FIO_Q_COMPLETED;
}

static enum fio_q_status mfio_queue(struct thread_data *td, struct io_u *io_u)
{
	struct mfio_data *d = td->io_ops_data;
	moneta_file_t *mf = FILE_ENG_DATA(io_u->file);
	int op = io_u->ddir == DDIR_READ ? MONETA_READ : MONETA_WRITE;
	struct mfio_req r = { .io_u = io_u, .mf = mf };
	void *buf;
	int status = 0;

	fio_ro_check(td, io_u);

	if (ddir_sync(io_u->ddir)) {
		/* Direct writes into written extents are on the medium once
		 * complete; growth grants (direct writes into preallocated,
		 * unwritten extents) become the file system's data when
		 * monetad settles them, which moneta_file_sync asks for; then
		 * the kernel's fsync makes that, and what libmoneta wrote
		 * through the kernel, durable. */
		drain(d);
		if (!d->raw && moneta_file_sync(d->m, mf) < 0)
			io_u->error = EIO;
		else if (!d->raw && fsync(io_u->file->fd) < 0)
			io_u->error = errno;
		return FIO_Q_COMPLETED;
	}
	if (io_u->ddir != DDIR_READ && io_u->ddir != DDIR_WRITE) {
		io_u->error = EOPNOTSUPP;
		return FIO_Q_COMPLETED;
	}
	if (d->in_flight == d->depth)
		return FIO_Q_BUSY;

	if (d->raw) {
		r.raw = moneta_prepare(d->m, op, io_u->offset, io_u->xfer_buflen, d->completion);
		status = r.raw ? 0 : -1;
		if (!r.raw && !strncmp(moneta_last_error(), "all tags are busy", 17))
			status = 1;
	} else {
		r.file = moneta_file_prepare(d->m, mf, op, io_u->offset, io_u->xfer_buflen,
					     d->completion, &status);
	}
	switch (status) {
	case 0:
		break;
	case 1: /* tags busy: only while others are in flight */
		if (d->in_flight)
			return FIO_Q_BUSY;
		/* fallthrough */
	case 2:
		if (!d->raw)
			return synchronous(td, d, mf, io_u);
		/* fallthrough */
	default:
		log_err("moneta: prepare at %llu: %s\n", io_u->offset, moneta_last_error());
		io_u->error = EIO;
		return FIO_Q_COMPLETED;
	}
	if (op == MONETA_WRITE) {
		buf = r.raw ? moneta_io_buffer(d->m, r.raw) : moneta_file_io_buffer(d->m, r.file);
		if (!buf)
			goto failed;
		memcpy(buf, io_u->xfer_buf, io_u->xfer_buflen);
	}
	if ((r.raw ? moneta_submit(d->m, r.raw) : moneta_file_submit(d->m, mf, r.file)) < 0)
		goto failed;
	d->flight[d->in_flight++] = r;
	return FIO_Q_QUEUED;

failed:
	log_err("moneta: submit at %llu: %s\n", io_u->offset, moneta_last_error());
	if (r.raw)
		moneta_release(d->m, r.raw);
	else
		moneta_file_release(d->m, r.file);
	io_u->error = EIO;
	return FIO_Q_COMPLETED;
}

static int mfio_getevents(struct thread_data *td, unsigned int min, unsigned int max,
			  const struct timespec *t)
{
	struct mfio_data *d = td->io_ops_data;
	unsigned int n = 0;

	(void)t;
	for (;;) {
		while (d->nr_done && n < max) {
			d->events[n++] = d->done[0];
			memmove(d->done, d->done + 1, --d->nr_done * sizeof(*d->done));
		}
		if (n >= min || n >= max || (!d->in_flight && !d->nr_done))
			return n;
		reap(d);
	}
}

static struct io_u *mfio_event(struct thread_data *td, int event)
{
	struct mfio_data *d = td->io_ops_data;

	return d->events[event];
}

static int mfio_open_file(struct thread_data *td, struct fio_file *f)
{
	struct mfio_data *d = td->io_ops_data;
	moneta_file_t *mf;

	if (d->raw)
		return 0;
	if (generic_open_file(td, f))
		return 1;
	mf = moneta_file_open(d->m, f->fd);
	if (!mf) {
		log_err("moneta: %s: the daemon does not serve it: %s\n", f->file_name,
			moneta_last_error());
		td_vmsg(td, EACCES, moneta_last_error(), "moneta_file_open");
		if (generic_close_file(td, f))
			log_err("moneta: closing %s failed\n", f->file_name);
		return 1;
	}
	FILE_SET_ENG_DATA(f, mf);
	return 0;
}

static int mfio_close_file(struct thread_data *td, struct fio_file *f)
{
	struct mfio_data *d = td->io_ops_data;
	moneta_file_t *mf = FILE_ENG_DATA(f);
	int ret = 0;

	if (d->raw)
		return 0;
	drain(d);
	if (mf && moneta_file_close(d->m, mf) < 0) {
		fail(td, "moneta_file_close");
		ret = 1;
	}
	FILE_SET_ENG_DATA(f, NULL);
	if (generic_close_file(td, f))
		ret = 1;
	return ret;
}

static int mfio_get_file_size(struct thread_data *td, struct fio_file *f)
{
	struct mfio_data *d = td->io_ops_data;
	struct mfio_options *o = td->eo;

	if (!o->raw)
		return generic_get_file_size(td, f);
	if (!d) {
		/* Before init: fio sizes files first; ask the device. */
		const char *socket = o->socket ? o->socket : getenv("MONETA_SOCKET");
		moneta_t *m = socket ? moneta_connect(socket) : NULL;

		if (!m) {
			log_err("moneta: connect to %s: %s\n", socket ? socket : "(no socket)",
				moneta_last_error());
			return 1;
		}
		f->real_file_size = moneta_capacity(m);
		moneta_close(m);
	} else {
		f->real_file_size = moneta_capacity(d->m);
	}
	fio_file_set_size_known(f);
	return 0;
}

static int mfio_invalidate(struct thread_data *td, struct fio_file *f)
{
	/* No cache between fio and the device on the direct path. */
	(void)td;
	(void)f;
	return 0;
}

static void mfio_cleanup(struct thread_data *td)
{
	struct mfio_data *d = td->io_ops_data;

	if (!d)
		return;
	drain(d);
	moneta_close(d->m);
	free(d->flight);
	free(d->done);
	free(d->events);
	free(d);
	td->io_ops_data = NULL;
}

struct ioengine_ops ioengine = {
	.name = "moneta",
	.version = FIO_IOOPS_VERSION,
	.flags = FIO_NODISKUTIL,
	.init = mfio_init,
	.queue = mfio_queue,
	.getevents = mfio_getevents,
	.event = mfio_event,
	.cleanup = mfio_cleanup,
	.open_file = mfio_open_file,
	.close_file = mfio_close_file,
	.get_file_size = mfio_get_file_size,
	.invalidate = mfio_invalidate,
	.options = options,
	.option_struct_size = sizeof(struct mfio_options),
};
