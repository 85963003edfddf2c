//! `lazaret attach` end to end, as the unprivileged test user with real
//! runsc: commands through pipes (input, exit codes, merged output, a
//! signal's exit code), ten sessions at once, an interactive shell in a real
//! terminal (driven through tmux), `down` with a session attached, a CLI
//! killed outright, and the connections the Session Coordinator refuses.
//! Needs root (to create the test user and switch to it), runsc and tmux;
//! CI provides them. Every wait is bounded.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lazaret_tests::domain::{UserHost, lazaret_processes, test_user};
use lazaret_tests::{bin, collect};
use libtest_mimic::{Failed, Trial};
use serde_json::Value;

use crate::domain::{
    Result, assert_nothing_left, default_host, down, gated, runnable, text, up, wait_until,
};

/// How long one attached command may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// How long to wait for one expected change: a session listed, a screen
/// drawn, a process gone.
const WAIT: Duration = Duration::from_secs(10);

pub fn trials() -> Vec<Trial> {
    let mut trials = gated(
        runnable(),
        [
            Trial::test("attach::commands_run_through_pipes", commands_through_pipes),
            Trial::test(
                "attach::relayed_output_arrives_whole",
                relayed_output_arrives_whole,
            ),
            Trial::test(
                "attach::ten_sessions_at_once_keep_their_output",
                ten_sessions_at_once,
            ),
            Trial::test(
                "attach::an_interactive_shell_in_a_terminal",
                interactive_terminal,
            ),
            Trial::test(
                "attach::the_terminal_stays_the_developers",
                the_terminal_stays_the_developers,
            ),
            Trial::test(
                "attach::background_processes_end_with_their_session",
                background_processes_end,
            ),
            Trial::test(
                "attach::every_setting_a_session_leaves_is_undone",
                settings_undone,
            ),
            Trial::test(
                "attach::a_lost_terminal_or_sigterm_ends_the_session",
                lost_terminal,
            ),
            Trial::test("attach::a_fork_bomb_stops_at_the_bound", fork_bomb_bounded),
            Trial::test(
                "attach::a_changed_configuration_is_refused",
                changed_configuration,
            ),
            Trial::test("attach::down_ends_an_attached_session", down_with_a_session),
            Trial::test("attach::a_killed_cli_leaves_no_runsc_exec", a_killed_cli),
            Trial::test(
                "attach::a_killed_cli_leaves_no_process_in_the_sandbox",
                a_killed_cli_leaves_no_sandbox_process,
            ),
            Trial::test(
                "attach::foreign_connections_and_old_credentials_are_refused",
                refusals,
            ),
        ],
    );
    let systrap = lazaret_tests::domain::runsc_offers_systrap();
    if std::env::var_os("CI").is_some() {
        assert!(
            systrap,
            "CI must run the process bound tests with a runsc that offers systrap"
        );
    }
    trials.extend(gated(
        runnable() && systrap,
        [Trial::test(
            "attach::waves_of_processes_stop_inside_and_the_sandbox_lives",
            process_waves,
        )],
    ));
    trials
}

/// A started command whose output is collected as it arrives; killed (and
/// reaped) when dropped unfinished.
pub(crate) struct Running {
    child: Option<Child>,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
}

impl Running {
    /// Starts `command` with `input` on a pipe as its standard input (closed
    /// once written), or with no standard input at all.
    pub(crate) fn start(mut command: Command, input: Option<&[u8]>) -> std::io::Result<Self> {
        command
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn()?;
        if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
            let input = input.to_vec();
            // From a thread, so a full pipe cannot block the test; the end
            // of the thread closes the pipe.
            std::thread::spawn(move || {
                let _ = stdin.write_all(&input);
            });
        }
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        if let Some(pipe) = child.stdout.take() {
            readers.push(collect(pipe, Arc::clone(&stdout)));
        }
        if let Some(pipe) = child.stderr.take() {
            readers.push(collect(pipe, Arc::clone(&stderr)));
        }
        Ok(Self {
            child: Some(child),
            stdout,
            stderr,
            readers,
        })
    }

    /// The command's pid, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What it wrote to its standard output so far.
    pub(crate) fn stdout_so_far(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// Sends SIGKILL.
    pub(crate) fn kill(&mut self) -> std::io::Result<()> {
        match self.child.as_mut() {
            Some(child) => child.kill(),
            None => Ok(()),
        }
    }

    /// Waits up to `timeout` for the command to end and returns its output;
    /// past the timeout, kills it and fails.
    pub(crate) fn finish(mut self, timeout: Duration) -> std::result::Result<Output, Failed> {
        let mut child = self.child.take().expect("not finished yet");
        let deadline = Instant::now() + timeout;
        let mut timed_out = false;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() >= deadline {
                timed_out = true;
                let _ = child.kill();
                break child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The readers end when the pipes close; do not wait forever for a
        // descendant that holds them.
        let readers_deadline = Instant::now() + WAIT;
        for reader in std::mem::take(&mut self.readers) {
            while !reader.is_finished() && Instant::now() < readers_deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if reader.is_finished() {
                let _ = reader.join();
            }
        }
        let output = Output {
            status,
            stdout: self
                .stdout
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            stderr: self
                .stderr
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        };
        if timed_out {
            return Err(format!("timed out after {timeout:?}; {}", text(&output)).into());
        }
        Ok(output)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `command` to its end, within [`COMMAND_TIMEOUT`].
pub(crate) fn run(command: Command, input: Option<&[u8]>) -> std::result::Result<Output, Failed> {
    Running::start(command, input)?.finish(COMMAND_TIMEOUT)
}

/// `lazaret attach p [-- COMMAND...]` as the test user in `cwd`.
pub(crate) fn attach(host: &UserHost, cwd: &Path, command: &[&str]) -> Command {
    let mut attach = host.command(&bin("lazaret"), cwd);
    attach.args(["attach", "p"]);
    if !command.is_empty() {
        attach.arg("--").args(command);
    }
    attach
}

/// The sessions `lazaret status p --json` lists.
fn sessions(host: &UserHost, cwd: &Path) -> Vec<Value> {
    host.status(cwd, "p")
        .and_then(|s| s["sessions"].as_array().cloned())
        .unwrap_or_default()
}

/// Whether `status` lists a session whose process runs inside the
/// sandbox (its leader found by the sandbox's pid 1).
fn running_session(host: &UserHost, cwd: &Path) -> bool {
    sessions(host, cwd)
        .iter()
        .any(|s| s["guest_pid"].as_u64().is_some())
}

/// The live `runsc exec` processes of `uid` (zombies are not counted).
pub(crate) fn runsc_execs(uid: u32) -> Vec<String> {
    lazaret_processes(uid)
        .into_iter()
        .filter(|line| {
            let args: Vec<&str> = line.split_whitespace().skip(2).collect();
            args.iter().any(|a| a.contains("runsc")) && args.contains(&"exec")
        })
        .collect()
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn commands_through_pipes() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    up(&host, &ws)?;

    let sorted = run(attach(&host, &ws, &["sort", "-r"]), Some(b"a\nb\n"))?;
    assert!(sorted.status.success(), "{}", text(&sorted));
    assert_eq!(stdout(&sorted), "b\na\n", "{}", text(&sorted));

    // Only the capabilities a package manager needs as root: chown,
    // dac_override, fowner, fsetid, kill, setgid, setuid,
    // net_bind_service.
    let caps = run(
        attach(
            &host,
            &ws,
            &["grep", "-E", "^Cap(Eff|Prm|Bnd)", "/proc/self/status"],
        ),
        None,
    )?;
    assert_eq!(
        stdout(&caps)
            .lines()
            .map(|l| l.split_whitespace().last().unwrap_or_default())
            .collect::<Vec<_>>(),
        ["00000000000004fb"; 3],
        "{}",
        text(&caps)
    );

    let seven = run(attach(&host, &ws, &["sh", "-c", "exit 7"]), None)?;
    assert_eq!(seven.status.code(), Some(7), "{}", text(&seven));

    let both = run(
        attach(
            &host,
            &ws,
            &["sh", "-c", "echo to-stdout; echo to-stderr >&2; pwd"],
        ),
        None,
    )?;
    assert!(both.status.success(), "{}", text(&both));
    assert_eq!(
        stdout(&both),
        "to-stdout\nto-stderr\n/workspace\n",
        "both streams arrive, merged, on standard output: {}",
        text(&both)
    );
    assert!(!stderr(&both).contains("to-std"), "{}", text(&both));

    let killed = run(attach(&host, &ws, &["sh", "-c", "kill -TERM $$"]), None)?;
    assert_eq!(
        killed.status.code(),
        Some(128 + 15),
        "a process killed by SIGTERM: {}",
        text(&killed)
    );

    // A command that cannot be run: the shell's 127, and the runtime's
    // message names it; one that exits 128 itself keeps its code.
    let missing = run(attach(&host, &ws, &["no-such-command-here"]), None)?;
    assert_eq!(missing.status.code(), Some(127), "{}", text(&missing));
    assert!(
        text(&missing).contains("no-such-command-here"),
        "{}",
        text(&missing)
    );
    let own = run(attach(&host, &ws, &["sh", "-c", "exit 128"]), None)?;
    assert_eq!(own.status.code(), Some(128), "{}", text(&own));

    down(&host, &ws)?;
    Ok(())
}

/// Output relayed through the session (standard output is a file, which is
/// never handed in) arrives byte for byte, however much there is.
fn relayed_output_arrives_whole() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    let data: Vec<u8> = (0..24u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(ws.join("big"), &data)?;
    std::fs::set_permissions(ws.join("big"), std::fs::Permissions::from_mode(0o644))?;
    up(&host, &ws)?;
    let out = host.base().join("relayed");
    std::fs::write(&out, b"")?;
    std::os::unix::fs::chown(&out, Some(host.uid()), None)?;
    let mut command = attach(&host, &ws, &["sh", "-c", "cat /workspace/big; echo end"]);
    command
        .stdin(Stdio::null())
        .stdout(std::fs::OpenOptions::new().write(true).open(&out)?)
        .stderr(Stdio::piped());
    let ran = command.output()?;
    down(&host, &ws)?;
    assert!(ran.status.success(), "{}", text(&ran));
    let got = std::fs::read(&out)?;
    let mut expected = data;
    expected.extend_from_slice(b"end\n");
    assert_eq!(got.len(), expected.len(), "relayed bytes");
    assert!(got == expected, "the relayed bytes differ from the file");
    Ok(())
}

fn ten_sessions_at_once() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    up(&host, &ws)?;

    let (outputs, listed) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..10)
            .map(|n| {
                let (host, ws) = (&host, &ws);
                scope.spawn(move || {
                    let script = format!("echo start-{n}; sleep 1; echo end-{n}");
                    run(attach(host, ws, &["sh", "-c", &script]), None)
                })
            })
            .collect();
        // While they run, status lists them.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut listed = 0;
        while listed == 0 && Instant::now() < deadline && !handles.iter().all(|h| h.is_finished()) {
            listed = sessions(&host, &ws).len();
            if listed == 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let outputs: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("attach thread"))
            .collect();
        (outputs, listed)
    });
    let mut wrong = Vec::new();
    for (n, output) in outputs.into_iter().enumerate() {
        let output = output?;
        if !output.status.success() || stdout(&output) != format!("start-{n}\nend-{n}\n") {
            wrong.push(format!("session {n}: {}", text(&output)));
        }
    }
    if !wrong.is_empty() {
        let logs = host.lazaret(&ws, &["logs", "p"]);
        return Err(format!(
            "not every session saw exactly its own output:\n{}\nthe Domain log:\n{}",
            wrong.join("\n"),
            stdout(&logs)
        )
        .into());
    }
    assert!(listed >= 1, "status listed no session while ten ran");
    wait_until(WAIT, "status to list no session", || {
        sessions(&host, &ws).is_empty().then_some(())
    })?;

    down(&host, &ws)?;
    Ok(())
}

/// A tmux server of the test user, with its sockets under its own
/// directory; killed when dropped, whatever ends the test.
pub(crate) struct Tmux<'a> {
    pub(crate) host: &'a UserHost,
    pub(crate) dir: PathBuf,
    pub(crate) cwd: PathBuf,
}

impl Tmux<'_> {
    fn command(&self, args: &[&str]) -> Command {
        let mut command = self.host.command(Path::new("/usr/bin/tmux"), &self.cwd);
        command
            .env("TMUX_TMPDIR", &self.dir)
            // The pane's command runs under it; the test user's login shell
            // is nologin.
            .env("SHELL", "/bin/sh")
            .args(["-f", "/dev/null"])
            .args(args);
        command
    }

    /// Starts the session `t`, `columns` by `rows`, in the workspace,
    /// running `pane`.
    pub(crate) fn start(&self, columns: u16, rows: u16, pane: &str) -> Result {
        let cwd = self.cwd.to_str().ok_or("workspace path is not UTF-8")?;
        let (columns, rows) = (columns.to_string(), rows.to_string());
        self.ok(&[
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            &columns,
            "-y",
            &rows,
            "-c",
            cwd,
            pane,
        ])?;
        Ok(())
    }

    /// Runs a tmux command that must succeed; its standard output.
    pub(crate) fn ok(&self, args: &[&str]) -> std::result::Result<String, Failed> {
        let output = Running::start(self.command(args), None)?.finish(WAIT)?;
        if !output.status.success() {
            return Err(format!("tmux {args:?} failed: {}", text(&output)).into());
        }
        Ok(stdout(&output))
    }

    /// The pane's state, as tmux's `format` (`#{insert_flag}`, ...) shows it.
    pub(crate) fn show(&self, format: &str) -> std::result::Result<String, Failed> {
        Ok(self
            .ok(&["display", "-p", "-t", "t", format])?
            .trim()
            .to_owned())
    }

    /// Types `line` and Enter into the pane.
    pub(crate) fn type_line(&self, line: &str) -> Result {
        self.ok(&["send-keys", "-t", "t", "-l", line])?;
        self.ok(&["send-keys", "-t", "t", "Enter"])?;
        Ok(())
    }

    /// Polls the pane for up to `timeout` until `shows` holds: `Ok(screen)`
    /// then, `Err(last screen)` when it never did.
    pub(crate) fn poll(
        &self,
        timeout: Duration,
        shows: impl Fn(&str) -> bool,
    ) -> std::result::Result<std::result::Result<String, String>, Failed> {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.ok(&["capture-pane", "-p", "-t", "t"])?;
            if shows(&screen) {
                return Ok(Ok(screen));
            }
            if Instant::now() >= deadline {
                return Ok(Err(screen));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (up to [`WAIT`]) until the pane shows a line equal to `line`.
    pub(crate) fn wait_for_line(&self, line: &str) -> Result {
        match self.poll(WAIT, |s| has_line(s, line))? {
            Ok(_) => Ok(()),
            Err(screen) => Err(format!(
                "timed out after {WAIT:?} waiting for the line `{line}`; the pane shows:\n{screen}"
            )
            .into()),
        }
    }

    /// Types `line` until the pane shows `expected`, for up to `timeout`:
    /// for what may take effect only after a first try.
    pub(crate) fn type_until(&self, line: &str, expected: &str, timeout: Duration) -> Result {
        let deadline = Instant::now() + timeout;
        loop {
            self.type_line(line)?;
            match self.poll(Duration::from_secs(1), |s| has_line(s, expected))? {
                Ok(_) => return Ok(()),
                Err(screen) if Instant::now() >= deadline => {
                    return Err(format!(
                        "`{line}` never showed `{expected}` within {timeout:?}; the pane shows:\n{screen}"
                    )
                    .into());
                }
                Err(_) => {}
            }
        }
    }
}

impl Drop for Tmux<'_> {
    fn drop(&mut self) {
        if let Ok(running) = Running::start(self.command(&["kill-server"]), None) {
            let _ = running.finish(WAIT);
        }
    }
}

pub(crate) fn has_line(screen: &str, line: &str) -> bool {
    screen.lines().any(|l| l.trim_end() == line)
}

fn interactive_terminal() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    up(&host, &ws)?;

    let dir = host.user_dir("tmux");
    let exit_file = dir.join("attach-exit");
    let tmux = Tmux {
        host: &host,
        dir: dir.clone(),
        cwd: ws.clone(),
    };
    let pane = format!(
        "{} attach p; echo EXIT=$? > {}; sleep 60",
        bin("lazaret").display(),
        exit_file.display()
    );
    tmux.start(100, 30, &pane)?;

    // Keys typed before the CLI puts its terminal in raw mode are flushed
    // away, so ask until the shell inside answers.
    tmux.type_until("echo ready-$((20+22))", "ready-42", Duration::from_secs(30))?;

    tmux.type_line("stty size")?;
    tmux.wait_for_line("30 100")?;

    // The new size travels from the CLI's SIGWINCH to the host PTY; ask
    // until the shell sees it. The programs inside are told, as a
    // terminal tells them (the runtime passes no change on by itself).
    tmux.type_line(
        "sh -c 'trap \"echo window-changed\" WINCH; echo waiting; while :; do sleep 0.2; done'",
    )?;
    tmux.wait_for_line("waiting")?;
    tmux.ok(&["resize-window", "-t", "t", "-x", "120", "-y", "40"])?;
    tmux.wait_for_line("window-changed")?;
    tmux.ok(&["send-keys", "-t", "t", "C-c"])?;
    tmux.type_until("stty size", "40 120", WAIT)?;

    // ^C interrupts the foreground command, not the shell.
    tmux.type_line("echo sleeping-$((3*3)); sleep 100")?;
    tmux.wait_for_line("sleeping-9")?;
    // Let the shell start sleep after its echo.
    std::thread::sleep(Duration::from_millis(500));
    tmux.ok(&["send-keys", "-t", "t", "C-c"])?;
    tmux.type_line("echo alive $?")?;
    tmux.wait_for_line("alive 130")?;

    // A full-screen program draws.
    tmux.type_line("vi /tmp/x")?;
    match tmux.poll(WAIT, |s| {
        s.lines().filter(|l| l.trim_end() == "~").count() >= 10
    })? {
        Ok(_) => {}
        Err(screen) => {
            return Err(
                format!("vi drew no `~` lines within {WAIT:?}; the pane shows:\n{screen}").into(),
            );
        }
    }
    tmux.ok(&["send-keys", "-t", "t", "Escape"])?;
    // vi reads a lone Escape only when nothing follows it at once: it
    // shows nothing to wait for, so give it a moment.
    std::thread::sleep(Duration::from_millis(300));
    tmux.ok(&["send-keys", "-t", "t", "-l", ":q!"])?;
    match tmux.poll(WAIT, |s| s.lines().any(|l| l.starts_with(":q!")))? {
        Ok(_) => {}
        Err(screen) => {
            return Err(
                format!("vi shows no `:q!` within {WAIT:?}; the pane shows:\n{screen}").into(),
            );
        }
    }
    tmux.ok(&["send-keys", "-t", "t", "Enter"])?;
    tmux.type_until("echo back-$((4+4))", "back-8", WAIT)?;

    // The shell's exit code is the CLI's.
    tmux.type_line("exit 3")?;
    let exit = wait_until(WAIT, "the CLI's exit code in the pane", || {
        std::fs::read_to_string(&exit_file)
            .ok()
            .filter(|s| s.ends_with('\n'))
    })?;
    assert_eq!(exit.trim(), "EXIT=3");
    wait_until(WAIT, "status to list no session", || {
        sessions(&host, &ws).is_empty().then_some(())
    })?;

    drop(tmux);
    down(&host, &ws)?;
    Ok(())
}

/// A process inside never holds the developer's terminal: with standard
/// output a terminal and input a pipe (`true | lazaret attach ...`), both
/// are relayed and a background process ends with its session, so it can
/// neither read the keys typed after `attach` returns nor write to the
/// screen; the terminal's file status flags are as they were (the next
/// program reads it), and the modes a full-screen program left set are
/// reset.
fn the_terminal_stays_the_developers() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;

    let dir = host.user_dir("tmux");
    let report = dir.join("report");
    let typed = dir.join("typed");
    let tmux = Tmux {
        host: &host,
        dir: dir.clone(),
        cwd: ws.clone(),
    };
    let lazaret = bin("lazaret");
    let (lazaret, report_path, typed_path) = (lazaret.display(), report.display(), typed.display());
    let pane = format!(
        "true | {lazaret} attach p -- sh -c \
           '(sleep 3; dd bs=1 count=12 of=/root/stolen 0<&1; echo LEAKED-$((6*7))) & exit 0'; \
         echo EXIT=$? > {report_path}; \
         {lazaret} attach p -- printf '\\033[?1049h\\033[?1000h\\033[?2004h\\033[?25l'; \
         echo MODES=$? >> {report_path}; \
         sleep 6; head -n 1 > {typed_path}; echo TYPED=$? >> {report_path}; sleep 60"
    );
    tmux.start(100, 30, &pane)?;
    let read_report = || std::fs::read_to_string(&report).unwrap_or_default();
    wait_until(WAIT, "both sessions to end", || {
        read_report().contains("MODES=").then_some(())
    })?;
    assert!(
        read_report().starts_with("EXIT=0\nMODES=0\n"),
        "{}",
        read_report()
    );
    let flags = tmux.ok(&[
        "display",
        "-p",
        "-t",
        "t",
        "#{alternate_on} #{mouse_standard_flag} #{cursor_flag}",
    ])?;
    assert_eq!(
        flags.trim(),
        "0 0 1",
        "the alternate screen and mouse reporting are off and the cursor shows again"
    );

    // Typed while a background process of the first session, had it
    // lived, would be reading the terminal.
    std::thread::sleep(Duration::from_secs(4));
    tmux.type_line("typed-by-developer")?;
    wait_until(WAIT, "the shell's `head` to read the line", || {
        read_report().contains("TYPED=").then_some(())
    })?;
    let screen = tmux.ok(&["capture-pane", "-p", "-t", "t"])?;
    assert!(
        read_report().contains("TYPED=0\n"),
        "the next program reads the terminal: {}\n{screen}",
        read_report()
    );
    assert_eq!(
        std::fs::read_to_string(&typed)?,
        "typed-by-developer\n",
        "every key reached the developer's shell; the pane shows:\n{screen}"
    );
    assert!(!screen.contains("LEAKED-42"), "{screen}");
    drop(tmux);

    let stolen = host.exec(&status, "test -e /root/stolen");
    assert_eq!(
        stolen.status.code(),
        Some(1),
        "the background process never ran: {}",
        text(&stolen)
    );
    down(&host, &ws)?;
    Ok(())
}

/// Insert mode, origin mode, a scrolling region, no autowrap, application
/// cursor keys and keypad, black colours and the line-drawing character
/// set, left by a session's program, are all undone when it ends (with
/// origin mode left on, the cursor goes to the last row).
fn settings_undone() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    up(&host, &ws)?;
    let dir = host.user_dir("tmux");
    let report = dir.join("report");
    let tmux = Tmux {
        host: &host,
        dir: dir.clone(),
        cwd: ws.clone(),
    };
    let pane = format!(
        "printf 'start\\n'; {} attach p -- printf \
           '\\033[4h\\033[?6h\\033[3;5r\\033[?7l\\033[?1h\\033=\\033]10;#000000\\007\\033]11;#000000\\007\\033(0'; \
         echo DONE=$? > {}; sleep 60",
        bin("lazaret").display(),
        report.display()
    );
    tmux.start(100, 30, &pane)?;
    wait_until(WAIT, "the session to end", || {
        std::fs::read_to_string(&report)
            .ok()
            .filter(|r| r.contains("DONE="))
    })?;
    assert_eq!(std::fs::read_to_string(&report)?.trim(), "DONE=0");
    let state = tmux.show(
        "#{insert_flag} #{origin_flag} #{scroll_region_upper}-#{scroll_region_lower} \
         #{wrap_flag} #{keypad_cursor_flag} #{keypad_flag} #{pane_fg} #{pane_bg} \
         #{cursor_y}",
    )?;
    assert_eq!(state, "0 0 0-29 1 0 0 default default 29", "{state}");
    // The character set: what is typed shows as typed, not as lines.
    tmux.ok(&["send-keys", "-t", "t", "-l", "lqqk"])?;
    let screen = tmux.ok(&["capture-pane", "-p", "-t", "t"])?;
    assert!(screen.contains("lqqk"), "{screen}");
    drop(tmux);
    down(&host, &ws)
}

/// A CLI whose terminal goes away (its tmux session killed) ends its
/// session and exits, and so does one sent SIGTERM, with a terminal or
/// without, even when the process inside ignores SIGTERM.
fn lost_terminal() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    up(&host, &ws)?;
    let lazaret = bin("lazaret");
    let pattern = format!("^{} attach p$", lazaret.display());
    let cli = || -> Option<u64> {
        let out = Command::new("pgrep")
            .args(["-u", &host.uid().to_string(), "-f", &pattern])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    };
    let no_sessions = || sessions(&host, &ws).is_empty().then_some(());

    // The terminal goes away.
    let dir = host.user_dir("tmux");
    let tmux = Tmux {
        host: &host,
        dir: dir.clone(),
        cwd: ws.clone(),
    };
    tmux.start(100, 30, &format!("{} attach p", lazaret.display()))?;
    tmux.type_until("echo ready-$((20+22))", "ready-42", Duration::from_secs(30))?;
    let pid = cli().ok_or("no lazaret attach running")?;
    drop(tmux);
    wait_until(WAIT, "the CLI to exit after its terminal went away", || {
        (!lazaret_tests::domain::pid_exists(pid)).then_some(())
    })?;
    wait_until(WAIT, "its session to end", no_sessions)?;

    // SIGTERM, to a CLI whose shell inside ignores it.
    let report = dir.join("report");
    let tmux = Tmux {
        host: &host,
        dir: dir.clone(),
        cwd: ws.clone(),
    };
    tmux.start(
        100,
        30,
        &format!(
            "{} attach p; echo EXIT=$? > {}; sleep 60",
            lazaret.display(),
            report.display()
        ),
    )?;
    tmux.type_until(
        "trap '' TERM; echo ready-$((20+22))",
        "ready-42",
        Duration::from_secs(30),
    )?;
    let pid = cli().ok_or("no lazaret attach running")?;
    lazaret_tests::domain::signal(pid, "TERM")?;
    wait_until(WAIT, "the CLI to exit on SIGTERM", || {
        std::fs::read_to_string(&report)
            .ok()
            .filter(|r| r.contains("EXIT="))
    })?;
    assert_eq!(std::fs::read_to_string(&report)?.trim(), "EXIT=143");
    wait_until(WAIT, "its session to end", no_sessions)?;
    drop(tmux);

    // SIGTERM, without a terminal.
    let running = Running::start(
        attach(
            &host,
            &ws,
            &["sh", "-c", "trap '' TERM; echo started; sleep 100"],
        ),
        None,
    )?;
    wait_until(WAIT, "the command to start", || {
        running.stdout_so_far().contains("started").then_some(())
    })?;
    let pid = running.pid().ok_or("the CLI is not running")?;
    // The test user's CLI runs under setpriv, which execs it: same pid.
    lazaret_tests::domain::signal(u64::from(pid), "TERM")?;
    let out = running.finish(WAIT)?;
    assert_eq!(out.status.code(), Some(143), "{}", text(&out));
    wait_until(WAIT, "its session to end", no_sessions)?;
    down(&host, &ws)
}

/// What a session starts in the background ends when the session does,
/// whether its command exits or its client is killed.
fn background_processes_end() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;

    let exited = run(
        attach(
            &host,
            &ws,
            &["sh", "-c", "sleep 4321 & sleep 4322 & exit 4"],
        ),
        None,
    )?;
    assert_eq!(exited.status.code(), Some(4), "{}", text(&exited));
    let mut attached = Running::start(
        attach(&host, &ws, &["sh", "-c", "sleep 4323 & sleep 1000"]),
        None,
    )?;
    wait_until(WAIT, "the session's background process", || {
        (!sandbox_processes(&host, &status, "sleep 4323").is_empty()).then_some(())
    })?;
    attached.kill()?;
    attached.finish(WAIT)?;
    let left = wait_until(WAIT, "the sessions' processes to end", || {
        ["sleep 4321", "sleep 4322", "sleep 4323", "sleep 1000"]
            .iter()
            .all(|args| sandbox_processes(&host, &status, args).is_empty())
            .then_some(())
    });
    let zombies = stdout(&host.exec(&status, "ps -o stat,pid,args"));
    down(&host, &ws)?;
    left.map_err(|e| {
        format!(
            "{}; in the sandbox:\n{zombies}",
            e.message().unwrap_or_default()
        )
    })?;
    assert!(
        !zombies.lines().any(|l| l.trim_start().starts_with('Z')),
        "every ended process is reaped:\n{zombies}"
    );
    Ok(())
}

/// `attach` enters only a generation that runs the profile as configured
/// now (the same configuration fingerprint), and needs none of the
/// secrets its `env:` references name.
fn changed_configuration() -> Result {
    let config = format!(
        "{}env = {{ API_TOKEN = \"env:LAZARET_E2E_TOKEN\" }}\n",
        crate::domain::config(&lazaret_tests::domain::busybox_image(), "\"/root\"")
    );
    let (_serial, host) = crate::domain::host_with_config(&config);
    let ws = host.workspace.clone();
    let out = host.lazaret_with_env(&ws, &["up", "p"], &[("LAZARET_E2E_TOKEN", "t0k3n")]);
    assert!(out.status.success(), "{}", text(&out));

    // This shell does not export the token: attach does not need it.
    let same = run(attach(&host, &ws, &["echo", "entered"]), None)?;
    assert_eq!(stdout(&same), "entered\n", "{}", text(&same));

    host.write_config(&format!("{config}allow_egress = [\"198.18.0.0/24\"]\n"));
    let changed = run(attach(&host, &ws, &["echo", "entered"]), None)?;
    assert_eq!(changed.status.code(), Some(1), "{}", text(&changed));
    assert!(stdout(&changed).is_empty(), "{}", text(&changed));
    assert!(
        stderr(&changed).contains("runs under another configuration"),
        "{}",
        text(&changed)
    );

    host.write_config(&config);
    let again = run(attach(&host, &ws, &["echo", "entered"]), None)?;
    assert_eq!(stdout(&again), "entered\n", "{}", text(&again));
    down(&host, &ws)?;
    Ok(())
}

/// 2,000 background processes inside stop at the sandbox's process bound;
/// the host can still fork, and the sandbox still serves sessions.
fn fork_bomb_bounded() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;
    let out = run(
        attach(
            &host,
            &ws,
            &[
                "sh",
                "-c",
                "i=0; while [ $i -lt 2000 ]; do sleep 600 & i=$((i+1)); echo $i > /tmp/count; done",
            ],
        ),
        None,
    )?;
    assert!(
        stdout(&out).contains("can't fork"),
        "the loop ran into the bound: {}",
        text(&out)
    );
    let count = host.exec(&status, "cat /tmp/count");
    let started: u32 = stdout(&count).trim().parse()?;
    assert!(
        (400..2000).contains(&started),
        "{started} processes started before the bound"
    );
    // The host forks; the sandbox serves a new session once the bomb's
    // session has ended (its processes with it).
    assert!(Command::new("true").status()?.success());
    let after = run(attach(&host, &ws, &["echo", "still-here"]), None)?;
    assert_eq!(stdout(&after), "still-here\n", "{}", text(&after));
    down(&host, &ws)?;
    Ok(())
}

/// The host tasks (processes and threads) of `uid`, as the kernel counts
/// them against `RLIMIT_NPROC`: zombies included.
fn host_tasks(uid: u32) -> usize {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| e.metadata().is_ok_and(|m| m.uid() == uid))
        .map(|e| std::fs::read_dir(e.path().join("task")).map_or(0, Iterator::count))
        .sum()
}

/// One wave: `count` background `sleep`s held for 2 s, then killed. The
/// shell says `started N` at the end, or `can't fork` when a fork fails
/// (and exits; the session's end takes its processes).
fn wave(count: u32) -> String {
    format!(
        "pids=''; i=0; \
         while [ $i -lt {count} ]; do sleep 600 & pids=\"$pids $!\"; i=$((i+1)); done; \
         sleep 2; kill $pids; wait; echo \"started $i\""
    )
}

/// Waves of processes inside up to the sandbox's process bound, again and
/// again, as an agent's builds or a hostile one may start them, then waves
/// past it: each wave within the bound starts whole, each past it fails
/// to fork inside, the host's tasks for the Domain stay below half the
/// Domain's own bound, and the sandbox and a session attached before the
/// first wave live on. Needs runsc's systrap platform (on ptrace the host
/// tasks grow with every wave until the sandbox ends).
fn process_waves() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;
    let uid = host.uid();
    let supervisor = status["supervisor"]["pid"]
        .as_u64()
        .ok_or("no supervisor pid")?;
    let limits = std::fs::read_to_string(format!("/proc/{supervisor}/limits"))?;
    let outer: usize = limits
        .lines()
        .find(|l| l.starts_with("Max processes"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|n| n.parse().ok())
        .ok_or(format!("no process limit in {limits}"))?;
    let inner = run(attach(&host, &ws, &["sh", "-c", "ulimit -u"]), None)?;
    let inner: u32 = stdout(&inner).trim().parse()?;
    let mut kept = Running::start(attach(&host, &ws, &["sleep", "600"]), None)?;
    wait_until(WAIT, "status to list the kept session", || {
        (!sessions(&host, &ws).is_empty()).then_some(())
    })?;
    let mut peak = host_tasks(uid);
    // `lazaret-init`, the session leaders and the wave's shell take a few
    // of the bound.
    let within = inner - 10;
    let waves = (0..5).map(|_| within).chain((0..3).map(|_| inner * 2));
    for (n, size) in waves.enumerate() {
        let out = Running::start(attach(&host, &ws, &["sh", "-c", &wave(size)]), None)?
            .finish(Duration::from_secs(120))?;
        let tasks = host_tasks(uid);
        peak = peak.max(tasks);
        eprintln!("wave {} of {size}: {tasks} host tasks", n + 1);
        let said = stdout(&out);
        if size == within {
            assert_eq!(said, format!("started {within}\n"), "{}", text(&out));
        } else {
            assert!(
                said.contains("can't fork"),
                "wave {} past the bound of {inner} fails to fork inside: {}",
                n + 1,
                text(&out)
            );
        }
    }
    assert!(
        peak < outer / 2,
        "the Domain held {peak} host tasks at most, against its bound of {outer}"
    );
    let after = run(attach(&host, &ws, &["echo", "still-here"]), None)?;
    assert_eq!(stdout(&after), "still-here\n", "{}", text(&after));
    assert_eq!(sessions(&host, &ws).len(), 1, "the kept session lives");
    kept.kill()?;
    down(&host, &ws)?;
    assert_nothing_left(&host);
    Ok(())
}

fn down_with_a_session() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    up(&host, &ws)?;

    let attached = Running::start(attach(&host, &ws, &["sleep", "100"]), None)?;
    wait_until(WAIT, "status to list the session", || {
        (!sessions(&host, &ws).is_empty()).then_some(())
    })?;
    // The session's process runs (not only its request): the sandbox's
    // pid 1 found its leader.
    wait_until(WAIT, "the session's process to run", || {
        running_session(&host, &ws).then_some(())
    })?;

    down(&host, &ws)?;
    let ended = attached.finish(WAIT)?;
    assert!(!ended.status.success(), "{}", text(&ended));
    assert!(
        stderr(&ended).contains("the Domain went down"),
        "the CLI says why the session ended: {}",
        text(&ended)
    );
    assert_nothing_left(&host);
    Ok(())
}

fn a_killed_cli() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    up(&host, &ws)?;

    let mut attached = Running::start(attach(&host, &ws, &["sleep", "100"]), None)?;
    wait_until(WAIT, "the session's process to run", || {
        running_session(&host, &ws).then_some(())
    })?;
    assert!(!runsc_execs(host.uid()).is_empty(), "no runsc exec runs");

    attached.kill()?;
    let killed = attached.finish(WAIT)?;
    assert_eq!(killed.status.signal(), Some(9), "{}", text(&killed));
    wait_until(
        Duration::from_secs(20),
        "the session to end and its runsc exec to go",
        || (sessions(&host, &ws).is_empty() && runsc_execs(host.uid()).is_empty()).then_some(()),
    )
    .map_err(|e| {
        format!(
            "{}; sessions {:?}; runsc exec {:?}",
            e.message().unwrap_or_default(),
            sessions(&host, &ws),
            runsc_execs(host.uid())
        )
    })?;
    // The Domain still serves.
    let after = run(attach(&host, &ws, &["true"]), None)?;
    assert!(after.status.success(), "{}", text(&after));

    down(&host, &ws)?;
    Ok(())
}

/// The processes inside the sandbox whose command line is exactly `args`.
pub(crate) fn sandbox_processes(host: &UserHost, status: &Value, args: &str) -> Vec<String> {
    let out = host.exec(status, "ps -o pid,args");
    stdout(&out)
        .lines()
        .filter(|l| {
            l.trim_start()
                .split_once(char::is_whitespace)
                .is_some_and(|(_, rest)| rest.trim() == args)
        })
        .map(str::to_owned)
        .collect()
}

/// A CLI killed outright takes its process inside the sandbox with it, not
/// only the host's `runsc exec` (which cannot pass SIGKILL on).
fn a_killed_cli_leaves_no_sandbox_process() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;

    let mut attached = Running::start(attach(&host, &ws, &["sleep", "1234"]), None)?;
    wait_until(WAIT, "the session's process in the sandbox", || {
        (!sandbox_processes(&host, &status, "sleep 1234").is_empty()).then_some(())
    })?;
    attached.kill()?;
    attached.finish(WAIT)?;
    wait_until(WAIT, "status to list no session", || {
        sessions(&host, &ws).is_empty().then_some(())
    })?;
    let left = wait_until(WAIT, "the session's process in the sandbox to end", || {
        sandbox_processes(&host, &status, "sleep 1234")
            .is_empty()
            .then_some(())
    });
    let remaining = sandbox_processes(&host, &status, "sleep 1234");
    down(&host, &ws)?;
    left.map_err(|e| {
        format!(
            "{}; still in the sandbox: {remaining:?}",
            e.message().unwrap_or_default()
        )
    })?;
    Ok(())
}

/// Connects to the session socket in `domain_dir`, writes what is not TLS,
/// and reports whether the server closed the connection within [`WAIT`].
fn garbage_is_closed(domain_dir: &Path) -> std::result::Result<bool, String> {
    // Through the directory's descriptor: the full path is longer than a
    // Unix socket path may be. `thread-self`, since the calling thread may
    // have credentials of its own.
    let dir = std::fs::File::open(domain_dir).map_err(|e| format!("open: {e}"))?;
    let socket = format!(
        "/proc/thread-self/fd/{}/session.sock",
        std::os::fd::AsRawFd::as_raw_fd(&dir)
    );
    let mut stream = UnixStream::connect(&socket).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(WAIT))
        .map_err(|e| e.to_string())?;
    // The server may close before or while this is written.
    let _ = stream.write_all(b"GET / HTTP/1.0\r\nthis is not TLS\r\n\r\n");
    let deadline = Instant::now() + WAIT;
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            // An alert, perhaps; the close follows.
            Ok(n) if n > 0 && Instant::now() < deadline => {}
            Ok(0) => return Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(true),
            Ok(_) | Err(_) => return Ok(false),
        }
    }
}

/// Whether a CLI error names a refusal by TLS: a certificate refused, or
/// the peer's alert.
fn names_tls_refusal(message: &str) -> bool {
    message.contains("refused")
        && ["certificate", "alert", "TLS"]
            .iter()
            .any(|word| message.contains(word))
}

const CREDENTIAL_FILES: [&str; 3] = ["client.pem", "client.key", "trust.bin"];

fn read_credential(dir: &Path) -> std::result::Result<Vec<Vec<u8>>, Failed> {
    CREDENTIAL_FILES
        .iter()
        .map(|name| std::fs::read(dir.join(name)).map_err(|e| format!("{name}: {e}").into()))
        .collect()
}

/// Puts credential files in place, as the test user's with mode 0600.
fn put_credential(dir: &Path, files: &[(&str, &[u8])]) -> Result {
    let (uid, gid) = test_user();
    for (name, bytes) in files {
        let path = dir.join(name);
        std::fs::write(&path, bytes)?;
        std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

fn refusals() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;
    let domain_id = status["domain_id"].as_str().ok_or("domain id")?.to_owned();
    let domain_dir = host.runtime.join("lazaret/domains").join(&domain_id);
    assert!(domain_dir.join("session.sock").exists());

    // Root is not the Domain's owner: the peer-uid check refuses it.
    assert!(
        garbage_is_closed(&domain_dir)?,
        "a connection from root stayed open"
    );
    // The owner speaking something that is not TLS: the handshake refuses
    // it. A thread of its own takes the test user's credentials (on Linux
    // they are per thread) and ends with them.
    let (uid, gid) = test_user();
    let as_user = domain_dir.clone();
    let closed = std::thread::spawn(move || -> std::result::Result<bool, String> {
        let gid = rustix::process::Gid::from_raw(gid);
        let uid = rustix::process::Uid::from_raw(uid);
        rustix::thread::set_thread_groups(&[]).map_err(|e| format!("setgroups: {e}"))?;
        rustix::thread::set_thread_res_gid(gid, gid, gid).map_err(|e| format!("setgid: {e}"))?;
        rustix::thread::set_thread_res_uid(uid, uid, uid).map_err(|e| format!("setuid: {e}"))?;
        garbage_is_closed(&as_user)
    })
    .join()
    .map_err(|_| "the test user's connection thread panicked")??;
    assert!(closed, "a non-TLS connection from the owner stayed open");
    // The coordinator keeps serving.
    let works = run(attach(&host, &ws, &["true"]), None)?;
    assert!(works.status.success(), "{}", text(&works));

    // A credential of an earlier generation.
    let credential_dir = domain_dir.join("session");
    let old = read_credential(&credential_dir)?;
    down(&host, &ws)?;
    let second = up(&host, &ws)?;
    assert_eq!(second["generation"], 2);
    let new = read_credential(&credential_dir)?;
    for (i, name) in CREDENTIAL_FILES.iter().enumerate() {
        assert_ne!(old[i], new[i], "{name} is the same in generation 2");
    }

    // All three old files: the CLI trusts only the old CA, so it refuses
    // the coordinator of generation 2.
    let all_old: Vec<(&str, &[u8])> = CREDENTIAL_FILES
        .iter()
        .zip(&old)
        .map(|(n, b)| (*n, b.as_slice()))
        .collect();
    put_credential(&credential_dir, &all_old)?;
    let refused = run(attach(&host, &ws, &["true"]), None)?;
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        names_tls_refusal(&stderr(&refused)),
        "the CLI names the TLS refusal: {}",
        text(&refused)
    );

    // The old client certificate with the current trust: the coordinator
    // refuses a certificate its generation's CA did not sign.
    put_credential(
        &credential_dir,
        &[
            (CREDENTIAL_FILES[0], &old[0]),
            (CREDENTIAL_FILES[1], &old[1]),
            (CREDENTIAL_FILES[2], &new[2]),
        ],
    )?;
    let refused = run(attach(&host, &ws, &["true"]), None)?;
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        names_tls_refusal(&stderr(&refused)),
        "the CLI names the TLS refusal: {}",
        text(&refused)
    );
    assert!(
        sessions(&host, &ws).is_empty(),
        "a refused connection is no session"
    );

    // The current credential works again.
    let all_new: Vec<(&str, &[u8])> = CREDENTIAL_FILES
        .iter()
        .zip(&new)
        .map(|(n, b)| (*n, b.as_slice()))
        .collect();
    put_credential(&credential_dir, &all_new)?;
    let works = run(attach(&host, &ws, &["true"]), None)?;
    assert!(works.status.success(), "{}", text(&works));

    let logs = host.lazaret(&ws, &["logs", "p"]);
    assert!(logs.status.success(), "{}", text(&logs));
    let log = stdout(&logs);
    // Root's connection, the owner's non-TLS bytes, and the certificate of
    // generation 1 (both ways) were refused, each in its own line.
    assert!(
        log.matches("session refused or failed").count() >= 4,
        "the Domain log records each refused session:\n{log}"
    );
    assert!(
        log.contains("uid 0 is not this Domain's owner"),
        "the Domain log names the refused peer:\n{log}"
    );
    assert!(
        log.contains("invalid peer certificate"),
        "the Domain log names the refused certificate:\n{log}"
    );

    down(&host, &ws)?;
    Ok(())
}
