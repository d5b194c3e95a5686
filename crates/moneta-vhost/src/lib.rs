//! # moneta-vhost
//!
//! A vhost-user-blk backend for the emulated Moneta (issue 44): a guest
//! kernel under QEMU sees the device as a virtio-blk disk (`/dev/vda`),
//! and each of its requests runs on a channel of the device model, timed
//! as every other client's.
//!
//! - [`blk`]: virtio-blk requests, every descriptor chain checked and
//!   bounded (VIRTIO 1.2 §5.2).
//! - [`backend`]: the vhost-user side (rust-vmm's vhost-user-backend) and
//!   the channel the requests run on.
//! - [`guest`]: the kernel (Debian's package) and the initramfs (busybox,
//!   fio, xfsprogs from the host's packages), cached.
//! - [`qemu`]: one boot under QEMU (KVM or TCG), its console and exit code,
//!   every wait bounded.
//! - [`vm`]: all of it for one command.

pub mod backend;
pub mod blk;
pub mod guest;
pub mod qemu;
pub mod vm;

pub use backend::{BlkBackend, ChannelTarget, Stats, StatsSnapshot, VhostServer};
