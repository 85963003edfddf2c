//! The resolver refuses to act unless it holds exactly CAP_NET_ADMIN and
//! CAP_NET_BIND_SERVICE: started by hand (as root, with every capability,
//! or as a user with none) it answers its channel with a `Privileges`
//! failure and listens nowhere.

use std::process::{Command, Stdio};

use lazaret_proto::channel::{Received, pair};
use lazaret_proto::resolver::{ResolverReport, ResolverRequest, ResolverStep};

#[test]
fn it_refuses_any_privileges_but_its_own() {
    let (ours, theirs) = pair::<ResolverRequest, ResolverReport>().expect("a channel");
    let status = Command::new(env!("CARGO_BIN_EXE_lazaret-resolver"))
        .env_clear()
        .stdin(Stdio::from(theirs.into_fd()))
        .stderr(Stdio::null())
        .status()
        .expect("run the resolver");
    assert!(!status.success());
    let Received { message, .. } = ours.recv().expect("a report");
    match message {
        ResolverReport::Failed(error) => {
            assert_eq!(error.step, ResolverStep::Privileges, "{}", error.failure);
            assert!(
                error.failure.to_string().contains("CAP_NET_BIND_SERVICE"),
                "{}",
                error.failure
            );
        }
        other => panic!("the resolver acted without its privileges: {other:?}"),
    }
}
