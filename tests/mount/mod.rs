//! The read-only mount, for real: each test mounts a store with `ckptfs mount
//! --foreground` on a FUSE mount point of its own (see [`crate::util::mount`]) and uses
//! it with ordinary tools (`ls`, `cat`, `find`, `diff -r`, `cp -a`) and `std::fs`.
//!
//! Behavioural tests are functions taking a [`TestStore`]; `both_stores!` turns each
//! into `mount::local::NAME` and `mount::s3::NAME`. Tests that need S3 alone (a proxy
//! that stalls one download) are plain `#[test]`s named `s3_*`.
//!
//! Needs root (or fuse access), `fusermount3`, GNU tar and diffutils; S3 tests need the
//! moto server of `scripts/test.sh`.

mod cache;
mod concurrency;
mod crashes;
mod faults;
mod fidelity;
mod gate;
mod lifecycle;
mod verification;
mod views;

macro_rules! both_stores {
    ($($module:ident::$name:ident),* $(,)?) => {
        mod local {
            $(
                #[test]
                fn $name() {
                    super::$module::$name(&crate::util::TestStore::local());
                }
            )*
        }
        mod s3 {
            $(
                #[test]
                fn $name() {
                    super::$module::$name(&crate::util::TestStore::s3());
                }
            )*
        }
    };
}

both_stores!(
    fidelity::every_writer_mounts_like_tar_x,
    fidelity::wide_header_values_mount_like_tar_x,
    fidelity::special_entries_follow_tar_semantics,
    verification::corrupt_checkpoints_answer_eio,
    verification::oversized_and_unusable_checkpoints_are_refused,
    views::writes_inside_a_checkpoint_fail_with_erofs,
    views::mknod_inside_a_checkpoint_fails_with_erofs,
    views::time_views_resolve_and_follow_new_checkpoints,
    views::a_deleted_checkpoint_leaves_no_stale_entry,
    views::owners_and_mount_options,
    cache::cache_is_reused_and_repaired_after_restarts,
    cache::eviction_keeps_the_cache_under_its_bound,
    cache::a_checkpoint_larger_than_the_cache_still_reads,
    cache::turns_share_their_unchanged_files_in_the_cache,
    cache::turn_n_plus_1_is_rebuilt_from_turn_n_in_the_cache,
    cache::eviction_frees_shared_files_once_and_no_more,
    cache::a_large_file_of_an_earlier_checkpoint_is_linked_unwritten,
);
