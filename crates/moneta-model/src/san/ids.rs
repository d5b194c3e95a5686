//! How the SAN names its machines and its devices (SPEC §4.1).

/// A host (server or client machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostId(pub u16);

/// A QuickSAN device (SSD or NIC), one network port each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId(pub u16);
