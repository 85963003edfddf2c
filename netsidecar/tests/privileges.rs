//! The sidecar refuses to act unless it holds CAP_NET_ADMIN and nothing
//! else: started by hand (as root, with every capability, or as a user
//! with none) it answers its channel with a `Privileges` failure and
//! installs nothing.

use std::process::{Command, Stdio};

use lazaret_proto::channel::{Received, pair};
use lazaret_proto::sidecar::{SidecarReport, SidecarRequest, SidecarStep};

#[test]
fn it_refuses_any_privileges_but_net_admin() {
    let (ours, theirs) = pair::<SidecarRequest, SidecarReport>().expect("a channel");
    let status = Command::new(env!("CARGO_BIN_EXE_lazaret-netsidecar"))
        .env_clear()
        .stdin(Stdio::from(theirs.into_fd()))
        .stderr(Stdio::null())
        .status()
        .expect("run the sidecar");
    assert!(!status.success());
    let Received { message, .. } = ours.recv().expect("a report");
    match message {
        SidecarReport::Failed(error) => {
            assert_eq!(error.step, SidecarStep::Privileges, "{}", error.failure);
            assert!(
                error.failure.to_string().contains("CAP_NET_ADMIN alone"),
                "{}",
                error.failure
            );
        }
        other => panic!("the sidecar acted without its privileges: {other:?}"),
    }
}
