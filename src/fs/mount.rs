//! Mounting.
use crate::cli::{Cli, MountArgs};

pub fn run(_cli: &Cli, _args: &MountArgs) -> anyhow::Result<()> {
    anyhow::bail!("mount is not implemented yet")
}
