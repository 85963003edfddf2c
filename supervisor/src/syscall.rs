//! The system calls the supervisor's filesystem staging and session
//! processes make, behind two traits, as youki's `Syscall` does: the code
//! that stages mounts and starts `runsc exec` calls them through the trait,
//! [`Host`] and the reaper make them for real, and the unit tests give a
//! recording double that needs no root, no namespaces and no runsc.
//!
//! Owns nothing but the seam: which calls cross it, in which shape. The
//! descriptor-relative work beneath a directory the staging already holds
//! (`openat`, `openat2` with `RESOLVE_IN_ROOT`, `unlinkat`, `symlinkat`)
//! stays direct, since it needs no privilege and the tests run it on real
//! temporary directories. Trusts the kernel.

use std::ffi::CStr;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use rustix::fs::StatVfsMountFlags;
use rustix::mount::{MountFlags, MountPropagationFlags};

/// The calls that stage the sandbox's filesystem: files and directories by
/// path, and mounts.
pub trait Syscall: std::fmt::Debug + Send + Sync {
    /// `mkdir -p` (`mkdir(2)` of each missing component).
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Creates or truncates `path` and writes `bytes` (`open(2)`,
    /// `write(2)`).
    fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Creates `path` empty, or truncates it.
    fn create_file(&self, path: &Path) -> io::Result<()>;
    /// `chmod(2)`.
    fn set_mode(&self, path: &Path, mode: u32) -> io::Result<()>;
    /// `mount(2)` of a filesystem of type `fstype` whose source is named
    /// the same, with its `data`.
    fn mount(
        &self,
        fstype: &str,
        target: &Path,
        flags: MountFlags,
        data: &CStr,
    ) -> rustix::io::Result<()>;
    /// `mount(2)` with `MS_BIND`.
    fn mount_bind(&self, source: &Path, target: &Path) -> rustix::io::Result<()>;
    /// The flags of the mount at `target` (`statvfs(3)`'s `f_flag`).
    fn mount_flags(&self, target: &Path) -> rustix::io::Result<StatVfsMountFlags>;
    /// `mount(2)` with `MS_REMOUNT` and `flags`.
    fn remount(&self, target: &Path, flags: MountFlags) -> rustix::io::Result<()>;
    /// `mount(2)` changing the propagation of the mount at `target`.
    fn set_propagation(
        &self,
        target: &Path,
        flags: MountPropagationFlags,
    ) -> rustix::io::Result<()>;
}

/// The host's kernel.
#[derive(Debug, Clone, Copy, Default)]
pub struct Host;

impl Syscall for Host {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        std::fs::write(path, bytes)
    }

    fn create_file(&self, path: &Path) -> io::Result<()> {
        std::fs::File::create(path).map(drop)
    }

    fn set_mode(&self, path: &Path, mode: u32) -> io::Result<()> {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    }

    fn mount(
        &self,
        fstype: &str,
        target: &Path,
        flags: MountFlags,
        data: &CStr,
    ) -> rustix::io::Result<()> {
        rustix::mount::mount(fstype, target, fstype, flags, Some(data))
    }

    fn mount_bind(&self, source: &Path, target: &Path) -> rustix::io::Result<()> {
        rustix::mount::mount_bind(source, target)
    }

    fn mount_flags(&self, target: &Path) -> rustix::io::Result<StatVfsMountFlags> {
        rustix::fs::statvfs(target).map(|s| s.f_flag)
    }

    fn remount(&self, target: &Path, flags: MountFlags) -> rustix::io::Result<()> {
        rustix::mount::mount_remount(target, flags, "")
    }

    fn set_propagation(
        &self,
        target: &Path,
        flags: MountPropagationFlags,
    ) -> rustix::io::Result<()> {
        rustix::mount::mount_change(target, flags)
    }
}

/// How a process ended, as `waitpid(2)` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessStatus {
    /// Its exit code, when it exited.
    pub exit: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
}

impl From<rustix::process::WaitStatus> for ProcessStatus {
    fn from(status: rustix::process::WaitStatus) -> Self {
        Self {
            exit: status.exit_status(),
            signal: status.terminating_signal(),
        }
    }
}

/// The calls that start and wait for the supervisor's own children (`runsc
/// exec`, `runsc kill`): the Domain pid 1's reaper owns every wait, so a
/// child is started and waited for through it.
pub trait Processes: Send + Sync {
    /// Starts `command` (`fork(2)`, `execve(2)`), watched for its exit,
    /// and returns its pid and pidfd (`pidfd_open(2)`).
    fn spawn(&self, command: &mut Command) -> io::Result<(i32, OwnedFd)>;
    /// Waits for a child started by [`spawn`](Self::spawn) to end.
    fn wait(&self, pid: i32) -> ProcessStatus;
}

#[cfg(test)]
pub(crate) mod recording {
    //! A recording double of [`Syscall`] and [`Processes`]: it notes every
    //! call, makes the file and directory calls for real (the tests give
    //! it a temporary directory), pretends every mount succeeded, and
    //! fails the calls a test picks, with the errno it picks.

    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;

    /// One call, as made.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Call {
        CreateDir(std::path::PathBuf),
        WriteFile(std::path::PathBuf),
        CreateFile(std::path::PathBuf),
        SetMode(std::path::PathBuf, u32),
        Mount {
            fstype: String,
            target: std::path::PathBuf,
            flags: MountFlags,
            data: String,
        },
        Bind {
            source: std::path::PathBuf,
            target: std::path::PathBuf,
        },
        MountFlags(std::path::PathBuf),
        Remount(std::path::PathBuf, MountFlags),
        Propagation(std::path::PathBuf, MountPropagationFlags),
        Spawn {
            program: String,
            args: Vec<String>,
            env: Vec<(String, Option<String>)>,
        },
    }

    type Picker = Box<dyn Fn(&Call) -> bool + Send + Sync>;

    /// The double.
    pub struct Recording {
        calls: Mutex<Vec<Call>>,
        failing: Mutex<Vec<(Picker, rustix::io::Errno)>>,
        /// What `mount_flags` answers.
        pub flags: Mutex<StatVfsMountFlags>,
        /// What `wait` answers, by pid; an exit of 0 when not set.
        pub statuses: Mutex<HashMap<i32, ProcessStatus>>,
        next_pid: Mutex<i32>,
    }

    impl Default for Recording {
        fn default() -> Self {
            Self {
                calls: Mutex::default(),
                failing: Mutex::default(),
                flags: Mutex::new(StatVfsMountFlags::empty()),
                statuses: Mutex::default(),
                next_pid: Mutex::default(),
            }
        }
    }

    impl std::fmt::Debug for Recording {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Recording")
                .field("calls", &self.calls())
                .finish_non_exhaustive()
        }
    }

    impl Recording {
        /// Fails every call `pick` matches with `errno`.
        pub fn fail_when(
            &self,
            pick: impl Fn(&Call) -> bool + Send + Sync + 'static,
            errno: rustix::io::Errno,
        ) {
            self.failing.lock().unwrap().push((Box::new(pick), errno));
        }

        /// The calls made so far.
        pub fn calls(&self) -> Vec<Call> {
            self.calls.lock().unwrap().clone()
        }

        /// The mounts made so far, as (fstype, target, flags, data).
        pub fn mounts(&self) -> Vec<(String, std::path::PathBuf, MountFlags, String)> {
            self.calls()
                .into_iter()
                .filter_map(|c| match c {
                    Call::Mount {
                        fstype,
                        target,
                        flags,
                        data,
                    } => Some((fstype, target, flags, data)),
                    _ => None,
                })
                .collect()
        }

        /// The commands spawned so far, as their arguments.
        pub fn spawned(&self) -> Vec<Vec<String>> {
            self.calls()
                .into_iter()
                .filter_map(|c| match c {
                    Call::Spawn { args, .. } => Some(args),
                    _ => None,
                })
                .collect()
        }

        /// Notes `call`; the errno it is to fail with, if any.
        fn note(&self, call: Call) -> Result<(), rustix::io::Errno> {
            let failing = self
                .failing
                .lock()
                .unwrap()
                .iter()
                .find(|(pick, _)| pick(&call))
                .map(|(_, errno)| *errno);
            self.calls.lock().unwrap().push(call);
            failing.map_or(Ok(()), Err)
        }

        fn note_io(&self, call: Call) -> io::Result<()> {
            self.note(call).map_err(io::Error::from)
        }
    }

    impl Syscall for Recording {
        fn create_dir_all(&self, path: &Path) -> io::Result<()> {
            self.note_io(Call::CreateDir(path.to_owned()))?;
            Host.create_dir_all(path)
        }

        fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
            self.note_io(Call::WriteFile(path.to_owned()))?;
            Host.write_file(path, bytes)
        }

        fn create_file(&self, path: &Path) -> io::Result<()> {
            self.note_io(Call::CreateFile(path.to_owned()))?;
            Host.create_file(path)
        }

        fn set_mode(&self, path: &Path, mode: u32) -> io::Result<()> {
            self.note_io(Call::SetMode(path.to_owned(), mode))?;
            Host.set_mode(path, mode)
        }

        fn mount(
            &self,
            fstype: &str,
            target: &Path,
            flags: MountFlags,
            data: &CStr,
        ) -> rustix::io::Result<()> {
            self.note(Call::Mount {
                fstype: fstype.to_owned(),
                target: target.to_owned(),
                flags,
                data: data.to_string_lossy().into_owned(),
            })
        }

        fn mount_bind(&self, source: &Path, target: &Path) -> rustix::io::Result<()> {
            self.note(Call::Bind {
                source: source.to_owned(),
                target: target.to_owned(),
            })
        }

        fn mount_flags(&self, target: &Path) -> rustix::io::Result<StatVfsMountFlags> {
            self.note(Call::MountFlags(target.to_owned()))?;
            Ok(*self.flags.lock().unwrap())
        }

        fn remount(&self, target: &Path, flags: MountFlags) -> rustix::io::Result<()> {
            self.note(Call::Remount(target.to_owned(), flags))
        }

        fn set_propagation(
            &self,
            target: &Path,
            flags: MountPropagationFlags,
        ) -> rustix::io::Result<()> {
            self.note(Call::Propagation(target.to_owned(), flags))
        }
    }

    impl Processes for Recording {
        /// Notes the command without running it; its "pidfd" is a pipe
        /// whose writing end is closed, so it reads as ended at once.
        fn spawn(&self, command: &mut Command) -> io::Result<(i32, OwnedFd)> {
            let text = |s: &std::ffi::OsStr| s.to_string_lossy().into_owned();
            let env = command
                .get_envs()
                .map(|(k, v)| (text(k), v.map(text)))
                .collect();
            self.note_io(Call::Spawn {
                program: text(command.get_program()),
                args: command.get_args().map(text).collect(),
                env,
            })?;
            let (ended, _) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
            let mut next = self.next_pid.lock().unwrap();
            *next += 1;
            Ok((1000 + *next, ended))
        }

        fn wait(&self, pid: i32) -> ProcessStatus {
            self.statuses
                .lock()
                .unwrap()
                .get(&pid)
                .copied()
                .unwrap_or(ProcessStatus {
                    exit: Some(0),
                    signal: None,
                })
        }
    }
}
