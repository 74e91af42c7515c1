//! Inode numbers and file handles, and which subtree owns each: fixed numbers for
//! the virtual tree, a 32-bit range per checkpoint, a bit for staging.
//!
//! Checkpoint `slot` (its position in the order the mount first saw checkpoints)
//! owns `(slot + 1) << 32 ..`: the first number is its `by-time/` link, then one per
//! index node, the checkpoint's root directory first. Node numbers come from the
//! archive's contents alone, so they stay the same if an evicted checkpoint is loaded
//! again, and slots are never reused within a mount.

pub const ROOT: u64 = 1;
pub const BY_TIME: u64 = 2;
pub const LATEST: u64 = 3;
pub const STAGING: u64 = 4;
pub const COMMIT: u64 = 5;
pub const STATUS: u64 = 6;

/// Staged files and directories (see [`super::staging`]) carry this bit.
pub const STAGED_BIT: u64 = 1 << 63;
/// `commit/NAME` links carry this bit, with their position in `commit/`.
pub const COMMIT_LINK_BIT: u64 = 1 << 62;

/// File handles of the virtual tree (`.status`) carry this bit; staging's carry
/// [`STAGED_BIT`]; checkpoint files' carry neither.
pub const HANDLE_VIEW_BIT: u64 = 1 << 62;

/// The subtree that answers for an inode or a file handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The root, `by-time/`, `latest`, `.status`, `commit/` and what is in them.
    Views,
    /// What is inside `<sha256>/`, the checkpoint's own directory included.
    Checkpoints,
    /// `staging/` and everything below it.
    Staging,
}

impl Owner {
    pub fn of_inode(ino: u64) -> Owner {
        match Inode::decode(ino) {
            Some(Inode::Staging | Inode::Staged(_)) => Owner::Staging,
            Some(Inode::Node { .. }) => Owner::Checkpoints,
            _ => Owner::Views,
        }
    }

    pub fn of_handle(fh: u64) -> Owner {
        if fh & STAGED_BIT != 0 {
            Owner::Staging
        } else if fh & HANDLE_VIEW_BIT != 0 {
            Owner::Views
        } else {
            Owner::Checkpoints
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inode {
    Root,
    ByTime,
    Latest,
    Staging,
    Commit,
    Status,
    /// `by-time/<time>-<short id>`, a symlink to the checkpoint.
    ByTimeLink {
        slot: usize,
    },
    /// A node of a checkpoint's index; node 0 is the checkpoint's directory.
    Node {
        slot: usize,
        node: u32,
    },
    /// Something below `staging/`.
    Staged(u64),
    /// `commit/NAME`, a symlink to the sealed checkpoint.
    CommitLink {
        index: usize,
    },
}

impl Inode {
    pub fn decode(ino: u64) -> Option<Inode> {
        Some(match ino {
            ROOT => Inode::Root,
            BY_TIME => Inode::ByTime,
            LATEST => Inode::Latest,
            STAGING => Inode::Staging,
            COMMIT => Inode::Commit,
            STATUS => Inode::Status,
            _ if ino & STAGED_BIT != 0 => Inode::Staged(ino),
            _ if ino & COMMIT_LINK_BIT != 0 => Inode::CommitLink {
                index: (ino & !COMMIT_LINK_BIT) as usize,
            },
            _ => {
                let slot = (ino >> 32).checked_sub(1)? as usize;
                match ino & 0xFFFF_FFFF {
                    0 => Inode::ByTimeLink { slot },
                    n => Inode::Node {
                        slot,
                        node: (n - 1) as u32,
                    },
                }
            }
        })
    }

    pub fn encode(self) -> u64 {
        match self {
            Inode::Root => ROOT,
            Inode::ByTime => BY_TIME,
            Inode::Latest => LATEST,
            Inode::Staging => STAGING,
            Inode::Commit => COMMIT,
            Inode::Status => STATUS,
            Inode::ByTimeLink { slot } => (slot as u64 + 1) << 32,
            Inode::Node { slot, node } => ((slot as u64 + 1) << 32) + node as u64 + 1,
            Inode::Staged(ino) => ino,
            Inode::CommitLink { index } => COMMIT_LINK_BIT | index as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for inode in [
            Inode::Root,
            Inode::Status,
            Inode::ByTimeLink { slot: 0 },
            Inode::Node { slot: 0, node: 0 },
            Inode::Node {
                slot: 7,
                node: 123_456,
            },
            Inode::ByTimeLink { slot: 99_999 },
            Inode::Staged(STAGED_BIT | 12345),
            Inode::CommitLink { index: 3 },
        ] {
            assert_eq!(Inode::decode(inode.encode()), Some(inode));
        }
        assert_eq!(Inode::decode(7), None);
    }

    #[test]
    fn every_inode_and_handle_has_one_owner() {
        assert_eq!(Owner::of_inode(STAGING), Owner::Staging);
        assert_eq!(Owner::of_inode(STAGED_BIT | 77), Owner::Staging);
        assert_eq!(
            Owner::of_inode(Inode::Node { slot: 3, node: 0 }.encode()),
            Owner::Checkpoints
        );
        assert_eq!(
            Owner::of_inode(Inode::ByTimeLink { slot: 3 }.encode()),
            Owner::Views
        );
        for ino in [ROOT, BY_TIME, LATEST, COMMIT, STATUS, COMMIT_LINK_BIT | 2] {
            assert_eq!(Owner::of_inode(ino), Owner::Views, "{ino}");
        }
        assert_eq!(Owner::of_handle(STAGED_BIT | 1), Owner::Staging);
        assert_eq!(Owner::of_handle(HANDLE_VIEW_BIT | 1), Owner::Views);
        assert_eq!(Owner::of_handle(1), Owner::Checkpoints);
    }
}
