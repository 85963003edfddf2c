//! Each role's system calls, confined: the allow list a role builds beside
//! its code, and installing it as a seccomp filter.
//!
//! Owns the group every role shares ([`AllowList::runtime`]: what Rust's
//! standard library, glibc's allocator and threads, and a current-thread
//! tokio runtime call), the rules that narrow a call by its arguments, and
//! the installation: `RLIMIT_CORE` to zero (a killed role holding a
//! credential leaves no core file), `no_new_privs`, then two filters on
//! every thread of the process (`SECCOMP_FILTER_FLAG_TSYNC`). The first
//! answers `clone3` with `ENOSYS`, so glibc falls back to `clone`, whose
//! flags a filter can read; the second allows the list and kills the whole
//! process (`SECCOMP_RET_KILL_PROCESS`) on any other call, which its
//! parent and the pidfd watchers then see as any death, by `SIGSYS`.
//!
//! Debug builds only: with `LAZARET_SECCOMP=log`, a call outside a list is
//! logged by the kernel (audit type 1326) and allowed, so a list can be
//! measured; with `LAZARET_FORBIDDEN_CALL=ROLE[:CALL]`, the role `ROLE`
//! makes a call no list allows right after installing its filter, which the
//! tests use to see the filter kill it. Release builds read neither.
//! Trusts the role that builds its list; nothing here reads sandbox bytes.

// The lists name x86-64's system calls (`open`, `poll`, `dup2`, ...) and
// the filter checks for that architecture.
#[cfg(not(target_arch = "x86_64"))]
compile_error!("Lazaret's seccomp allow lists are written for x86-64 only");

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The variable that makes a debug build log calls outside a list
/// instead of killing (`log`).
pub const MODE_VARIABLE: &str = "LAZARET_SECCOMP";

/// The variable that makes a debug build's role attempt a forbidden call.
pub const FORBIDDEN_CALL_VARIABLE: &str = "LAZARET_FORBIDDEN_CALL";

/// What is said of a process its filter killed, after its name.
pub const KILLED: &str = "was killed by SIGSYS: it made a system call outside its seccomp \
    allow list, which is a bug in Lazaret (the kernel's log names the call: `journalctl -k` or \
    `dmesg`, audit type=1326)";

/// The exit status of the supervisor's stage one when the Domain's pid 1
/// (stage two) was killed by its filter: 128 + `SIGSYS`, as a shell says.
pub const PID1_KILLED_EXIT: u8 = 128 + 31;

/// Why a role's filter could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The list could not be compiled to a BPF program.
    #[error("cannot build the seccomp filter of {role}: {source}")]
    Build {
        /// The role whose list it is.
        role: &'static str,
        /// What the builder said.
        #[source]
        source: seccompiler::BackendError,
    },
    /// The kernel refused the filter.
    #[error(
        "cannot install the seccomp filter of {role}: {source}; Lazaret needs a kernel with \
         seccomp filters (CONFIG_SECCOMP_FILTER, which distribution kernels have) and a \
         process no other filter forbids seccomp(2) to"
    )]
    Install {
        /// The role whose list it is.
        role: &'static str,
        /// What the kernel said.
        #[source]
        source: seccompiler::Error,
    },
}

/// A role's allowed system calls, each with the argument rules it must
/// meet (none: any arguments).
#[derive(Debug)]
pub struct AllowList {
    role: &'static str,
    calls: BTreeMap<i64, Vec<SeccompRule>>,
}

/// The namespace flags of `clone(2)`: no role makes a namespace after its
/// filter is on. (`CLONE_NEWTIME` is left out: in `clone(2)` its bit is
/// part of the exit signal.)
const CLONE_NAMESPACES: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;

impl AllowList {
    /// The calls of the process itself, which every role makes: Rust's
    /// standard library, glibc (allocator, threads, abort), a
    /// current-thread tokio runtime, and the log lines to standard error.
    pub fn runtime(role: &'static str) -> Self {
        let mut list = Self {
            role,
            calls: BTreeMap::new(),
        };
        // Descriptors already open: reads, writes (the log included),
        // closing, and their flags.
        list.allow(&[
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_readv,
            libc::SYS_writev,
            libc::SYS_close,
            libc::SYS_fcntl,
            libc::SYS_fstat,
            libc::SYS_statx,
            libc::SYS_newfstatat,
        ]);
        // Memory: the allocator, thread stacks and their guard pages.
        list.allow(&[
            libc::SYS_brk,
            libc::SYS_mmap,
            libc::SYS_munmap,
            libc::SYS_mremap,
            libc::SYS_mprotect,
            libc::SYS_madvise,
        ]);
        // Waiting and time: locks, a call restarted after a signal,
        // sleeps, clocks (outside the vDSO too), and randomness (hash
        // maps' keys, TLS).
        list.allow(&[
            libc::SYS_futex,
            libc::SYS_restart_syscall,
            libc::SYS_sched_yield,
            libc::SYS_nanosleep,
            libc::SYS_clock_nanosleep,
            libc::SYS_clock_gettime,
            libc::SYS_getrandom,
        ]);
        // The event loop: tokio's epoll and its waker, and plain polls.
        list.allow(&[
            libc::SYS_epoll_create1,
            libc::SYS_epoll_ctl,
            libc::SYS_epoll_wait,
            libc::SYS_epoll_pwait,
            libc::SYS_eventfd2,
            libc::SYS_poll,
            libc::SYS_ppoll,
        ]);
        // Threads and signals: starting a thread (`clone3` is answered
        // ENOSYS by the first filter, so glibc falls back to `clone`, whose
        // flags may not ask for a namespace), its set-up, signal handlers,
        // abort on a panic (`tgkill` of itself), and exits.
        list.allow(&[
            libc::SYS_clone3,
            libc::SYS_set_robust_list,
            libc::SYS_rseq,
            libc::SYS_sigaltstack,
            libc::SYS_rt_sigaction,
            libc::SYS_rt_sigprocmask,
            libc::SYS_rt_sigreturn,
            libc::SYS_gettid,
            libc::SYS_getpid,
            libc::SYS_tgkill,
            libc::SYS_sched_getaffinity,
            libc::SYS_exit,
            libc::SYS_exit_group,
        ]);
        list.allow_when(
            libc::SYS_clone,
            vec![rule(vec![condition(
                0,
                SeccompCmpOp::MaskedEq(CLONE_NAMESPACES),
                0,
            )])],
        );
        // Making a socket it was handed non-blocking (the standard
        // library's `set_nonblocking`).
        list.allow_when(libc::SYS_ioctl, vec![arg_is(1, libc::FIONBIO)]);
        // Naming a thread (tokio's and fuser's workers).
        list.allow_when_first_is(libc::SYS_prctl, &[libc::PR_SET_NAME]);
        list
    }

    /// Allows each of `calls` with any arguments.
    pub fn allow(&mut self, calls: &[i64]) -> &mut Self {
        for &call in calls {
            self.calls.insert(call, Vec::new());
        }
        self
    }

    /// Allows `call` when its arguments meet any one of `rules`, in
    /// addition to the rules it has. A call already allowed with any
    /// arguments stays so.
    pub fn allow_when(&mut self, call: i64, rules: Vec<SeccompRule>) -> &mut Self {
        match self.calls.get_mut(&call) {
            Some(existing) if existing.is_empty() => {}
            Some(existing) => existing.extend(rules),
            None => {
                self.calls.insert(call, rules);
            }
        }
        self
    }

    /// Allows `call` when its first argument (a socket's family, a
    /// `prctl` option) is one of `values`.
    pub fn allow_when_first_is(&mut self, call: i64, values: &[i32]) -> &mut Self {
        // The kernel's arguments are the C int's bits, compared as 32 bits.
        let rules = values.iter().map(|&v| arg_is(0, v as u32 as u64)).collect();
        self.allow_when(call, rules)
    }

    /// Whether `call` is allowed with some arguments.
    pub fn allows(&self, call: i64) -> bool {
        self.calls.contains_key(&call)
    }

    /// Compiles the list and installs it on every thread of this process,
    /// for good: everything it starts from now on inherits it. Then, in a
    /// debug build asked to, attempts a forbidden call.
    pub fn install(self) -> Result<(), SeccompError> {
        let role = self.role;
        let build = |source| SeccompError::Build { role, source };
        let arch = TargetArch::x86_64;
        let clone3 = SeccompFilter::new(
            [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )
        .map_err(build)?;
        let list = SeccompFilter::new(self.calls, mismatch_action(), SeccompAction::Allow, arch)
            .map_err(build)?;
        let clone3 = BpfProgram::try_from(clone3).map_err(build)?;
        let list = BpfProgram::try_from(list).map_err(build)?;
        // A role killed by its filter leaves no core file: some hold
        // credentials in memory.
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Core,
            rustix::process::Rlimit {
                current: Some(0),
                maximum: Some(0),
            },
        );
        let install = |source| SeccompError::Install { role, source };
        // Each sets `no_new_privs` first.
        seccompiler::apply_filter_all_threads(&clone3).map_err(install)?;
        seccompiler::apply_filter_all_threads(&list).map_err(install)?;
        attempt_forbidden_call(role);
        Ok(())
    }
}

/// What a call outside the list gets: the whole process killed, or in a
/// debug build asked to measure, a line in the kernel's log.
fn mismatch_action() -> SeccompAction {
    #[cfg(debug_assertions)]
    if std::env::var(MODE_VARIABLE).as_deref() == Ok("log") {
        return SeccompAction::Log;
    }
    SeccompAction::KillProcess
}

/// One rule of the conditions, all of which must hold.
pub fn rule(conditions: Vec<SeccompCondition>) -> SeccompRule {
    // Only an empty vector is refused, and no caller passes one.
    SeccompRule::new(conditions).expect("a rule has conditions")
}

/// Argument `index` (its low 32 bits) compared with `value` by `op`.
pub fn condition(index: u8, op: SeccompCmpOp, value: u64) -> SeccompCondition {
    // Only an index above 5 is refused, and every caller names one of the
    // six arguments.
    SeccompCondition::new(index, SeccompCmpArgLen::Dword, op, value)
        .expect("a system call has six arguments")
}

/// The rule that argument `index` is `value`.
pub fn arg_is(index: u8, value: u64) -> SeccompRule {
    rule(vec![condition(index, SeccompCmpOp::Eq, value)])
}

/// The debug variables of this module that are set, for a role started
/// with a cleared environment (debug builds only; none in a release).
pub fn debug_variables() -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    if !cfg!(debug_assertions) {
        return Vec::new();
    }
    [MODE_VARIABLE, FORBIDDEN_CALL_VARIABLE]
        .into_iter()
        .filter_map(|name| std::env::var_os(name).map(|value| (name.into(), value)))
        .collect()
}

/// Copies [`debug_variables`] into `command`'s environment.
pub fn pass_debug_variables(command: &mut std::process::Command) {
    command.envs(debug_variables());
}

/// Removes the debug variables of this module from `command`'s
/// environment: for a program that is no role (an approved host command).
pub fn remove_debug_variables(command: &mut std::process::Command) {
    for name in [MODE_VARIABLE, FORBIDDEN_CALL_VARIABLE] {
        command.env_remove(name);
    }
}

/// The forbidden calls a test may ask a role to attempt, each with
/// arguments that would do nothing if it were allowed (debug builds).
#[cfg(debug_assertions)]
const FORBIDDEN_CALLS: &[(&str, i64)] = &[
    ("kexec_load", libc::SYS_kexec_load),
    ("ptrace", libc::SYS_ptrace),
    ("mount", libc::SYS_mount),
    ("bpf", libc::SYS_bpf),
    ("execve", libc::SYS_execve),
];

/// In a debug build whose environment names `role`, attempts the call it
/// names (`kexec_load` when it names none). A role whose filter works is
/// killed here.
fn attempt_forbidden_call(role: &str) {
    #[cfg(debug_assertions)]
    if let Ok(asked) = std::env::var(FORBIDDEN_CALL_VARIABLE) {
        let (named, call) = asked.split_once(':').unwrap_or((&asked, "kexec_load"));
        if named == role {
            if let Some(&(_, number)) = FORBIDDEN_CALLS.iter().find(|(name, _)| *name == call) {
                eprintln!("{role}: attempting {call}, which its seccomp filter forbids");
                let result = crate::sys::call_with_no_effect(number);
                eprintln!("{role}: {call} was not stopped by its seccomp filter: {result:?}");
            }
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = role;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child the next test starts.
    const CHILD: &str = "LAZARET_SECCOMP_TEST_CHILD";

    #[test]
    #[cfg(debug_assertions)]
    fn each_forbidden_call_kills_the_process_by_sigsys() {
        use std::os::unix::process::ExitStatusExt;
        if std::env::var_os(CHILD).is_some() {
            // The child: installs the shared group, which attempts the
            // call its environment names.
            AllowList::runtime("a test").install().unwrap();
            std::process::exit(0);
        }
        let name = "seccomp::tests::each_forbidden_call_kills_the_process_by_sigsys";
        for &(call, _) in FORBIDDEN_CALLS {
            let status = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", name, "--test-threads=1", "--nocapture"])
                .env(CHILD, "1")
                .env(FORBIDDEN_CALL_VARIABLE, format!("a test:{call}"))
                .env_remove(MODE_VARIABLE)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap();
            assert_eq!(status.signal(), Some(libc::SIGSYS), "{call}: {status:?}");
            assert!(!status.core_dumped(), "{call} left a core file");
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    fn no_list_allows_a_forbidden_call() {
        let list = AllowList::runtime("a test");
        for &(name, number) in FORBIDDEN_CALLS {
            assert!(!list.allows(number), "{name} is in the shared group");
        }
    }

    #[test]
    fn a_narrowed_call_stays_open_once_opened() {
        let mut list = AllowList::runtime("a test");
        list.allow(&[libc::SYS_ioctl]);
        list.allow_when(libc::SYS_ioctl, vec![arg_is(1, 1)]);
        assert!(list.calls[&libc::SYS_ioctl].is_empty());
        list.allow_when(libc::SYS_socket, vec![arg_is(0, 1)]);
        list.allow_when(libc::SYS_socket, vec![arg_is(0, 2)]);
        assert_eq!(list.calls[&libc::SYS_socket].len(), 2);
    }

    #[test]
    fn the_shared_group_compiles() {
        let list = AllowList::runtime("a test");
        let filter = SeccompFilter::new(
            list.calls,
            SeccompAction::KillProcess,
            SeccompAction::Allow,
            TargetArch::x86_64,
        )
        .unwrap();
        assert!(!BpfProgram::try_from(filter).unwrap().is_empty());
    }
}
