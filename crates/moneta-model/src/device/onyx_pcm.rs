//! Onyx P8P PCM controller (SPEC §5). Placeholder: being written.
