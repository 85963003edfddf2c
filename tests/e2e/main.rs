//! End-to-end tests: the real `lazaret` and role binaries, driven the way a
//! user drives them, each in its own scratch host. One test binary with a
//! plain harness, so tests that need root or fork can declare it and run
//! single-threaded when they must.

mod attach;
mod cli;
mod confinement;
mod credentials;
mod domain;
mod escalation;
mod faults;
mod liveness;
mod net;
mod network;
mod packaging;
mod state;
mod workspace;

use libtest_mimic::{Arguments, Trial};

fn main() {
    let args = Arguments::from_args();
    let mut trials: Vec<Trial> = cli::trials();
    trials.extend(domain::trials());
    trials.extend(confinement::trials());
    trials.extend(credentials::trials());
    trials.extend(attach::trials());
    trials.extend(escalation::trials());
    trials.extend(faults::trials());
    trials.extend(liveness::trials());
    trials.extend(net::trials());
    trials.extend(network::trials());
    trials.extend(packaging::trials());
    trials.extend(state::trials());
    trials.extend(workspace::trials());
    let conclusion = libtest_mimic::run(&args, trials);
    // The test user and image this run made go, whatever the outcome.
    lazaret_tests::domain::cleanup();
    conclusion.exit();
}
