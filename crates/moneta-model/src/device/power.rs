//! Power model (SPEC §1.9). Placeholder: being written.
