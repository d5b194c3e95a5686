//! Code shared by the integration tests and benchmarks of libnvmm.

pub mod sqlite;
