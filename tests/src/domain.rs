//! Helpers for end-to-end Domain tests: an unprivileged test user (and a
//! test group it belongs to), a local busybox image, a scratch host owned
//! by that user whose projects take a [`Shape`], and commands run as it.
//!
//! Needs root to create the user and group and to switch to them; CI runs
//! as root.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

use crate::bin;

/// End-to-end tests that start real sandboxes run one at a time: every
/// module holding such tests locks this for the whole test.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// The runsc Lazaret runs: the first of the places the coordinator looks
/// (`programs::runsc`) that exists.
pub fn runsc() -> Option<PathBuf> {
    ["/usr/local/bin/runsc", "/usr/bin/runsc"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Whether the supervisor runs the sandbox of that runsc on the systrap
/// platform: the supervisor's own choice, so a trial gated on it runs
/// where the supervisor takes systrap and only there.
pub fn runsc_offers_systrap() -> bool {
    runsc().is_some_and(|runsc| {
        lazaret_supervisor::Platform::of(&runsc) == lazaret_supervisor::Platform::Systrap
    })
}

/// The unprivileged user the Domain tests run Lazaret as.
pub const TEST_USER: &str = "lazaret-e2e";

/// The repository root (for packaging scripts).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is inside the workspace")
        .to_path_buf()
}

/// Whether this run created the test user (and so must remove it).
static CREATED_USER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The group the tests add the test user to, for project directories of
/// another group than the user's own.
pub const TEST_GROUP: &str = "lazaret-e2e-share";

/// Whether this run used the test group (and so must remove it).
static USED_GROUP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Removes the test user if this run created it, the test group if this
/// run used it, and the images it built. Called once when every test has
/// run, whatever their outcome.
pub fn cleanup() {
    for image in [
        IMAGE.get(),
        GIT_IMAGE.get(),
        OTHER_IMAGE.get(),
        LARGE_IMAGE.get(),
    ]
    .into_iter()
    .flatten()
    {
        if let Some(dir) = image
            .strip_prefix("oci:")
            .and_then(|i| i.strip_suffix(":latest"))
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    if USED_GROUP.load(std::sync::atomic::Ordering::SeqCst) {
        // The group is the tests' own: one a killed run left is removed too.
        let _ = Command::new("groupdel").arg(TEST_GROUP).status();
    }
    if CREATED_USER.load(std::sync::atomic::Ordering::SeqCst) {
        let _ = Command::new("userdel").arg(TEST_USER).status();
    }
}

/// The gid of [`TEST_GROUP`], created if needed, with the test user a
/// member of it (a supplementary group: the user's primary group stays
/// its own).
pub fn test_group() -> u32 {
    static GROUP: OnceLock<u32> = OnceLock::new();
    *GROUP.get_or_init(|| {
        test_user();
        USED_GROUP.store(true, std::sync::atomic::Ordering::SeqCst);
        let gid = || -> Option<u32> {
            let out = Command::new("getent")
                .args(["group", TEST_GROUP])
                .output()
                .ok()?;
            String::from_utf8_lossy(&out.stdout)
                .split(':')
                .nth(2)?
                .trim()
                .parse()
                .ok()
        };
        if gid().is_none() {
            let status = Command::new("groupadd")
                .args(["--system", TEST_GROUP])
                .status()
                .expect("run groupadd");
            assert!(status.success(), "groupadd {TEST_GROUP} failed");
        }
        let status = Command::new("gpasswd")
            .args(["--add", TEST_USER, TEST_GROUP])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run gpasswd");
        assert!(
            status.success(),
            "adding {TEST_USER} to {TEST_GROUP} failed"
        );
        gid().expect("the test group's gid")
    })
}

/// Where a test host's projects lie and which group they have. The
/// lifecycle and workspace tests run in each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A directory of the user's own, in the user's primary group.
    Own,
    /// A directory whose group is [`TEST_GROUP`], which the user belongs
    /// to, mode 0755 and not setgid (`mkdir p && chgrp share p`): what is
    /// made in it has the maker's primary group.
    OtherGroup,
    /// A directory in a setgid directory of [`TEST_GROUP`] (a shared
    /// project area, mode 2775): the project is setgid too, and everything
    /// made in it, on the host or inside, has that group.
    SetgidParent,
}

impl Shape {
    /// The shapes other than [`Shape::Own`].
    pub const OTHERS: [Shape; 2] = [Shape::OtherGroup, Shape::SetgidParent];

    /// A trial name's suffix for this shape (empty for [`Shape::Own`]).
    pub fn suffix(self) -> &'static str {
        match self {
            Shape::Own => "",
            Shape::OtherGroup => "::in_a_directory_of_another_group",
            Shape::SetgidParent => "::under_a_setgid_parent",
        }
    }

    /// The group of the projects of this shape: `None` for the user's own.
    pub fn group(self) -> Option<u32> {
        match self {
            Shape::Own => None,
            Shape::OtherGroup | Shape::SetgidParent => Some(test_group()),
        }
    }
}

/// The uid and gid of the test user, creating it if needed.
pub fn test_user() -> (u32, u32) {
    static USER: OnceLock<(u32, u32)> = OnceLock::new();
    *USER.get_or_init(|| {
        let id = |flag: &str| -> Option<u32> {
            let out = Command::new("id").args([flag, TEST_USER]).output().ok()?;
            String::from_utf8_lossy(&out.stdout).trim().parse().ok()
        };
        if id("-u").is_none() {
            CREATED_USER.store(true, std::sync::atomic::Ordering::SeqCst);
            let status = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    TEST_USER,
                ])
                .status()
                .expect("run useradd");
            assert!(status.success(), "useradd {TEST_USER} failed");
        }
        (
            id("-u").expect("test user uid"),
            id("-g").expect("test user gid"),
        )
    })
}

/// The image reference of this run's busybox image, once built.
static IMAGE: OnceLock<String> = OnceLock::new();

/// The image reference of this run's busybox image with git, once built.
static LARGE_IMAGE: OnceLock<String> = OnceLock::new();
static GIT_IMAGE: OnceLock<String> = OnceLock::new();

/// The image reference of this run's second busybox image, once built.
static OTHER_IMAGE: OnceLock<String> = OnceLock::new();

/// Builds a busybox image named `name` into a fresh layout, with `extra`
/// copied over its root filesystem; returns `oci:<dir>:latest`.
fn build_image(name: &str, extra: Option<&Path>) -> String {
    let dir = std::env::temp_dir().join(format!("lazaret-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut command = Command::new("bash");
    command
        .arg(repo_root().join("packaging/build-busybox-image.sh"))
        .arg(&dir)
        .arg("latest");
    if let Some(extra) = extra {
        command.env("LAZARET_IMAGE_EXTRA", extra);
    }
    let output = command.output().expect("run build-busybox-image.sh");
    assert!(
        output.status.success(),
        "building the {name} image failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    make_readable(&dir);
    format!("oci:{}:latest", dir.display())
}

/// The local busybox OCI image, built once per test run:
/// `oci:<dir>:latest`, readable by the test user.
pub fn busybox_image() -> String {
    IMAGE.get_or_init(|| build_image("image", None)).clone()
}

/// A busybox image with one more file than [`busybox_image`], so its
/// manifest digest differs: for tests that need an image not yet
/// prepared. Built once per test run.
pub fn other_image() -> String {
    OTHER_IMAGE
        .get_or_init(|| {
            let extra = tempfile::tempdir().expect("scratch for the other image");
            std::fs::create_dir_all(extra.path().join("etc")).unwrap();
            std::fs::write(extra.path().join("etc/other-image"), b"other\n").unwrap();
            build_image("other-image", Some(extra.path()))
        })
        .clone()
}

/// A busybox image with 8 MiB more that gzip cannot shrink, so preparing
/// it reports progress: for the progress tests. Built once per test run.
pub fn large_image() -> String {
    LARGE_IMAGE
        .get_or_init(|| {
            let extra = tempfile::tempdir().expect("scratch for the large image");
            std::fs::create_dir_all(extra.path().join("opt")).unwrap();
            let mut x: u64 = 0x2545_f491_4f6c_dd1d;
            let bytes: Vec<u8> = (0..8 << 20)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8
                })
                .collect();
            std::fs::write(extra.path().join("opt/noise"), bytes).unwrap();
            build_image("large-image", Some(extra.path()))
        })
        .clone()
}

/// The busybox image with the host's `/usr/bin/git` and the libraries
/// `ldd` lists for it, built once per test run.
pub fn git_image() -> String {
    GIT_IMAGE
        .get_or_init(|| {
            let extra = tempfile::tempdir().expect("scratch for the git image");
            let root = extra.path();
            let copy = |from: &Path, to: &Path| {
                let to = root.join(to.strip_prefix("/").unwrap_or(to));
                std::fs::create_dir_all(to.parent().unwrap()).unwrap();
                // The file a link names, under the link's name.
                std::fs::copy(from, &to)
                    .unwrap_or_else(|e| panic!("copy {} for the git image: {e}", from.display()));
            };
            let git = Path::new("/usr/bin/git");
            assert!(
                git.is_file(),
                "the git image needs /usr/bin/git (apt-get install -y git)"
            );
            copy(git, Path::new("/bin/git"));
            copy(git, Path::new("/usr/lib/git-core/git"));
            let ldd = Command::new("ldd").arg(git).output().expect("run ldd");
            for line in String::from_utf8_lossy(&ldd.stdout).lines() {
                let path = line
                    .split_whitespace()
                    .find(|word| word.starts_with('/'))
                    .map(Path::new);
                if let Some(path) = path {
                    copy(path, path);
                }
            }
            build_image("git-image", Some(root))
        })
        .clone()
}

fn make_readable(dir: &Path) {
    let _ = Command::new("chmod").args(["-R", "a+rX"]).arg(dir).status();
}

/// A scratch host owned by the test user: home, runtime dir, workspace.
#[derive(Debug)]
pub struct UserHost {
    dir: tempfile::TempDir,
    /// `$HOME`.
    pub home: PathBuf,
    /// `$XDG_RUNTIME_DIR`.
    pub runtime: PathBuf,
    /// The default project.
    pub workspace: PathBuf,
    uid: u32,
    gid: u32,
    shape: Shape,
    profiles: std::sync::Mutex<Vec<(String, PathBuf)>>,
}

impl UserHost {
    /// Creates the scratch tree and hands it to the test user.
    pub fn new() -> Self {
        Self::shaped(Shape::Own)
    }

    /// Creates the scratch tree with its project in `shape`, and hands it
    /// to the test user; in a shape of another group, the user runs with
    /// that group as a supplementary group.
    pub fn shaped(shape: Shape) -> Self {
        let (uid, gid) = test_user();
        let dir = tempfile::Builder::new()
            .prefix("lazaret-e2e-host-")
            .tempdir()
            .expect("scratch dir");
        let base = std::fs::canonicalize(dir.path()).expect("canonical scratch");
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let home = base.join("home");
        let runtime = base.join("run");
        for d in [&home, &runtime] {
            std::fs::create_dir_all(d).unwrap();
            std::os::unix::fs::chown(d, Some(uid), Some(gid)).unwrap();
        }
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
        if let (Shape::SetgidParent, Some(group)) = (shape, shape.group()) {
            let area = base.join("shared");
            std::fs::create_dir(&area).unwrap();
            std::os::unix::fs::chown(&area, Some(0), Some(group)).unwrap();
            std::fs::set_permissions(&area, std::fs::Permissions::from_mode(0o2775)).unwrap();
        }
        let mut host = Self {
            dir,
            home,
            runtime,
            workspace: PathBuf::new(),
            uid,
            gid,
            shape,
            profiles: Default::default(),
        };
        host.workspace = host.project("project");
        host
    }

    /// The shape of this host's projects.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The test user's primary gid.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// A new project directory of the test user's, in this host's shape.
    pub fn project(&self, name: &str) -> PathBuf {
        let dir = match self.shape {
            Shape::SetgidParent => self.base().join("shared").join(name),
            Shape::Own | Shape::OtherGroup => self.base().join(name),
        };
        // Made by root: in the setgid area it takes the area's group and
        // setgid bit, as a directory the user makes there does.
        std::fs::create_dir(&dir).unwrap();
        let group = match self.shape {
            Shape::Own => Some(self.gid),
            Shape::OtherGroup => self.shape.group(),
            Shape::SetgidParent => None,
        };
        std::os::unix::fs::chown(&dir, Some(self.uid), group).unwrap();
        std::fs::set_permissions(
            &dir,
            std::fs::Permissions::from_mode(match self.shape {
                Shape::SetgidParent => 0o2755,
                Shape::Own | Shape::OtherGroup => 0o755,
            }),
        )
        .unwrap();
        dir
    }

    /// The scratch root.
    pub fn base(&self) -> &Path {
        self.dir.path()
    }

    /// The test user's uid.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// A new directory owned by the test user.
    pub fn user_dir(&self, name: &str) -> PathBuf {
        let dir = self.base().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(self.uid), Some(self.gid)).unwrap();
        dir
    }

    /// Writes the test user's configuration.
    pub fn write_config(&self, text: &str) {
        let dir = self.home.join(".config/lazaret");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.toml");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        for p in [self.home.join(".config"), dir, path] {
            std::os::unix::fs::chown(&p, Some(self.uid), Some(self.gid)).unwrap();
        }
    }

    /// A command run as the test user, in `cwd`, with this host's
    /// environment.
    pub fn command(&self, program: &Path, cwd: &Path) -> Command {
        let groups = match self.shape.group() {
            Some(group) => format!("--groups={group}"),
            None => "--clear-groups".to_owned(),
        };
        let mut command = Command::new("setpriv");
        command
            .arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .args([groups.as_str(), "--"])
            .arg(program)
            .current_dir(cwd)
            .env_clear()
            .env("HOME", &self.home)
            .env("XDG_RUNTIME_DIR", &self.runtime)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        // The roles' seccomp filters only log, when a run measures their
        // lists (`LAZARET_SECCOMP=log`, debug builds; docs/threat-model.md).
        if let Some(mode) = std::env::var_os("LAZARET_SECCOMP") {
            command.env("LAZARET_SECCOMP", mode);
        }
        command
    }

    /// The test user's Storage Root (the default one).
    /// Fails when any file under this host's home (the Storage Root, the
    /// configuration, the logs) or runtime dir holds `value`.
    pub fn assert_nowhere_on_disk(&self, value: &str) {
        for tree in [&self.home, &self.runtime] {
            let grep = Command::new("grep")
                .args(["-r", "-l", "-a", value])
                .arg(tree)
                .output()
                .expect("run grep");
            assert!(
                grep.stdout.is_empty(),
                "the value is in {}",
                String::from_utf8_lossy(&grep.stdout)
            );
        }
    }

    pub fn storage(&self) -> PathBuf {
        self.home.join(".local/share/lazaret")
    }

    /// `lazaret ARGS` as the test user in `cwd`; remembers `up`s so the
    /// host is brought down when dropped.
    pub fn lazaret(&self, cwd: &Path, args: &[&str]) -> Output {
        self.lazaret_with_env(cwd, args, &[])
    }

    /// `lazaret ARGS` as the test user with extra environment variables.
    pub fn lazaret_with_env(&self, cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.remember_up(cwd, args);
        self.command(&bin("lazaret"), cwd)
            .args(args)
            .envs(env.iter().copied())
            .output()
            .expect("run lazaret")
    }

    /// `lazaret ARGS` as the test user with extra environment, started
    /// (its output dropped); remembers `up`s as [`Self::lazaret`] does.
    pub fn spawn_lazaret<V: AsRef<std::ffi::OsStr>>(
        &self,
        cwd: &Path,
        args: &[&str],
        env: &[(&str, V)],
    ) -> std::io::Result<std::process::Child> {
        self.remember_up(cwd, args);
        self.command(&bin("lazaret"), cwd)
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_ref())))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
    }

    /// `lazaret ARGS` as the test user, started through `wrapper` (a
    /// program and its arguments, run as root, that ends by executing the
    /// rest of its command line), e.g. to give it a private mount namespace.
    /// `env` is added to its environment.
    pub fn lazaret_under(
        &self,
        wrapper: &[&std::ffi::OsStr],
        cwd: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Output {
        self.remember_up(cwd, args);
        let mut inner = self.command(&bin("lazaret"), cwd);
        inner.args(args).envs(env.iter().copied());
        let (program, rest) = wrapper.split_first().expect("a wrapper program");
        let mut outer = Command::new(program);
        outer
            .args(rest)
            .arg(inner.get_program())
            .args(inner.get_args())
            .current_dir(cwd)
            .env_clear()
            .envs(inner.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))));
        outer.output().expect("run the wrapped lazaret")
    }

    /// Remembers an `up`, so the host is brought down when dropped.
    fn remember_up(&self, cwd: &Path, args: &[&str]) {
        if let ["up", profile, ..] = args {
            self.profiles
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(((*profile).to_owned(), cwd.to_path_buf()));
        }
    }

    /// `lazaret status PROFILE --json` of one Domain.
    pub fn status(&self, cwd: &Path, profile: &str) -> Option<Value> {
        let out = self.lazaret(cwd, &["status", profile, "--json"]);
        assert!(
            out.status.success(),
            "status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let value: Value = serde_json::from_slice(&out.stdout).expect("status --json");
        value["domains"].as_array().and_then(|d| d.first().cloned())
    }

    /// Runs `sh -c SCRIPT` inside the Domain's sandbox through `runsc exec`
    /// in the Domain's namespaces, as the test user.
    pub fn exec(&self, status: &Value, script: &str) -> Output {
        let holder = status["namespace_holder"]["pid"]
            .as_u64()
            .expect("holder pid");
        let mut command = self.command(Path::new("/usr/bin/nsenter"), &self.workspace);
        command
            .arg("-t")
            .arg(holder.to_string())
            .args(["-U", "-m", "-n", "-p", "--preserve-credentials", "--"])
            .args([
                "runsc",
                "--rootless",
                "--ignore-cgroups",
                "--network=host",
                "--root",
            ])
            .arg(status["runsc_root"].as_str().expect("runsc root"))
            .args([
                "exec",
                status["container_id"].as_str().expect("container id"),
            ])
            .args(["/bin/sh", "-c", script]);
        command.output().expect("run nsenter")
    }
}

impl Default for UserHost {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for UserHost {
    fn drop(&mut self) {
        let profiles = self.profiles.lock().unwrap_or_else(|e| e.into_inner());
        for (profile, cwd) in profiles.iter() {
            let _ = self
                .command(&bin("lazaret"), cwd)
                .args(["down", profile])
                .output();
        }
    }
}

/// Waits for `child` to end within `within`; false if it had to be killed.
pub fn ended(child: &mut std::process::Child, within: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Sends `kill -SIGNAL PID` (`KILL`, `TERM`, `STOP`, ...).
pub fn signal(pid: u64, signal: &str) -> Result<(), String> {
    let sent = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .map_err(|e| format!("cannot run kill: {e}"))?;
    if !sent.success() {
        return Err(format!("kill -{signal} {pid} failed"));
    }
    Ok(())
}

/// Whether a live process with this pid exists (a zombie waiting for its
/// reaper does not count).
pub fn pid_exists(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

/// The live processes owned by `uid` whose command line mentions Lazaret,
/// gVisor or slirp4netns (zombies waiting for their reaper are not counted).
pub fn lazaret_processes(uid: u32) -> Vec<String> {
    let output = Command::new("ps")
        .args(["-o", "pid=,stat=,args=", "-u"])
        .arg(uid.to_string())
        .output()
        .expect("run ps");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|stat| !stat.starts_with('Z'))
        })
        .filter(|l| l.contains("runsc") || l.contains("lazaret") || l.contains("slirp4netns"))
        .map(str::to_owned)
        .collect()
}
