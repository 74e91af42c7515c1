//! Which checkpoints a keep policy keeps, and why (`ckptfs prune`).
//!
//! The rules mean what restic's `forget` rules mean: `--keep-last N` keeps the N
//! newest, `--keep-within D` keeps those taken within D of the newest (not of now:
//! a store nobody wrote for a month keeps its last days), `--keep` keeps the ones
//! named. A checkpoint is deleted only if no rule keeps it.
//!
//! Invariants:
//! - a checkpoint younger than the grace period (by the store's clock against this
//!   machine's) is never deleted, whatever the rules say: a replica may be opening it,
//!   or a seal may just have found its content present and count on it;
//! - with `keep_lineage`, the parents that kept checkpoints claim are kept too, as far
//!   back as the store has them; a claim is metadata, so this can only keep more;
//! - this module decides; it never deletes. The listing is the caller's, in capture
//!   order (see [`crate::checkpoint::list`]).

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use crate::checkpoint::{CheckpointId, CheckpointInfo};

/// What to keep. A policy without a rule ([`Policy::keeps_by_rule`] false) keeps
/// everything; the command refuses it rather than guess.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// The newest N (0: no such rule).
    pub keep_last: usize,
    pub keep_within: Option<Duration>,
    pub keep: Vec<CheckpointId>,
    pub keep_lineage: bool,
    pub grace: Duration,
}

impl Policy {
    pub fn keeps_by_rule(&self) -> bool {
        self.keep_last > 0 || self.keep_within.is_some() || !self.keep.is_empty()
    }
}

/// Why a checkpoint is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// One of the newest N: its rank, 1 for the newest.
    Last(usize),
    Within(Duration),
    Named,
    /// The parent a kept checkpoint claims.
    ParentOf(CheckpointId),
    Grace(Duration),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Last(rank) => write!(f, "last {rank}"),
            Reason::Within(d) => {
                write!(f, "within {} of the newest", humantime::format_duration(*d))
            }
            Reason::Named => f.write_str("named by --keep"),
            Reason::ParentOf(child) => write!(f, "parent of {}", child.short()),
            Reason::Grace(d) => write!(
                f,
                "younger than the grace period ({})",
                humantime::format_duration(*d)
            ),
        }
    }
}

/// One checkpoint's fate: kept for these reasons, or deleted when there are none.
#[derive(Debug)]
pub struct Decision<'a> {
    pub info: &'a CheckpointInfo,
    pub reasons: Vec<Reason>,
}

impl Decision<'_> {
    pub fn keep(&self) -> bool {
        !self.reasons.is_empty()
    }
}

/// Decides for each checkpoint of `listing` (oldest first), in its order. `parents`
/// holds the parents checkpoints claim (needed only with `keep_lineage`).
pub fn decide<'a>(
    listing: &'a [CheckpointInfo],
    parents: &HashMap<CheckpointId, CheckpointId>,
    policy: &Policy,
    now: SystemTime,
) -> Vec<Decision<'a>> {
    let newest = listing.iter().map(|c| c.last_modified).max();
    let mut decisions: Vec<Decision<'a>> = listing
        .iter()
        .enumerate()
        .map(|(i, info)| {
            let mut reasons = Vec::new();
            let rank = listing.len() - i;
            if rank <= policy.keep_last {
                reasons.push(Reason::Last(rank));
            }
            if let (Some(within), Some(newest)) = (policy.keep_within, newest)
                && newest
                    .duration_since(info.last_modified)
                    .is_ok_and(|age| age <= within)
            {
                reasons.push(Reason::Within(within));
            }
            if policy.keep.contains(&info.id) {
                reasons.push(Reason::Named);
            }
            // A time ahead of this machine's clock is young too.
            if now
                .duration_since(info.last_modified)
                .map_or(true, |age| age < policy.grace)
            {
                reasons.push(Reason::Grace(policy.grace));
            }
            Decision { info, reasons }
        })
        .collect();
    if policy.keep_lineage {
        let at: HashMap<&CheckpointId, usize> = listing
            .iter()
            .enumerate()
            .map(|(i, c)| (&c.id, i))
            .collect();
        let kept: Vec<usize> = (0..decisions.len())
            .filter(|&i| decisions[i].keep())
            .collect();
        for start in kept {
            let mut child = start;
            while let Some(&parent) = parents.get(&listing[child].id).and_then(|p| at.get(p)) {
                let reason = Reason::ParentOf(listing[child].id.clone());
                let already = decisions[parent].keep();
                if !decisions[parent].reasons.contains(&reason) {
                    decisions[parent].reasons.push(reason);
                }
                // A parent kept already has its own chain walked (or being walked);
                // a claimed cycle ends here too.
                if already {
                    break;
                }
                child = parent;
            }
        }
    }
    decisions
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn listing(times: &[u64]) -> Vec<CheckpointInfo> {
        times
            .iter()
            .enumerate()
            .map(|(i, &t)| CheckpointInfo {
                id: CheckpointId::parse(&format!("{i:02x}").repeat(32)).unwrap(),
                size: 1,
                last_modified: UNIX_EPOCH + Duration::from_secs(t),
            })
            .collect()
    }

    fn kept(decisions: &[Decision<'_>]) -> Vec<usize> {
        (0..decisions.len())
            .filter(|&i| decisions[i].keep())
            .collect()
    }

    const HOUR: u64 = 3600;

    #[test]
    fn each_rule_keeps_what_restic_would_and_the_grace_period_overrides_them() {
        let listing = listing(&[0, HOUR, 2 * HOUR, 10 * HOUR, 11 * HOUR, 12 * HOUR]);
        let now = UNIX_EPOCH + Duration::from_secs(100 * HOUR);
        let none = HashMap::new();
        let policy = |f: fn(&mut Policy)| {
            let mut p = Policy::default();
            f(&mut p);
            p
        };
        let last2 = policy(|p| p.keep_last = 2);
        assert_eq!(kept(&decide(&listing, &none, &last2, now)), [4, 5]);
        // Within two hours of the newest (12 h), not of now (100 h).
        let within = policy(|p| p.keep_within = Some(Duration::from_secs(2 * HOUR)));
        assert_eq!(kept(&decide(&listing, &none, &within, now)), [3, 4, 5]);
        let mut named = policy(|p| p.keep_last = 1);
        named.keep = vec![listing[1].id.clone()];
        let decisions = decide(&listing, &none, &named, now);
        assert_eq!(kept(&decisions), [1, 5]);
        assert_eq!(decisions[1].reasons, [Reason::Named]);
        assert_eq!(decisions[5].reasons, [Reason::Last(1)]);
        // 90 hours of grace: everything from 10 h on is young at 100 h.
        let mut grace = last2.clone();
        grace.grace = Duration::from_secs(90 * HOUR + 1);
        let decisions = decide(&listing, &none, &grace, now);
        assert_eq!(kept(&decisions), [3, 4, 5]);
        assert_eq!(decisions[3].reasons, [Reason::Grace(grace.grace)]);
    }

    #[test]
    fn lineage_keeps_the_claimed_parents_of_kept_checkpoints_and_survives_cycles() {
        let listing = listing(&[0, 1, 2, 3, 4, 5]);
        let id = |i: usize| listing[i].id.clone();
        // Two sandboxes: 0 <- 2 <- 4 and 1 <- 3 <- 5; and a claimed cycle 1 -> 5.
        let parents = HashMap::from([
            (id(2), id(0)),
            (id(4), id(2)),
            (id(3), id(1)),
            (id(5), id(3)),
            (id(1), id(5)),
        ]);
        let policy = Policy {
            keep_last: 1,
            keep_lineage: true,
            ..Policy::default()
        };
        let now = UNIX_EPOCH + Duration::from_secs(HOUR);
        let decisions = decide(&listing, &parents, &policy, now);
        assert_eq!(kept(&decisions), [1, 3, 5]);
        assert_eq!(decisions[3].reasons, [Reason::ParentOf(id(5))]);
        let without = Policy {
            keep_lineage: false,
            ..policy
        };
        assert_eq!(kept(&decide(&listing, &parents, &without, now)), [5]);
    }
}
