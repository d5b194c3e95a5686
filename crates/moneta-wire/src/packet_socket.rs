//! Raw Ethernet frames through an AF_PACKET socket (issue 12 item 1; SPEC
//! §4.2: "raw frames, custom low-level protocol").
//!
//! One SOCK_RAW packet socket bound to one interface. A classic BPF filter
//! passes only frames of QuickSAN's EtherType (0x8870 by default,
//! configurable) and 802.3x MAC control frames (0x8808, the pause frames);
//! PACKET_IGNORE_OUTGOING keeps this host's own frames out. Sends and
//! receives never block (MSG_DONTWAIT): the device thread busy-polls.
//! Frames are written and read whole, Ethernet header first; the FCS is the
//! NIC's and never visible, hence the frame's own CRC32C (`frame`).
//!
//! Requirements: CAP_NET_RAW (root), and an interface MTU of at least
//! 8,246 bytes for 8 KB payloads (`ip link set DEV mtu 9000`; veth and most
//! 10 GbE NICs take it) — smaller frames work with a smaller MTU, larger
//! ones are refused with `WireError::FrameTooLarge`. Caveat for real NICs:
//! a NIC with flow control on may consume 0x8808 frames in hardware, which
//! pauses the whole port; on veth they reach the peer's socket.
//!
//! Receiving: `recv(2)` per frame by default, or, with
//! [`PacketSocket::open_with_rx_ring`], a PACKET_MMAP receive ring
//! (TPACKET_V2): the kernel writes frames into memory shared with this
//! process, and polling an idle link reads a status word instead of making a
//! system call. Sending is always `send(2)` (a TX ring needs a system call
//! to kick it too). The benchmark measures both receive paths.

use crate::frame::MAC_CONTROL_ETHERTYPE;
use crate::transport::{set_buffers, PeerId, Transport, MAX_SKIPPED_PER_POLL, SOCKET_BUFFER_BYTES};
use crate::WireError;
use moneta_model::device::packet::Mac;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

// Linux UAPI values the libc crate does not carry for this target.
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const SO_ATTACH_FILTER: libc::c_int = 26;
/// Bytes of an Ethernet header (the interface MTU does not count them).
pub const ETHERNET_HEADER_BYTES: usize = 14;

/// `struct ifreq`: a name and a 24-byte union.
#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: [u8; 24],
}

const PACKET_RX_RING: libc::c_int = 5;
const PACKET_VERSION: libc::c_int = 10;
const TPACKET_V2: libc::c_int = 1;
const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;
/// Receive ring geometry: 64 slots of 16 KB (a 9000-byte frame and the
/// kernel's header fit one), one slot per block.
const RING_FRAME_BYTES: u32 = 16 << 10;
const RING_FRAMES: u32 = 64;

/// `struct tpacket_req`.
#[repr(C)]
struct TpacketReq {
    block_size: u32,
    block_nr: u32,
    frame_size: u32,
    frame_nr: u32,
}

/// The start of `struct tpacket2_hdr` (the fields read here).
#[repr(C)]
struct Tpacket2Hdr {
    status: u32,
    len: u32,
    snaplen: u32,
    mac: u16,
    net: u16,
}

/// A PACKET_MMAP receive ring, unmapped on drop.
struct RxRing {
    base: *mut u8,
    bytes: usize,
    next: u32,
}

impl Drop for RxRing {
    fn drop(&mut self) {
        // SAFETY: base/bytes are the mapping made in `open_inner`.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.bytes) };
    }
}

/// A packet socket on one interface.
pub struct PacketSocket {
    fd: OwnedFd,
    interface: String,
    ethertype: u16,
    local_mac: Mac,
    mtu_bytes: usize,
    peers: Vec<(PeerId, Mac)>,
    ring: Option<RxRing>,
}

// SAFETY: the ring's memory belongs to this socket alone; moving the socket
// to another thread moves its only user.
unsafe impl Send for PacketSocket {}

fn ifreq(name: &str) -> Result<IfReq, WireError> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(WireError::Config(format!("bad interface name `{name}`")));
    }
    let mut r = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: [0; 24],
    };
    for (d, s) in r.name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(r)
}

impl PacketSocket {
    /// Open a packet socket on `interface` (in the calling thread's network
    /// namespace) for frames of `ethertype`; `peers` are the other nodes'
    /// MAC addresses.
    pub fn open(
        interface: &str,
        ethertype: u16,
        peers: &[(PeerId, Mac)],
    ) -> Result<PacketSocket, WireError> {
        Self::open_inner(interface, ethertype, peers, false)
    }

    /// As [`PacketSocket::open`], receiving through a PACKET_MMAP ring.
    pub fn open_with_rx_ring(
        interface: &str,
        ethertype: u16,
        peers: &[(PeerId, Mac)],
    ) -> Result<PacketSocket, WireError> {
        Self::open_inner(interface, ethertype, peers, true)
    }

    fn open_inner(
        interface: &str,
        ethertype: u16,
        peers: &[(PeerId, Mac)],
        rx_ring: bool,
    ) -> Result<PacketSocket, WireError> {
        if ethertype < 0x0600 || ethertype == MAC_CONTROL_ETHERTYPE {
            return Err(WireError::Config(format!(
                "EtherType {ethertype:#06x} cannot carry QuickSAN frames"
            )));
        }
        // Protocol 0: nothing is received until the filter is on and the
        // socket is bound.
        // SAFETY: plain system call.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(WireError::last_os(
                "AF_PACKET socket (needs CAP_NET_RAW: run as root)",
            ));
        }
        // SAFETY: raw is a socket we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let s = fd.as_raw_fd();

        // ldh [12]; jeq #ethertype → accept; jeq #0x8808 → accept; drop.
        let mut program = [
            libc::sock_filter {
                code: 0x28, // BPF_LD | BPF_H | BPF_ABS
                jt: 0,
                jf: 0,
                k: 12,
            },
            libc::sock_filter {
                code: 0x15, // BPF_JMP | BPF_JEQ | BPF_K
                jt: 2,
                jf: 0,
                k: u32::from(ethertype),
            },
            libc::sock_filter {
                code: 0x15,
                jt: 1,
                jf: 0,
                k: u32::from(MAC_CONTROL_ETHERTYPE),
            },
            libc::sock_filter {
                code: 0x06, // BPF_RET | BPF_K
                jt: 0,
                jf: 0,
                k: 0,
            },
            libc::sock_filter {
                code: 0x06,
                jt: 0,
                jf: 0,
                k: 0x0004_0000,
            },
        ];
        let fprog = libc::sock_fprog {
            len: program.len() as u16,
            filter: program.as_mut_ptr(),
        };
        let one: libc::c_int = 1;
        // SAFETY: s is our socket; the option values outlive the calls.
        unsafe {
            if libc::setsockopt(
                s,
                libc::SOL_SOCKET,
                SO_ATTACH_FILTER,
                &fprog as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
            ) != 0
            {
                return Err(WireError::last_os("attach the EtherType filter"));
            }
            if libc::setsockopt(
                s,
                libc::SOL_PACKET,
                PACKET_IGNORE_OUTGOING,
                &one as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            ) != 0
            {
                return Err(WireError::last_os("PACKET_IGNORE_OUTGOING"));
            }
        }
        set_buffers(s, SOCKET_BUFFER_BYTES);

        let cname = CString::new(interface)
            .map_err(|_| WireError::Config(format!("bad interface name `{interface}`")))?;
        // SAFETY: cname is a valid C string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(WireError::last_os(format!("interface {interface}")));
        }
        let mut req = ifreq(interface)?;
        // SAFETY: req is a valid ifreq for the ioctl to fill.
        if unsafe { libc::ioctl(s, libc::SIOCGIFHWADDR, &mut req) } != 0 {
            return Err(WireError::last_os(format!("MAC address of {interface}")));
        }
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&req.data[2..8]);
        let mut req = ifreq(interface)?;
        // SAFETY: as above.
        if unsafe { libc::ioctl(s, libc::SIOCGIFMTU, &mut req) } != 0 {
            return Err(WireError::last_os(format!("MTU of {interface}")));
        }
        let mtu = i32::from_ne_bytes(req.data[0..4].try_into().expect("4 bytes"));
        let ring = if rx_ring { Some(map_rx_ring(s)?) } else { None };

        // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        addr.sll_ifindex = ifindex as i32;
        // SAFETY: addr is a valid sockaddr_ll of the given size.
        let bound = unsafe {
            libc::bind(
                s,
                &addr as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if bound != 0 {
            return Err(WireError::last_os(format!("bind to {interface}")));
        }
        Ok(PacketSocket {
            fd,
            interface: interface.to_string(),
            ethertype,
            local_mac: Mac(mac),
            mtu_bytes: mtu.max(0) as usize + ETHERNET_HEADER_BYTES,
            peers: peers.to_vec(),
            ring,
        })
    }

    /// Whether frames arrive through a PACKET_MMAP ring.
    pub fn has_rx_ring(&self) -> bool {
        self.ring.is_some()
    }

    /// The next frame from the ring, copied into `buf`: its length.
    fn ring_recv(ring: &mut RxRing, buf: &mut [u8]) -> Option<usize> {
        let slot = ring.next as usize * RING_FRAME_BYTES as usize;
        // SAFETY: slot is inside the mapping (next < RING_FRAMES); the kernel
        // hands a slot over by setting TP_STATUS_USER in its first word and
        // writes nothing more to it until we store TP_STATUS_KERNEL.
        unsafe {
            let hdr = ring.base.add(slot);
            let status = &*(hdr as *const std::sync::atomic::AtomicU32);
            if status.load(std::sync::atomic::Ordering::Acquire) & TP_STATUS_USER == 0 {
                return None;
            }
            let h = &*(hdr as *const Tpacket2Hdr);
            let (mac, snaplen) = (usize::from(h.mac), h.snaplen as usize);
            let len = snaplen
                .min(buf.len())
                .min((RING_FRAME_BYTES as usize).saturating_sub(mac));
            std::ptr::copy_nonoverlapping(hdr.add(mac), buf.as_mut_ptr(), len);
            status.store(TP_STATUS_KERNEL, std::sync::atomic::Ordering::Release);
            ring.next = (ring.next + 1) % RING_FRAMES;
            Some(len)
        }
    }

    pub fn interface(&self) -> &str {
        &self.interface
    }
}

/// Switch socket `s` to TPACKET_V2 and map a receive ring (before bind).
fn map_rx_ring(s: RawFd) -> Result<RxRing, WireError> {
    let version = TPACKET_V2;
    let req = TpacketReq {
        block_size: RING_FRAME_BYTES,
        block_nr: RING_FRAMES,
        frame_size: RING_FRAME_BYTES,
        frame_nr: RING_FRAMES,
    };
    // SAFETY: s is our socket; the option values outlive the calls.
    unsafe {
        if libc::setsockopt(
            s,
            libc::SOL_PACKET,
            PACKET_VERSION,
            &version as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) != 0
        {
            return Err(WireError::last_os("PACKET_VERSION TPACKET_V2"));
        }
        if libc::setsockopt(
            s,
            libc::SOL_PACKET,
            PACKET_RX_RING,
            &req as *const _ as *const libc::c_void,
            std::mem::size_of::<TpacketReq>() as libc::socklen_t,
        ) != 0
        {
            return Err(WireError::last_os("PACKET_RX_RING"));
        }
    }
    let bytes = (RING_FRAME_BYTES * RING_FRAMES) as usize;
    // SAFETY: mapping the ring the kernel just made for this socket.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            s,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(WireError::last_os("mmap the receive ring"));
    }
    Ok(RxRing {
        base: base as *mut u8,
        bytes,
        next: 0,
    })
}

impl Transport for PacketSocket {
    fn mtu_bytes(&self) -> usize {
        self.mtu_bytes
    }
    fn wait_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn local_mac(&self) -> Mac {
        self.local_mac
    }

    fn peer_mac(&self, peer: PeerId) -> Option<Mac> {
        self.peers.iter().find(|(p, _)| *p == peer).map(|(_, m)| *m)
    }

    fn ethertype(&self) -> u16 {
        self.ethertype
    }

    fn send(&mut self, _now_ns: u64, _peer: PeerId, frame: &[u8]) -> Result<(), WireError> {
        if frame.len() > self.mtu_bytes {
            return Err(WireError::FrameTooLarge {
                frame_bytes: frame.len(),
                mtu_bytes: self.mtu_bytes,
            });
        }
        // The destination is the frame's first six bytes.
        // SAFETY: frame is a valid buffer of its length.
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                frame.as_ptr() as *const libc::c_void,
                frame.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::ENOBUFS) => Err(WireError::WouldBlock),
            // The interface is down: the frame is lost, as on a cut cable.
            Some(libc::ENETDOWN) | Some(libc::ENXIO) => Ok(()),
            _ => Err(WireError::io(format!("send on {}", self.interface), e)),
        }
    }

    fn poll_recv(
        &mut self,
        _now_ns: u64,
        buf: &mut [u8],
    ) -> Result<Option<(PeerId, usize)>, WireError> {
        for _ in 0..MAX_SKIPPED_PER_POLL {
            if let Some(ring) = &mut self.ring {
                let Some(len) = Self::ring_recv(ring, buf) else {
                    return Ok(None);
                };
                if len < 12 {
                    continue;
                }
                let src = &buf[6..12];
                if let Some(&(peer, _)) = self.peers.iter().find(|(_, m)| m.0 == src) {
                    return Ok(Some((peer, len)));
                }
                continue;
            }
            // SAFETY: buf is a valid writable buffer of its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                    Some(libc::ENETDOWN) => Ok(None),
                    _ => Err(WireError::io(format!("receive on {}", self.interface), e)),
                };
            }
            let len = n as usize;
            if len < 12 {
                continue;
            }
            let src = &buf[6..12];
            if let Some(&(peer, _)) = self.peers.iter().find(|(_, m)| m.0 == src) {
                return Ok(Some((peer, len)));
            }
        }
        Ok(None)
    }
}
