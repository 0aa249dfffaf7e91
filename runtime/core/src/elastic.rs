//! The elastic controller, composed: a campaign input goes to the campaign core (with the
//! roster it changes), and what concerns jobs (the fence, held jobs to end) goes straight
//! on to the job manager, in order, before anything else happens. [`DaemonCore`] and the
//! model checker both step through here, so what the checker proves is what runs.
//!
//! [`DaemonCore`]: crate::daemon_core::DaemonCore

use crate::campaign::{self, Campaigns};
use crate::jobs::{self, JobManager};
use crate::roster::Roster;

/// What one campaign input led to, besides the job manager's own changes.
#[derive(Debug, Default)]
pub struct Step {
    /// For the overlay, the shell, the event hub and the requesting tool.
    pub campaign: Vec<campaign::Output>,
    /// The job manager's outputs (launches, answers, ended jobs).
    pub jobs: Vec<jobs::Output>,
}

/// Feeds `input` to the campaign core; a request learns which ranks run launched jobs.
pub fn step(
    campaigns: &mut Campaigns,
    roster: &mut Roster,
    mgr: &mut JobManager,
    mut input: campaign::Input,
) -> Step {
    if let campaign::Input::Request(r) = &mut input {
        r.busy = mgr.busy();
    }
    let mut step = Step::default();
    for o in campaigns.handle(roster, input) {
        let to_jobs = match o {
            campaign::Output::Fence(_)
                if campaigns
                    .fault()
                    .is_some_and(campaign::Fault::ignores_fence) =>
            {
                continue
            }
            campaign::Output::Fence(f) => jobs::Input::Fence(f),
            campaign::Output::AbortParked { launch_too, cause } => {
                jobs::Input::AbortParked { launch_too, cause }
            }
            other => {
                step.campaign.push(other);
                continue;
            }
        };
        step.jobs.extend(mgr.handle(roster, to_jobs));
    }
    step
}
