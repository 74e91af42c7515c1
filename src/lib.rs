//! ckptfs: content-addressed workspace checkpoints in object storage, as a FUSE
//! filesystem and a command-line tool.
//!
//! Data flows one way: [`cli`] → [`store`] (S3 or a local directory) → [`archive`]
//! (tar.gz writing, indexing, extraction) → [`members`] (the gzip members one turn
//! reuses of the last, capturing and loading) → [`cache`] (verified local copies) →
//! [`fs`] (the filesystem logic, the thin FUSE adapter, and mounting). [`checkpoint`]
//! names checkpoints and verifies them on top of a store. [`review`] compares and
//! reads verified checkpoints for the host-side review commands; [`prune`] decides
//! which checkpoints a keep policy keeps; [`history`] what a versioned bucket
//! remembers of deleted and overwritten checkpoints; [`printable`] how a name from
//! outside is printed; [`trusted`] which configured directories may be used. [`commands`] runs each
//! command of the CLI on top of the library, and is the only layer that prints; no
//! library module imports [`cli`] or [`commands`].

pub mod archive;
pub mod beneath;
pub mod cache;
pub mod checkpoint;
pub mod cli;
pub mod commands;
pub mod fs;
pub mod history;
pub mod members;
pub mod mount_helper;
pub mod pipe;
pub mod printable;
pub mod prune;
pub mod review;
pub mod store;
pub mod trusted;
