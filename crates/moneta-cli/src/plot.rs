//! plot placeholder
