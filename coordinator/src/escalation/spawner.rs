//! The launch spawner: the coordinator's own executable in mode `spawn`,
//! started before the coordinator confines itself, which starts each
//! approved host command's launch process on the coordinator's behalf.
//!
//! A seccomp filter is inherited by every process started after it and
//! brings `no_new_privs` with it, so a filtered coordinator could not
//! start what the developer approves (`git`, `gh`, a setuid helper) as
//! the developer would run it. This process stays unfiltered, and does one
//! thing: for each request on its channel (the launch process's argument
//! list and environment, with the executable, report pipe, output pipes
//! and working directory as descriptors), it forks with `CLONE_PARENT`, so
//! the launch process is the coordinator's child as before (its
//! parent-death signal, the coordinator's `waitid` on its pidfd), and
//! answers with the pidfd or why it could not start it. It is
//! single-threaded, as forking requires, and dies with the coordinator.
//! Trusts only the coordinator at the other end of its inherited channel.

use std::ffi::{CString, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::process::ExitCode;
use std::sync::{Mutex, OnceLock};

use lazaret_proto::channel::{ChannelError, Endpoint, Limits, Received};
use lazaret_proto::codec::WireRecord;
use serde::{Deserialize, Serialize};

use super::subreaper;

/// The argument that selects this mode of `lazaret-coordinator`.
pub const MODE: &str = "spawn";

/// A launch, as the coordinator asks for it. The descriptors come in the
/// order of [`LaunchFds`].
#[derive(Debug, Serialize, Deserialize)]
pub struct LaunchRequest {
    /// The approved command: element zero is its name.
    pub argv: Vec<Vec<u8>>,
    /// The launch process's whole environment.
    pub environment: Vec<(Vec<u8>, Vec<u8>)>,
}

impl WireRecord for LaunchRequest {
    const NAME: &'static str = "LaunchRequest";
    const MAX_ENCODED_LEN: usize = LAUNCH_LIMITS.max_bytes;
}

/// The launch channel's bounds: a request carries an argv as long as a
/// mailbox record can ([`lazaret_proto::mailbox::MAX_MAILBOX_RECORD_LEN`])
/// and the environment, within the 208 KiB a Unix `SOCK_SEQPACKET` socket
/// takes in one packet by default; five descriptors.
const LAUNCH_LIMITS: Limits = Limits {
    max_bytes: 192 * 1024,
    max_fds: 8,
};

// Room for 48 KiB of environment beside any argv a mailbox record holds.
const _: () =
    assert!(lazaret_proto::mailbox::MAX_MAILBOX_RECORD_LEN + 48 * 1024 <= LAUNCH_LIMITS.max_bytes);

/// The spawner's answer: with `Started`, the launch process's pidfd.
#[derive(Debug, Serialize, Deserialize)]
pub enum LaunchReply {
    /// Started; its pidfd is the one descriptor.
    Started,
    /// Not started: the error number of the call that failed.
    Failed(i32),
}

impl WireRecord for LaunchReply {
    const NAME: &'static str = "LaunchReply";
}

/// The descriptors of a launch, in the order they are sent.
#[derive(Debug)]
pub struct LaunchFds<'a> {
    /// The executable the command runs as `/proc/self/fd/N`.
    pub executable: BorrowedFd<'a>,
    /// Where the launch process writes how the command ended.
    pub report: BorrowedFd<'a>,
    /// The command's standard output.
    pub stdout: BorrowedFd<'a>,
    /// The command's standard error.
    pub stderr: BorrowedFd<'a>,
    /// Its working directory.
    pub directory: BorrowedFd<'a>,
}

/// The coordinator's end: one launch at a time.
#[derive(Debug)]
pub struct Spawner {
    channel: Mutex<Endpoint<LaunchRequest, LaunchReply>>,
}

/// The spawner of this coordinator, once started.
static SPAWNER: OnceLock<Spawner> = OnceLock::new();

impl Spawner {
    /// Starts this executable in mode `spawn`, which dies with this
    /// process, and keeps it as the one every launch goes through.
    pub fn start() -> std::io::Result<()> {
        // Its parent-death signal follows the thread that starts it.
        debug_assert_eq!(rustix::thread::gettid(), rustix::process::getpid());
        let (ours, theirs) = lazaret_proto::channel::pair::<LaunchRequest, LaunchReply>()
            .map_err(std::io::Error::other)?;
        let mut command = std::process::Command::new("/proc/self/exe");
        std::os::unix::process::CommandExt::arg0(&mut command, "lazaret-coordinator");
        command
            .arg(MODE)
            .env_clear()
            .stdin(std::process::Stdio::from(theirs.into_fd()))
            .stdout(std::process::Stdio::null());
        let child = crate::sys::spawn_inheriting(
            &mut command,
            crate::sys::ChildSetup {
                fds: &[],
                user_namespace: None,
                die_with_parent: true,
            },
        )?;
        // It is reaped by nobody until this process ends: it lives as long.
        drop(child);
        SPAWNER
            .set(Spawner {
                channel: Mutex::new(ours.with_limits(LAUNCH_LIMITS)),
            })
            .map_err(|_| std::io::Error::other("a launch spawner is already running"))
    }

    /// Asks the spawner to start a launch process; its pidfd.
    pub fn launch(request: &LaunchRequest, fds: &LaunchFds<'_>) -> std::io::Result<OwnedFd> {
        let spawner = SPAWNER.get().ok_or_else(|| {
            std::io::Error::other("no launch spawner runs (the coordinator did not start one)")
        })?;
        let channel = spawner.channel.lock().unwrap_or_else(|e| e.into_inner());
        let sent = [
            fds.executable,
            fds.report,
            fds.stdout,
            fds.stderr,
            fds.directory,
        ];
        // A spawner that died is not started again (this process cannot
        // execute a program any more): the launch says so.
        let failed = |e: ChannelError| match e {
            ChannelError::Disconnected => std::io::Error::other(
                "the coordinator's launch spawner has exited; `lazaret down` then `lazaret up` \
                 starts a new one",
            ),
            e => std::io::Error::other(e),
        };
        channel.send(request, &sent).map_err(failed)?;
        let Received { message, fds } = channel.recv().map_err(failed)?;
        match (message, fds.into_iter().next()) {
            (LaunchReply::Started, Some(pidfd)) => Ok(pidfd),
            (LaunchReply::Failed(errno), pidfd) => {
                // Ours to reap; it has exited or is about to.
                if let Some(pidfd) = pidfd {
                    let _ = rustix::process::waitid(
                        rustix::process::WaitId::PidFd(pidfd.as_fd()),
                        rustix::process::WaitIdOptions::EXITED,
                    );
                }
                Err(std::io::Error::from_raw_os_error(errno))
            }
            (LaunchReply::Started, None) => Err(std::io::Error::other("the spawner sent no pidfd")),
        }
    }
}

/// `lazaret-coordinator spawn`: serves launches until the coordinator
/// closes the channel or dies.
pub fn main() -> ExitCode {
    if let Err(e) = lazaret_proto::sys::close_inherited_descriptors() {
        eprintln!("lazaret-coordinator spawn: cannot close inherited descriptors: {e}");
        return ExitCode::FAILURE;
    }
    let channel = match Endpoint::<LaunchReply, LaunchRequest>::take_stdin() {
        Ok(channel) => channel.with_limits(LAUNCH_LIMITS),
        Err(e) => {
            eprintln!("lazaret-coordinator spawn: {e}; this mode is started by the coordinator");
            return ExitCode::FAILURE;
        }
    };
    // Every launch process's standard input, opened once.
    let null = match rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(null) => null,
        Err(e) => {
            eprintln!("lazaret-coordinator spawn: cannot open /dev/null: {e}");
            return ExitCode::FAILURE;
        }
    };
    loop {
        let Received { message, fds } = match channel.recv() {
            Ok(received) => received,
            // The coordinator is gone: so is every reason to be.
            Err(_) => return ExitCode::SUCCESS,
        };
        // A launch process that failed before `execve` is still the
        // coordinator's child to reap: its pidfd goes with the failure.
        let reply = match start(&message, &fds, null.as_fd()) {
            Ok((pidfd, None)) => channel.send(&LaunchReply::Started, &[pidfd.as_fd()]),
            Ok((pidfd, Some(errno))) => channel.send(&LaunchReply::Failed(errno), &[pidfd.as_fd()]),
            Err(e) => channel.send(&LaunchReply::Failed(e.raw_os_error().unwrap_or(0)), &[]),
        };
        if reply.is_err() {
            return ExitCode::FAILURE;
        }
    }
}

/// Starts one launch process as the coordinator's child: its pidfd, and
/// the error number that stopped it before `execve` if one did.
fn start(
    request: &LaunchRequest,
    fds: &[OwnedFd],
    null: BorrowedFd<'_>,
) -> std::io::Result<(OwnedFd, Option<i32>)> {
    let [executable, report, stdout, stderr, directory] = fds else {
        return Err(std::io::Error::from_raw_os_error(libc::EBADF));
    };
    let parent =
        rustix::process::getppid().ok_or_else(|| std::io::Error::from_raw_os_error(libc::ESRCH))?;
    let arguments = subreaper::Arguments {
        executable: executable.as_raw_fd(),
        report: report.as_raw_fd(),
        parent: parent.as_raw_nonzero().get(),
        argv: request
            .argv
            .iter()
            .map(|a| OsString::from_vec(a.clone()))
            .collect(),
    };
    let c = |bytes: &[u8]| {
        CString::new(bytes).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
    };
    let mut argv = vec![c(b"lazaret-coordinator")?];
    for argument in arguments.to_args() {
        argv.push(c(argument.as_bytes())?);
    }
    let environment = request
        .environment
        .iter()
        .map(|(name, value)| c(&[name.as_slice(), b"=", value.as_slice()].concat()))
        .collect::<std::io::Result<Vec<_>>>()?;
    crate::sys::fork_launch(&crate::sys::LaunchPlan {
        program: c(b"/proc/self/exe")?,
        argv,
        environment,
        stdin: null,
        stdout: stdout.as_fd(),
        stderr: stderr.as_fd(),
        directory: directory.as_fd(),
        inherited: [executable.as_fd(), report.as_fd()],
        parent: parent.as_raw_nonzero().get(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_argv_a_mailbox_record_carries_fits_a_launch_request() {
        let longest = lazaret_proto::mailbox::MAX_COMMAND_ARGV_BYTES;
        let request = LaunchRequest {
            argv: vec![b"/usr/bin/echo".to_vec(), vec![b'x'; longest]],
            environment: vec![(b"HOME".to_vec(), vec![b'h'; 4096]); 8],
        };
        let encoded = lazaret_proto::codec::encode(&request).unwrap();
        assert!(
            encoded.len() <= LAUNCH_LIMITS.max_bytes,
            "{}",
            encoded.len()
        );
        // And one packet that long passes the socket's default buffer.
        let (ours, theirs) = lazaret_proto::channel::pair::<LaunchRequest, LaunchReply>().unwrap();
        let theirs = theirs.with_limits(LAUNCH_LIMITS);
        ours.with_limits(LAUNCH_LIMITS).send(&request, &[]).unwrap();
        assert_eq!(theirs.recv().unwrap().message.argv, request.argv);
    }
}
