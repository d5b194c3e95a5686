// SPDX-License-Identifier: GPL-2.0
/*
 * Block frees of watched file systems, as the file systems report them
 * (issue 20; SPEC §3.4: the OS tells the device which blocks left a file).
 *
 * Two tracepoint programs copy every free on a watched device into one ring
 * buffer: xfs:xfs_free_extent (allocation group, block, length) and
 * ext4:ext4_free_blocks (inode, block, count). They run in the freeing
 * thread, before the transaction that frees the blocks commits, so a free
 * is in the ring before the blocks can be allocated again; monetad's device
 * takes no command while the ring holds a free it has not applied
 * (crates/moneta-emu/src/free_watch.rs).
 *
 * The argument layouts are those of /sys/kernel/tracing/events/.../format
 * on Linux 6.x; free_watch.rs checks them against the running kernel's
 * format files before it loads these programs.
 */
#include <linux/bpf.h>
#include <linux/types.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) __typeof__(val) *name

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static void *(*bpf_ringbuf_reserve)(void *ringbuf, __u64 size, __u64 flags) = (void *)BPF_FUNC_ringbuf_reserve;
static void (*bpf_ringbuf_submit)(void *data, __u64 flags) = (void *)BPF_FUNC_ringbuf_submit;

char LICENSE[] SEC("license") = "GPL";

#define WATCHED_DEVS 8

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, WATCHED_DEVS);
	__type(key, __u32);
	__type(value, __u32);
} DEVS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} FREES SEC(".maps");

struct free_event {
	__u32 kind;
	__u32 dev;
	__u64 ino;
	__u64 group;
	__u64 block;
	__u64 count;
};

static __attribute__((always_inline)) int watched(__u32 dev)
{
#pragma clang loop unroll(full)
	for (__u32 i = 0; i < WATCHED_DEVS; i++) {
		__u32 key = i;
		__u32 *d = bpf_map_lookup_elem(&DEVS, &key);
		if (d && *d == dev && dev != 0)
			return 1;
	}
	return 0;
}

static __attribute__((always_inline)) void emit(__u32 kind, __u32 dev, __u64 ino, __u64 group, __u64 block, __u64 count)
{
	struct free_event *e;
	if (!watched(dev))
		return;
	e = bpf_ringbuf_reserve(&FREES, sizeof(*e), 0);
	if (!e)
		return;
	e->kind = kind;
	e->dev = dev;
	e->ino = ino;
	e->group = group;
	e->block = block;
	e->count = count;
	bpf_ringbuf_submit(e, 0);
}

/* /sys/kernel/tracing/events/xfs/xfs_free_extent/format */
struct xfs_free_extent_args {
	__u64 common;
	__u32 dev;
	__u32 agno;
	__u32 agbno;
	__u32 len;
};

SEC("tracepoint/xfs/xfs_free_extent")
int xfs_free_extent(struct xfs_free_extent_args *a)
{
	emit(1, a->dev, 0, a->agno, a->agbno, a->len);
	return 0;
}

/* /sys/kernel/tracing/events/ext4/ext4_free_blocks/format */
struct ext4_free_blocks_args {
	__u64 common;
	__u32 dev;
	__u32 pad;
	__u64 ino;
	__u64 block;
	__u64 count;
};

SEC("tracepoint/ext4/ext4_free_blocks")
int ext4_free_blocks(struct ext4_free_blocks_args *a)
{
	emit(2, a->dev, a->ino, 0, a->block, a->count);
	return 0;
}
