//! Start-gap wear leveling with address randomization (SPEC §1.7). Placeholder: being written.
