//! What every start-up step of one generation works with, and what `up`
//! does with host paths the last generation kept from the sandbox.
//!
//! Owns no state: borrowed views of the reporter, the recorder, the
//! resolved configuration and the generation. Trusts what it borrows.

use lazaret_proto::store::Generation;

use super::record::Recorder;
use super::report::Reporter;
use crate::config::{ResolvedDomainConfiguration, RetainedDir};

/// What `up` does with host paths the Domain's last generation isolated
/// that the workspace's rules now share (`--ignore-changes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IgnoreChangesMode {
    /// Ask the developer through the CLI (which has a terminal); keep
    /// them isolated unless the answer is yes.
    Ask,
    /// Keep them isolated for this generation, and say so.
    Keep,
    /// Share them, as `lazaret up --accept-ignore-changes` says.
    Accept,
}

/// What every start-up step of one generation works with.
#[derive(Clone, Copy)]
pub(super) struct Context<'a> {
    pub(super) reporter: &'a Reporter,
    pub(super) recorder: &'a Recorder,
    pub(super) resolved: &'a ResolvedDomainConfiguration,
    /// The profile's credentials and this generation's placeholders.
    pub(super) credentials: &'a super::credentials::Credentials<'a>,
    pub(super) generation: &'a Generation,
    /// The generation's runtime directory, `gen-N`.
    pub(super) generation_dir: &'a RetainedDir,
    /// What to do with host paths the workspace's rules now share.
    pub(super) ignore_changes: IgnoreChangesMode,
}
