//! Starts the generation's Network Sidecar and relays its attestation.
//!
//! Owns the sidecar's launch: the binary beside the supervisor's own (the
//! supervisor's install path, never `PATH`), inside the enforcement network
//! namespace this process holds, with CAP_NET_ADMIN alone, its channel on
//! standard input. It hands the sidecar the namespace descriptor and the
//! Host Coordinator's sealed policy memfd, waits for the one report, and
//! reaps it. Trusts the Host Coordinator's request; does not trust the
//! sidecar's report beyond relaying it (the Host Coordinator verifies it).

use std::os::fd::BorrowedFd;
use std::time::Duration;

use lazaret_proto::network::NetworkReadinessAttestation;
use lazaret_proto::sidecar::{AttestParameters, AttestRequest, SidecarReport, SidecarRequest};
use lazaret_proto::supervisor::FdIndex;
use rustix::thread::CapabilitySet;

use crate::helper::Helper;

/// How long installing and probing may take, DNS timeout included.
const ATTEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the sidecar on `policy` in `namespace`, the network namespace
/// this process runs in, and returns its attestation, or why there is
/// none.
pub fn attest(
    parameters: AttestParameters,
    namespace: BorrowedFd<'_>,
    policy: BorrowedFd<'_>,
) -> Result<NetworkReadinessAttestation, String> {
    let sidecar = Helper::<SidecarRequest, SidecarReport>::start(
        "lazaret-netsidecar",
        "the sidecar",
        CapabilitySet::NET_ADMIN,
        false,
    )?;
    let request = SidecarRequest::Attest(AttestRequest {
        parameters,
        namespace: FdIndex(0),
        policy: FdIndex(1),
    });
    let result = sidecar
        .send(&request, &[namespace, policy])
        .and_then(|()| sidecar.report(ATTEST_TIMEOUT))
        .and_then(|report| match report {
            SidecarReport::Attested(attestation) => Ok(*attestation),
            SidecarReport::Failed(error) => Err(format!("{:?}: {}", error.step, error.detail)),
        });
    sidecar.finish(result)
}
