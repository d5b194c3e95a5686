//! Command decoding (SPEC §1.2). Placeholder: being written.
