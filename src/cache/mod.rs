//! The on-disk cache of verified checkpoints.
