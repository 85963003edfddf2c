//! Starts the generation's Network Sidecar and relays its attestation.
//!
//! Owns the sidecar's launch: the binary beside the supervisor's own (the
//! supervisor's install path, never `PATH`), inside the enforcement network
//! namespace this process holds, with CAP_NET_ADMIN alone, its channel on
//! standard input. It hands the sidecar the namespace descriptor and the
//! Host Coordinator's sealed policy memfd, waits for the one report, and
//! reaps it. Trusts the Host Coordinator's request; does not trust the
//! sidecar's report beyond relaying it (the Host Coordinator verifies it).

use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use lazaret_proto::channel::{ChannelError, Received, pair};
use lazaret_proto::error_chain as chain;
use lazaret_proto::network::NetworkReadinessAttestation;
use lazaret_proto::sidecar::{AttestParameters, AttestRequest, SidecarReport, SidecarRequest};
use lazaret_proto::supervisor::FdIndex;

use rustix::thread::CapabilitySet;

use crate::sys::with_capabilities_only;

/// How long installing and probing may take, DNS timeout included.
const ATTEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The sidecar executable: beside this one.
fn sidecar_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot locate the supervisor's executable: {e}"))?;
    let path = exe.with_file_name("lazaret-netsidecar");
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "lazaret-netsidecar is not installed beside {}",
            exe.display()
        ))
    }
}

/// Runs the sidecar on `policy` in `namespace`, the network namespace
/// this process runs in, and returns its attestation, or why there is
/// none.
pub fn attest(
    parameters: AttestParameters,
    namespace: BorrowedFd<'_>,
    policy: BorrowedFd<'_>,
) -> Result<NetworkReadinessAttestation, String> {
    let binary = sidecar_binary()?;
    let (ours, theirs) = pair::<SidecarRequest, SidecarReport>()
        .map_err(|e| format!("cannot make the sidecar's channel: {}", chain(&e)))?;
    let mut command = Command::new(&binary);
    command
        .env_clear()
        .stdin(Stdio::from(theirs.into_fd()))
        .stdout(Stdio::null());
    with_capabilities_only(&mut command, CapabilitySet::NET_ADMIN, false);
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;

    let request = SidecarRequest::Attest(AttestRequest {
        parameters,
        namespace: FdIndex(0),
        policy: FdIndex(1),
    });
    let result = ours
        .send(&request, &[namespace, policy])
        .map_err(|e| format!("cannot reach the sidecar: {}", chain(&e)))
        .and_then(|()| {
            match crate::readable_within(ours.as_fd(), ATTEST_TIMEOUT) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(format!(
                        "the sidecar did not attest within {} s",
                        ATTEST_TIMEOUT.as_secs()
                    ));
                }
                Err(e) => return Err(format!("cannot wait for the sidecar: {e}")),
            }
            match ours.recv() {
                Ok(Received {
                    message: SidecarReport::Attested(attestation),
                    ..
                }) => Ok(*attestation),
                Ok(Received {
                    message: SidecarReport::Failed(error),
                    ..
                }) => Err(format!("{:?}: {}", error.step, error.detail)),
                Err(ChannelError::Disconnected) => {
                    Err("the sidecar exited without a report".to_owned())
                }
                Err(e) => Err(format!("bad report from the sidecar: {}", chain(&e))),
            }
        });
    if result.is_err() {
        let _ = child.kill();
    }
    let _ = child.wait();
    result
}
