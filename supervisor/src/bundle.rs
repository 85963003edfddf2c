//! The OCI bundle runsc runs: `config.json` for the sandbox's init.
//!
//! Owns the runtime specification: which namespaces runsc creates (pid, ipc,
//! uts, mount — never network: the sandbox uses the Domain network namespace
//! it is started in), which capabilities sandbox processes get (never
//! CAP_NET_ADMIN or CAP_NET_RAW), the bounds on processes and descriptors,
//! and the mounts that place the staged filesystem at its sandbox paths
//! (and a bounded tmpfs at `/tmp`). The init's environment is `PATH` and the
//! profile's resolved variables, which reach the supervisor in a sealed
//! memfd; the bundle holding them is on the Domain mount namespace's private
//! tmpfs, in memory only. Trusts the staged paths it is given.

use std::os::fd::BorrowedFd;
use std::path::Path;

use lazaret_proto::config::VolumeAccess;
use lazaret_proto::layout::{CONTROL_AREA, SANDBOX_CAPABILITIES as CAPABILITIES, WORKSPACE};
use lazaret_proto::mailbox::MAILBOX_AREA;
use serde_json::{Value, json};

use crate::mounts::Staged;

/// The most processes (and threads) of one uid inside the sandbox, as
/// gVisor counts them: a fork bomb inside stops here with `EAGAIN`. Root
/// inside cannot raise it (no `CAP_SYS_RESOURCE`); processes it moves to
/// other uids meet the host's bound, [`crate::DOMAIN_TASKS`], which holds
/// about seven uids at this bound on systrap (about 1,150 host tasks
/// each).
pub const SANDBOX_PROCESSES: u64 = 512;

/// The size of the sandbox's own `/tmp`: a tmpfs in gVisor's memory, like
/// the root filesystem's upper ([`crate::mounts::ROOT_UPPER_SIZE`]) a
/// bound on what the sandbox may keep in memory there until `down`;
/// writing more fails inside with `ENOSPC`.
pub const TMP_SIZE: &str = "1g";

/// The `PATH` of sandbox processes: the usual directories, then the
/// control area's programs (`lazaret-escalate`), last so that nothing of
/// the image is shadowed.
pub const SANDBOX_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/run/lazaret/bin";

fn bind(destination: &str, source: &Path, read_only: bool) -> Value {
    let mut options = vec!["rbind", "nosuid", "nodev"];
    options.push(if read_only { "ro" } else { "rw" });
    json!({
        "destination": destination,
        "type": "bind",
        "source": source,
        "options": options,
    })
}

/// Why the sandbox environment could not be read, or the bundle written.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// The environment memfd could not be read, or is not sealed.
    #[error("the sandbox environment")]
    Environment(#[source] lazaret_proto::memfd::MemfdError),
    /// An entry is not UTF-8.
    #[error("an environment entry is not UTF-8")]
    NotUtf8,
    /// An entry sets `PATH`, which the sandbox's own is.
    #[error("the environment may not set PATH")]
    SetsPath,
    /// An entry has no name.
    #[error("an environment entry has no name")]
    Unnamed,
    /// The runtime specification could not be encoded.
    #[error("cannot encode the runtime specification")]
    Encode(#[source] serde_json::Error),
    /// A bundle file could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
}

/// The most environment bytes a sandbox takes (Linux's own limit for the
/// arguments and environment of one program).
const MAX_ENVIRONMENT: usize = 2 * 1024 * 1024;

/// Reads the sandbox environment from the coordinator's sealed memfd:
/// `NAME=value` entries, each ended by a NUL byte. Refuses a memfd that is
/// not sealed against writes, or an entry without a name.
pub fn read_environment(fd: BorrowedFd<'_>) -> Result<Vec<String>, BundleError> {
    let bytes =
        lazaret_proto::memfd::read_sealed(fd, MAX_ENVIRONMENT).map_err(BundleError::Environment)?;
    parse_environment(&bytes)
}

/// The `NAME=value` entries of `bytes`, each ended by a NUL byte.
fn parse_environment(bytes: &[u8]) -> Result<Vec<String>, BundleError> {
    let mut entries = Vec::new();
    for entry in bytes.split(|b| *b == 0).filter(|e| !e.is_empty()) {
        let entry = String::from_utf8(entry.to_vec()).map_err(|_| BundleError::NotUtf8)?;
        match entry.split_once('=') {
            Some(("PATH", _)) => return Err(BundleError::SetsPath),
            Some((name, _)) if !name.is_empty() => entries.push(entry),
            _ => return Err(BundleError::Unnamed),
        }
    }
    Ok(entries)
}

/// Where the sandbox's `lazaret-init` is, inside it.
pub fn sandbox_init() -> String {
    format!("{CONTROL_AREA}/bin/lazaret-init")
}

/// The sandbox's first process: `lazaret-init` with where it writes each
/// session leader's identity (the mailboxes, the variable naming a
/// process's session, the identity's file name).
fn init_args() -> [String; 4] {
    [
        sandbox_init(),
        MAILBOX_AREA.to_owned(),
        lazaret_proto::mailbox::SESSION_ENV.to_owned(),
        lazaret_proto::mailbox::GUEST_FILE.to_owned(),
    ]
}

/// An OCI process running `args` as root of the sandbox with `env` in
/// `cwd`, with the sandbox's capabilities (never CAP_NET_ADMIN or
/// CAP_NET_RAW) and no new privileges, plus the fields in `extra`: the
/// sandbox's init and every session process start from this one shape.
pub fn process(args: &[String], env: Vec<String>, cwd: &str, extra: Value) -> Value {
    let mut process = json!({
        "user": {"uid": 0, "gid": 0},
        "args": args,
        "env": env,
        "cwd": cwd,
        "capabilities": {
            "bounding": CAPABILITIES,
            "effective": CAPABILITIES,
            "permitted": CAPABILITIES,
        },
        "noNewPrivileges": true,
    });
    if let (Some(fields), Value::Object(extra)) = (process.as_object_mut(), extra) {
        fields.extend(extra);
    }
    process
}

/// The runtime specification of the sandbox.
pub fn spec(staged: &Staged, hostname: &str, environment: &[String]) -> Value {
    let mut env = vec![format!("PATH={SANDBOX_PATH}")];
    env.extend(environment.iter().cloned());
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": ["nosuid", "noexec", "nodev", "ro"]}),
    ];
    // runsc would otherwise mount a tmpfs of no bound at an empty `/tmp`;
    // before every other mount, so one beneath `/tmp` lands on it.
    if staged.private_tmp {
        mounts.push(
            json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777", format!("size={TMP_SIZE}")]}),
        );
    }
    for (sandbox_path, source) in &staged.anchors {
        mounts.push(bind(sandbox_path, source, false));
    }
    mounts.push(bind(WORKSPACE, &staged.workspace, false));
    for (sandbox_path, source, access) in &staged.volumes {
        mounts.push(bind(
            sandbox_path,
            source,
            *access == VolumeAccess::ReadOnly,
        ));
    }
    // The control area also holds `resolv.conf`, which the image's
    // `/etc/resolv.conf` links to (see `mounts::stage`).
    mounts.push(bind(CONTROL_AREA, &staged.control, true));
    // Inside the read-only control area, the one place the sandbox writes:
    // its sessions' mailboxes.
    let mut mailbox = bind(MAILBOX_AREA, &staged.mailbox, false);
    if let Some(Value::Array(options)) = mailbox.get_mut("options") {
        options.push(json!("noexec"));
    }
    mounts.push(mailbox);

    json!({
        "ociVersion": "1.0.2",
        "process": process(&init_args(), env, "/", json!({
            "terminal": false,
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024},
                {"type": "RLIMIT_NPROC", "hard": SANDBOX_PROCESSES, "soft": SANDBOX_PROCESSES},
            ],
        })),
        "root": {"path": staged.rootfs, "readonly": false},
        "hostname": hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
        },
    })
}

/// Writes `config.json` into the staged bundle directory. It lives on the
/// Domain mount namespace's private tmpfs: in memory, never on disk, and
/// out of the host's view.
pub fn write(staged: &Staged, hostname: &str, environment: &[String]) -> Result<(), BundleError> {
    let text = serde_json::to_vec_pretty(&spec(staged, hostname, environment))
        .map_err(BundleError::Encode)?;
    let path = staged.bundle.join("config.json");
    std::fs::write(&path, text).map_err(|source| BundleError::Write { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn staged(private_tmp: bool, volume: &str) -> Staged {
        let at = |p: &str| PathBuf::from(format!("/staging/{p}"));
        Staged {
            rootfs: at("root"),
            anchors: vec![("/root".into(), at("anchor/0"))],
            workspace: at("workspace"),
            volumes: vec![(volume.into(), at("volume/0"), VolumeAccess::ReadWrite)],
            control: at("control"),
            mailbox: at("mailbox"),
            bundle: at("bundle"),
            runsc_root: at("runsc"),
            private_tmp,
        }
    }

    fn destinations(spec: &Value) -> Vec<String> {
        spec["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn tmp_is_a_bounded_tmpfs_under_every_other_mount() {
        let spec = spec(&staged(true, "/tmp/cache"), "h", &[]);
        let mounts = spec["mounts"].as_array().unwrap();
        let tmp = mounts.iter().find(|m| m["destination"] == "/tmp").unwrap();
        assert_eq!(tmp["type"], "tmpfs");
        assert!(
            tmp["options"]
                .as_array()
                .unwrap()
                .contains(&json!(format!("size={TMP_SIZE}"))),
            "{tmp}"
        );
        let order = destinations(&spec);
        let at = |d: &str| order.iter().position(|o| o == d).unwrap();
        assert!(
            at("/tmp") < at("/tmp/cache") && at("/tmp") < at("/root"),
            "{order:?}"
        );
    }

    #[test]
    fn tmp_is_left_to_what_is_mounted_there() {
        let spec = spec(&staged(false, "/tmp"), "h", &[]);
        let order = destinations(&spec);
        assert_eq!(
            order.iter().filter(|d| *d == "/tmp").count(),
            1,
            "{order:?}"
        );
        let tmp = spec["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/tmp")
            .unwrap();
        assert_eq!(tmp["type"], "bind", "{tmp}");
    }

    #[test]
    fn the_environment_is_named_entries_without_path() {
        assert_eq!(
            parse_environment(b"EDITOR=vi\0LANG=C.UTF-8\0\0").unwrap(),
            vec!["EDITOR=vi".to_owned(), "LANG=C.UTF-8".to_owned()]
        );
        assert_eq!(parse_environment(b"").unwrap(), Vec::<String>::new());
        for (bytes, refused) in [
            (&b"PATH=/evil\0"[..], "the environment may not set PATH"),
            (b"=value\0", "an environment entry has no name"),
            (b"NOVALUE\0", "an environment entry has no name"),
            (b"A=\xff\0", "an environment entry is not UTF-8"),
        ] {
            let error = parse_environment(bytes).unwrap_err();
            assert_eq!(error.to_string(), refused, "{bytes:?}");
        }
    }

    #[test]
    fn the_process_bound_is_in_the_init_rlimits() {
        let spec = spec(&staged(true, "/data"), "h", &[]);
        let rlimits = spec["process"]["rlimits"].as_array().unwrap();
        assert!(rlimits.contains(&json!({
            "type": "RLIMIT_NPROC", "hard": SANDBOX_PROCESSES, "soft": SANDBOX_PROCESSES
        })));
    }
}
