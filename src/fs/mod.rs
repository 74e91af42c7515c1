//! The filesystem.
pub mod mount;
