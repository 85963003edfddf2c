//! Fetching registry images with `skopeo`, bounded in time.
//!
//! A registry reference is first asked for its manifest (`skopeo inspect
//! --raw`) under a short timeout, which both tells whether a registry is
//! reachable at all and names the manifest digest for this host's
//! platform; the image is then copied by that digest into a local OCI
//! layout (`skopeo copy docker://NAME@DIGEST oci:DIR:TAG`) under a longer
//! one. Either `skopeo` is killed (its whole process group) when its time
//! is up: a fetch never hangs.
//!
//! Timeouts: `LAZARET_SKOPEO_TIMEOUT_SECS` (default 60) for the manifest
//! request, `LAZARET_SKOPEO_COPY_TIMEOUT_SECS` (default 3600) for the copy.
//!
//! Trust: what skopeo writes is a layout like any other; the layout reader
//! verifies every blob. skopeo's own policy (`/etc/containers/policy.json`)
//! and credentials apply.

use std::io::Read;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use lazaret_hostfs::programs;
use lazaret_proto::ids::ManifestDigest;

use super::ImageError;
use super::reference::RegistryReference;

/// The environment variable bounding the manifest request, in seconds.
pub const PROBE_TIMEOUT_VAR: &str = "LAZARET_SKOPEO_TIMEOUT_SECS";
/// The environment variable bounding the copy, in seconds.
pub const COPY_TIMEOUT_VAR: &str = "LAZARET_SKOPEO_COPY_TIMEOUT_SECS";
/// The most of each output stream kept.
const MAX_OUTPUT: u64 = 8 << 20;

fn timeout_from(var: &str, default: u64) -> Duration {
    let secs = std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(default);
    Duration::from_secs(secs)
}

/// How a bounded command ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// It exited.
    Exited {
        status: ExitStatus,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
    },
    /// Its time ran out and it was killed.
    TimedOut { stderr: Vec<u8> },
}

fn drain<R: Read + Send + 'static>(stream: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(stream) = stream {
            let _ = stream.take(MAX_OUTPUT).read_to_end(&mut out);
        }
        out
    })
}

/// Runs `command` in its own process group with stdin closed, collecting
/// its output; when `timeout` passes first, kills the group and reports
/// [`Outcome::TimedOut`].
pub(crate) fn run_bounded(mut command: Command, timeout: Duration) -> std::io::Result<Outcome> {
    use std::os::unix::process::CommandExt;
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = command.spawn()?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Outcome::Exited {
                status,
                stdout: stdout.join().unwrap_or_default(),
                stderr: stderr.join().unwrap_or_default(),
            });
        }
        if Instant::now() >= deadline {
            // The child is not reaped yet, so its pid (and its process
            // group) still names it and nothing else.
            if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = child.kill();
            let _ = child.wait();
            let _ = stdout.join();
            return Ok(Outcome::TimedOut {
                stderr: stderr.join().unwrap_or_default(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// skopeo's message, without its `time=... level=fatal msg=` decoration.
fn message(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let line = match line.find("msg=\"") {
        Some(i) => line[i + 5..].trim_end().trim_end_matches('"'),
        None => line.trim(),
    };
    line.replace("\\\"", "\"")
}

/// Whether skopeo's message says the registry could not be reached at all.
fn is_unreachable(message: &str) -> bool {
    const SIGNS: &[&str] = &[
        "no such host",
        "dial tcp",
        "dial udp",
        "connection refused",
        "network is unreachable",
        "no route to host",
        "i/o timeout",
        "tls handshake timeout",
        "temporary failure in name resolution",
        "server misbehaving",
        "connection reset",
        "timeout awaiting response",
    ];
    let lower = message.to_lowercase();
    SIGNS.iter().any(|s| lower.contains(s))
}

/// skopeo at its fixed, trusted path with a cleared environment plus
/// [`SKOPEO_ENVIRONMENT`](programs::SKOPEO_ENVIRONMENT), ready for
/// `args`.
fn skopeo(args: &[&str]) -> Result<Command, ImageError> {
    let path = programs::skopeo()
        .map_err(|e| ImageError::UntrustedProgram {
            detail: lazaret_proto::error_chain(&e),
        })?
        .ok_or_else(|| ImageError::SkopeoMissing {
            source: std::io::ErrorKind::NotFound.into(),
        })?;
    let mut command = programs::networked_command(&path, programs::SKOPEO_ENVIRONMENT);
    command.args(args);
    Ok(command)
}

/// Runs skopeo for at most the seconds `timeout_var` sets (else
/// `default_secs`). A manifest request that times out means the registry is
/// unreachable; a copy that times out was too slow, and says how to wait
/// longer.
fn run_skopeo(
    command: Command,
    (timeout_var, default_secs): (&'static str, u64),
    reference: &str,
) -> Result<Vec<u8>, ImageError> {
    let timeout = timeout_from(timeout_var, default_secs);
    let outcome = run_bounded(command, timeout).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            ImageError::SkopeoMissing { source }
        } else {
            ImageError::Io {
                operation: "run skopeo for",
                path: reference.to_owned(),
                source,
            }
        }
    })?;
    match outcome {
        Outcome::Exited { status, stdout, .. } if status.success() => Ok(stdout),
        Outcome::Exited { stderr, .. } => {
            let detail = message(&stderr);
            if is_unreachable(&detail) {
                Err(ImageError::RegistryUnreachable {
                    reference: reference.to_owned(),
                    detail,
                })
            } else {
                Err(ImageError::RegistryFetch {
                    reference: reference.to_owned(),
                    detail,
                })
            }
        }
        Outcome::TimedOut { stderr } => {
            let said = message(&stderr);
            let mut detail = format!(
                "skopeo did not finish within {} s and was stopped (set {timeout_var} to \
                 wait longer)",
                timeout.as_secs()
            );
            if !said.is_empty() {
                detail.push_str(&format!("; it said: {said}"));
            }
            let reference = reference.to_owned();
            if timeout_var == COPY_TIMEOUT_VAR {
                Err(ImageError::RegistryFetch { reference, detail })
            } else {
                Err(ImageError::RegistryUnreachable { reference, detail })
            }
        }
    }
}

/// Asks the registry which manifest `reference` names for this host's
/// platform. A reference pinned by digest needs no request.
pub fn resolve_registry(reference: &RegistryReference) -> Result<ManifestDigest, ImageError> {
    if let Some(digest) = reference.digest {
        return Ok(digest);
    }
    let shown = reference.to_string();
    let target = format!("docker://{shown}");
    let raw = run_skopeo(
        skopeo(&["inspect", "--retry-times", "0", "--raw", &target])?,
        (PROBE_TIMEOUT_VAR, 60),
        &shown,
    )?;
    super::layout::select_raw(&raw, &shown)
}

/// Copies the image `reference` names, pinned to `digest`, into a new OCI
/// layout at `destination` (which must not exist), tagged `tag`.
pub fn copy_registry(
    reference: &RegistryReference,
    digest: ManifestDigest,
    destination: &Path,
    tag: &str,
) -> Result<(), ImageError> {
    copy_with_skopeo(
        &format!("docker://{}", reference.pinned(digest)),
        destination,
        tag,
        &reference.to_string(),
    )
}

/// `skopeo copy SOURCE oci:DESTINATION:TAG`, bounded by
/// `LAZARET_SKOPEO_COPY_TIMEOUT_SECS`. `source` is any skopeo transport
/// reference (`docker://...`, `oci:...`); `shown` names it in errors.
pub fn copy_with_skopeo(
    source: &str,
    destination: &Path,
    tag: &str,
    shown: &str,
) -> Result<(), ImageError> {
    let dest = format!("oci:{}:{tag}", destination.display());
    run_skopeo(
        skopeo(&["copy", "--quiet", "--retry-times", "0", source, &dest])?,
        (COPY_TIMEOUT_VAR, 3600),
        shown,
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_run_kills_on_timeout() {
        let mut command = Command::new("sh");
        command.args(["-c", "sleep 30 & sleep 30"]);
        let started = Instant::now();
        let outcome = run_bounded(command, Duration::from_millis(300)).unwrap();
        assert!(matches!(outcome, Outcome::TimedOut { .. }), "{outcome:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn bounded_run_collects_output() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo out; echo err >&2; exit 3"]);
        match run_bounded(command, Duration::from_secs(10)).unwrap() {
            Outcome::Exited {
                status,
                stdout,
                stderr,
            } => {
                assert_eq!(status.code(), Some(3));
                assert_eq!(stdout, b"out\n");
                assert_eq!(stderr, b"err\n");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn skopeo_messages_are_classified() {
        let stderr = br#"time="2026-01-01T00:00:00Z" level=fatal msg="initializing source docker://registry.invalid/x:1: pinging container registry registry.invalid: Get \"https://registry.invalid/v2/\": dial tcp: lookup registry.invalid on 10.0.0.53:53: no such host""#;
        let detail = message(stderr);
        assert!(detail.starts_with("initializing source docker://registry.invalid/x:1"));
        assert!(is_unreachable(&detail));
        assert!(!is_unreachable(
            "reading manifest 1 in registry.example/x: manifest unknown"
        ));
    }
}
