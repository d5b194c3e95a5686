//! The Ethernet fabric between QuickSAN ports, and between the hosts' own
//! NICs (SPEC §4.2): 10 Gb/s full-duplex links into an output-queued
//! switch, lossless through IEEE 802.3x pause hop by hop.
//!
//! ## Fixed latencies, derived from the two published numbers
//!
//! SPEC §4.2 gives a minimum one-way latency of 1 µs "through two NICs, two
//! links and a switch", and +450 ns per extra hop each way. The smallest
//! packet is a request or write completion: a 32-byte header, padded to
//! the 64-byte minimum frame. With `w` = the time a minimum frame takes on
//! a 10 Gb/s link until its last bit (8 B preamble + 64 B frame = 72 B,
//! 57.6 ns → 58 ns) and `b` = the packet buffer's store after the last bit
//! (A.6's words are written as they arrive, so for the 32-byte packet the
//! store ends one 8 ns cycle after its last word: 8 ns;
//! `config::packet_buffer_tail_ns`):
//!
//! - one extra hop is one more switch and one more link, a store-and-forward
//!   element: `switch_ns + w = 450`, so **switch_ns = 450 − 58 = 392 ns**
//!   (cable propagation, a few ns on CX4 copper, is folded in);
//! - the minimum path is `nic_tx + w + switch + w + nic_rx + b = 1000`, so
//!   **nic_tx + nic_rx = 1000 − 2·58 − 392 − 8 = 484 ns**, 242 ns per NIC.
//!
//! [`FabricTiming::derive`] does this arithmetic from the configuration, so
//! other published numbers (`network.min_one_way_ns`, `extra_hop_ns`, the
//! link rate) change the derived latencies, and impossible ones are errors.
//!
//! ## The switch
//!
//! One switch port per QuickSAN device and per host NIC. A frame arrives
//! whole (store and forward), is switched after `switch_ns`, and waits in
//! its output port's FIFO for the link ([`Transmitter`]). The switch counts
//! each frame against the buffer of the input port it came from until the
//! frame has left: when an input's share reaches the pause fraction
//! (`network.pause_on_bytes / rx_buffer_bytes`), the switch pauses that
//! input link, and cancels below the release fraction. Buffers are
//! bounded, nothing is dropped, and a congested output backs up into its
//! senders (head-of-line blocking, as 802.3x does). Paths through more than
//! one switch (`network.switch_hops` > 1) pay the extra hops' fixed
//! latency; only the last switch is modelled with queues.
//!
//! A pause request takes effect at the far transmitter one minimum frame
//! later (the pause frame on the reverse link); the transmitter finishes
//! the frame it is sending and then stops.
//!
//! Left out: pause quanta (a pause is held until cancelled), the switch's
//! shared-memory details, cable length differences, TCP's own behaviour
//! for host messages (frames of `message_mtu_bytes`, no loss, no acks).

use crate::config::{FabricTiming, NetworkConfig};
use crate::device::network::{PauseGauge, Started, Transmitter};
use crate::units::Ns;

/// A frame in the switch: its id in the owner's table, where it came in,
/// and what it holds of that input's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwitchFrame {
    pub id: u32,
    pub in_port: u16,
    pub stored_bytes: u64,
}

/// What the switch asks its owner to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchAction {
    /// A frame started on output `port`'s link: deliver it, and call
    /// [`Switch::tx_done`] at its `free_ns`.
    Started {
        port: u16,
        started: Started<SwitchFrame>,
    },
    /// Pause (or resume) the transmitter feeding input `port`, at the time.
    Pause { port: u16, at_ns: Ns, paused: bool },
}

struct SwitchPort {
    output: Transmitter<SwitchFrame>,
    ingress: PauseGauge,
}

/// An output-queued switch with per-input buffer accounting and 802.3x.
pub struct Switch {
    ports: Vec<SwitchPort>,
    timing: FabricTiming,
    /// Frames the switch holds at most per input (for reports).
    port_buffer_bytes: u64,
}

impl Switch {
    pub fn new(n: &NetworkConfig, timing: FabricTiming, ports: u16) -> Switch {
        Switch {
            ports: (0..ports)
                .map(|_| SwitchPort {
                    output: Transmitter::new(n.link_bits_per_s),
                    ingress: PauseGauge::new(
                        n.switch_port_buffer_bytes,
                        n.switch_pause_on_bytes(),
                        n.switch_pause_off_bytes(),
                    ),
                })
                .collect(),
            timing,
            port_buffer_bytes: n.switch_port_buffer_bytes,
        }
    }

    pub fn timing(&self) -> &FabricTiming {
        &self.timing
    }

    /// A frame has been switched (arrived whole at `in_port`, `switch_ns`
    /// ago) toward `out_port` at `now_ns`.
    pub fn forward(
        &mut self,
        now_ns: Ns,
        frame: SwitchFrame,
        frame_bytes: u64,
        out_port: u16,
        actions: &mut Vec<SwitchAction>,
    ) {
        let change = self.ports[frame.in_port as usize]
            .ingress
            .fill(frame.stored_bytes);
        self.pause_input(now_ns, frame.in_port, change, actions);
        if let Some(started) = self.ports[out_port as usize]
            .output
            .push(now_ns, frame, frame_bytes)
        {
            actions.push(SwitchAction::Started {
                port: out_port,
                started,
            });
        }
    }

    /// An input buffer's pause state changed: tell the link's sender.
    fn pause_input(
        &self,
        now_ns: Ns,
        port: u16,
        change: Option<bool>,
        actions: &mut Vec<SwitchAction>,
    ) {
        if let Some(paused) = change {
            actions.push(SwitchAction::Pause {
                port,
                at_ns: now_ns + self.timing.pause_delay_ns,
                paused,
            });
        }
    }

    /// Output `port`'s frame has left (its `free_ns`).
    pub fn tx_done(&mut self, now_ns: Ns, port: u16, actions: &mut Vec<SwitchAction>) {
        let (frame, next) = self.ports[port as usize].output.done(now_ns);
        let change = self.ports[frame.in_port as usize]
            .ingress
            .drain(frame.stored_bytes);
        self.pause_input(now_ns, frame.in_port, change, actions);
        if let Some(started) = next {
            actions.push(SwitchAction::Started { port, started });
        }
    }

    /// The device behind output `port` pauses (or resumes) that link.
    pub fn set_paused(
        &mut self,
        now_ns: Ns,
        port: u16,
        paused: bool,
        actions: &mut Vec<SwitchAction>,
    ) {
        if let Some(started) = self.ports[port as usize].output.set_paused(now_ns, paused) {
            actions.push(SwitchAction::Started { port, started });
        }
    }

    pub fn wire_bytes(&self) -> u64 {
        self.ports.iter().map(|p| p.output.wire_bytes()).sum()
    }

    pub fn frames(&self) -> u64 {
        self.ports.iter().map(|p| p.output.frames()).sum()
    }

    pub fn pauses(&self) -> u64 {
        self.ports.iter().map(|p| p.ingress.pauses()).sum()
    }

    pub fn max_ingress_bytes(&self) -> u64 {
        let max = self
            .ports
            .iter()
            .map(|p| p.ingress.max_occupancy_bytes())
            .max()
            .unwrap_or(0);
        debug_assert!(max <= self.port_buffer_bytes);
        max
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn derived_latencies_reproduce_the_published_one_way_numbers() {
        let mut c = Config::preset("quicksan-ssd").unwrap();
        let t = FabricTiming::derive(&c.network).unwrap();
        eprintln!("{t:?}");
        assert_eq!((t.min_frame_ns, t.min_packet_buffer_ns), (58, 8));
        assert_eq!(t.switch_ns, 392);
        assert_eq!((t.nic_tx_ns, t.nic_rx_ns), (242, 242));
        assert_eq!(t.min_one_way_ns(), 1000);
        c.network.switch_hops = 3;
        let t3 = FabricTiming::derive(&c.network).unwrap();
        assert_eq!(t3.min_one_way_ns(), 1000 + 2 * 450);
        // Numbers no element split can give are configuration errors.
        let e = c.set("network.min_one_way_ns=400").unwrap_err();
        assert_eq!(e.key, "network.min_one_way_ns");
        let e = c.set("network.extra_hop_ns=20").unwrap_err();
        assert_eq!(e.key, "network.extra_hop_ns");
    }

    #[test]
    fn a_congested_output_pauses_its_inputs_and_releases_them() {
        let c = Config::preset("quicksan-ssd").unwrap();
        let t = FabricTiming::derive(&c.network).unwrap();
        let mut s = Switch::new(&c.network, t, 3);
        let mut actions = Vec::new();
        // Output 2 is paused by its device; input 0 keeps sending 8 KB frames.
        s.set_paused(0, 2, true, &mut actions);
        let frame = |id| SwitchFrame {
            id,
            in_port: 0,
            stored_bytes: 8224,
        };
        // The input pauses at a quarter of its 64 KB: on the second frame.
        s.forward(0, frame(0), 8224, 2, &mut actions);
        assert!(actions.is_empty());
        s.forward(0, frame(1), 8224, 2, &mut actions);
        assert_eq!(
            actions,
            vec![SwitchAction::Pause {
                port: 0,
                at_ns: 58,
                paused: true
            }]
        );
        actions.clear();
        s.set_paused(100, 2, false, &mut actions);
        let SwitchAction::Started { started, .. } = actions[0] else {
            panic!("{actions:?}")
        };
        let mut now = started.free_ns;
        let mut resumed = false;
        for _ in 0..2 {
            actions.clear();
            s.tx_done(now, 2, &mut actions);
            for a in &actions {
                match *a {
                    SwitchAction::Started { started, .. } => now = started.free_ns,
                    SwitchAction::Pause { paused: false, .. } => resumed = true,
                    SwitchAction::Pause { .. } => panic!("paused twice"),
                }
            }
        }
        assert!(resumed);
        assert_eq!(s.pauses(), 1);
        assert_eq!(s.max_ingress_bytes(), 2 * 8224);
    }
}
