//! Host escalation end to end, as the unprivileged test user with real
//! runsc: `lazaret-escalate` inside the sandbox, the rules, the developer's
//! prompt in the requesting session's terminal (driven through tmux),
//! output, exit codes and signals, cancellation, and a suite of forged
//! mailbox records planted from inside the sandbox the way a hostile agent
//! would. Needs root (for the test user), runsc and tmux; CI has them.
//! Every wait is bounded.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lazaret_proto::common::{ProtocolVersion, UnixTimeNs};
use lazaret_proto::ids::{GenerationId, RequestId};
use lazaret_proto::mailbox::{MAX_MAILBOX_RECORD_LEN, MailboxRecord, MailboxRequest, RecordFile};
use lazaret_proto::trust::SandboxCredentialBundle;
use lazaret_tests::bin;
use lazaret_tests::domain::{UserHost, busybox_image};
use libtest_mimic::{Failed, Trial};

use crate::attach::{Running, Tmux, attach, has_line, run, stderr, stdout};
use crate::domain::{
    Result, config, down, gated, host_with_config, runnable, text, up, wait_until,
};

const WAIT: Duration = Duration::from_secs(10);

pub fn trials() -> Vec<Trial> {
    gated(
        runnable(),
        [
            Trial::test(
                "escalation::auto_approval_runs_exactly_the_rule",
                auto_approval,
            ),
            Trial::test(
                "escalation::output_exit_codes_and_signals_come_back",
                output_and_status,
            ),
            Trial::test(
                "escalation::the_requesting_sessions_developer_decides",
                interactive_approval,
            ),
            Trial::test(
                "escalation::a_painted_terminal_cannot_spoof_the_prompt",
                painted_terminal,
            ),
            Trial::test(
                "escalation::output_while_a_prompt_waits_keeps_the_session",
                output_while_prompting,
            ),
            Trial::test(
                "escalation::forged_records_are_refused_and_logged",
                forgeries,
            ),
            Trial::test(
                "escalation::disabled_escalation_refuses_every_request",
                disabled,
            ),
            Trial::test(
                "escalation::an_approved_commands_setsid_children_end_with_it",
                setsid_children,
            ),
            Trial::test("escalation::a_flooded_mailbox_keeps_the_log_small", flood),
            Trial::test(
                "escalation::replies_say_nothing_of_host_files",
                host_files_unrevealed,
            ),
        ],
    )
}

/// The host's `/bin/sh`, as a rule names it after `up` resolves it.
fn canonical(path: &str) -> String {
    std::fs::canonicalize(path)
        .expect("a host program")
        .display()
        .to_string()
}

/// The default profile with escalation enabled and `rules` (TOML inline
/// tables) as its auto-approval rules.
fn escalation_config(rules: &[String]) -> String {
    format!(
        "{}[profiles.p.escalation]\nenabled = true\nauto_approve = [{}]\n",
        config(&busybox_image(), "\"/root\""),
        rules.join(", ")
    )
}

fn rule(executable: &str, args: &[&str], extra: bool) -> String {
    let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "{{ executable = {executable:?}, args = [{}], allow_extra_args = {extra} }}",
        args.join(", ")
    )
}

fn code(output: &std::process::Output) -> Option<i32> {
    output.status.code()
}

/// Whether the output holds a line that is exactly `line` (a session's
/// output is the process's standard output and error merged).
fn has(output: &std::process::Output, line: &str) -> bool {
    stdout(output).lines().any(|l| l == line)
}

/// `lazaret attach p -- COMMAND`, to its end.
fn attached(
    host: &UserHost,
    command: &[&str],
) -> std::result::Result<std::process::Output, Failed> {
    run(attach(host, &host.workspace, command), None)
}

/// The coordinator's log.
fn log(host: &UserHost) -> String {
    let out = host.lazaret(&host.workspace, &["logs", "p"]);
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Only a rule's exact vector runs, at once, as the developer's user;
/// everything else is denied in a session without a terminal (or refused,
/// when it cannot be run as a vector), and says why.
fn auto_approval() -> Result {
    let (_serial, host) =
        host_with_config(&escalation_config(&[rule("/usr/bin/id", &["-u"], false)]));
    let ws = host.workspace.clone();
    up(&host, &ws)?;

    let out = attached(&host, &["lazaret-escalate", "/usr/bin/id", "-u"])?;
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert_eq!(
        stdout(&out).trim(),
        host.uid().to_string(),
        "{}",
        text(&out)
    );

    let uid = host.uid().to_string();
    let (_, gid) = lazaret_tests::domain::test_user();
    let out = attached(&host, &["lazaret-escalate", "/usr/bin/id", "-g"])?;
    assert_eq!(code(&out), Some(77), "{}", text(&out));
    let said = stdout(&out);
    assert!(
        said.contains("auto_approve[0] (/usr/bin/id -u)") && said.contains("no terminal"),
        "{said}"
    );
    assert!(!has(&out, &gid.to_string()), "{}", text(&out));

    for (argv, status) in [
        (&["/bin/../usr/bin/id", "-u"][..], 77),
        (&["/usr/bin/id", "-u", "-n"], 77),
        (&["/usr/bin//id", "-u"], 77),
        (&["id", "-u"], 78),
        (&["usr/bin/id", "-u"], 78),
        (&["/usr/bin/id -u"], 77),
        (&["id -u; touch /tmp/x"], 78),
    ] {
        let mut command = vec!["lazaret-escalate"];
        command.extend_from_slice(argv);
        let out = attached(&host, &command)?;
        assert_eq!(code(&out), Some(status), "{argv:?}: {}", text(&out));
        assert!(!has(&out, &uid), "{argv:?} ran: {}", text(&out));
    }

    // Every request and decision is an audit event.
    let log = log(&host);
    assert!(
        log.lines().any(|l| l.contains("escalation finished")
            && l.contains("argv=/usr/bin/id -u")
            && l.contains("outcome=Completed")
            && l.contains("exit_code=0")),
        "{log}"
    );
    assert!(log.contains("outcome=Denied"), "{log}");
    assert!(log.contains("outcome=Refused"), "{log}");
    down(&host, &ws)
}

/// Each stream arrives whole and in its order, the exit status is the
/// command's (128+N for signal N), 8 MiB of output arrives intact, and a
/// command the host cannot start ends 126, saying why.
fn output_and_status() -> Result {
    let dash = canonical("/bin/sh");
    let (_serial, host) = host_with_config("");
    // A script whose interpreter does not exist: it passes every check,
    // and its start fails.
    let broken = host.user_dir("tools").join("broken");
    std::fs::write(&broken, "#!/nonexistent/interpreter\n")?;
    std::os::unix::fs::chown(&broken, Some(host.uid()), None)?;
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let broken = broken.display().to_string();
    host.write_config(&escalation_config(&[
        rule(&dash, &["-c"], true),
        rule(&broken, &[], false),
    ]));
    let ws = host.workspace.clone();
    up(&host, &ws)?;
    let out = attached(&host, &["lazaret-escalate", &broken])?;
    assert_eq!(code(&out), Some(126), "{}", text(&out));
    assert!(
        stdout(&out).contains(&format!("cannot start {broken}")),
        "{}",
        text(&out)
    );
    // The session merges the client's two streams; inside, each goes to a
    // file of its own.
    let script = "for i in 1 2 3; do echo out$i; echo err$i >&2; done; exit 7";
    let out = attached(
        &host,
        &[
            "sh",
            "-c",
            &format!(
                "lazaret-escalate {dash} -c '{script}' >/root/out 2>/root/err; \
                 echo rc=$?; cat /root/out; echo --; cat /root/err"
            ),
        ],
    )?;
    assert_eq!(
        stdout(&out),
        "rc=7\nout1\nout2\nout3\n--\nerr1\nerr2\nerr3\n",
        "{}",
        text(&out)
    );

    let out = attached(&host, &["lazaret-escalate", &dash, "-c", "kill -TERM $$"])?;
    assert_eq!(code(&out), Some(128 + 15), "{}", text(&out));

    // 8 MiB that the host and the sandbox both can describe: the same
    // numbers, counted and summed on each side.
    let script = "seq 1 1200000";
    let expected = std::process::Command::new(&dash)
        .args(["-c", script])
        .output()?;
    assert!(expected.stdout.len() > 8 * 1024 * 1024);
    let inside = attached(
        &host,
        &[
            "sh",
            "-c",
            &format!(
                "lazaret-escalate {dash} -c '{script}' > /root/big; echo status=$?; md5sum < /root/big"
            ),
        ],
    )?;
    let path = host.base().join("expected");
    std::fs::write(&path, &expected.stdout)?;
    let md5 = std::process::Command::new("md5sum").arg(&path).output()?;
    let want = String::from_utf8_lossy(&md5.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    let got = stdout(&inside);
    assert!(
        got.starts_with("status=0\n") && got.contains(&want),
        "8 MiB arrived changed: want {want}; {}",
        text(&inside)
    );
    down(&host, &ws)
}

/// The prompt appears in the requesting session's terminal only; `y` runs
/// the command, `n` denies it; Ctrl-C in the client ends a long host
/// command within a second.
fn interactive_approval() -> Result {
    let sleep = canonical("/bin/sleep");
    let (_serial, host) = host_with_config(&escalation_config(&[
        rule("/usr/bin/id", &["-u"], false),
        rule(&sleep, &["30"], false),
    ]));
    let ws = host.workspace.clone();
    up(&host, &ws)?;
    let a = shell_in_tmux(&host, "tmux-a", (120, 40))?;
    let b = shell_in_tmux(&host, "tmux-b", (120, 40))?;
    let asks = |screen: &str| screen.contains("the sandbox asks to run a command");

    b.type_line("lazaret-escalate /usr/bin/id -g; echo rc=$?")?;
    match b.poll(WAIT, |s| asks(s) && s.contains("/usr/bin/id -g"))? {
        Ok(_) => {}
        Err(screen) => return Err(format!("no prompt in session B:\n{screen}").into()),
    }
    let screen_a = a.ok(&["capture-pane", "-p", "-t", "t"])?;
    assert!(!asks(&screen_a), "session A was asked too:\n{screen_a}");
    b.type_line("y")?;
    b.wait_for_line("rc=0")?;
    let (_, gid) = lazaret_tests::domain::test_user();
    b.wait_for_line(&gid.to_string())?;

    // A prompt leaves nothing behind on the session's screen; the next
    // one is drawn on a screen of its own again.
    b.type_line("clear; lazaret-escalate /usr/bin/id -g; echo rc=$?")?;
    match b.poll(WAIT, |s| asks(s) && !s.contains("rc=0"))? {
        Ok(_) => {}
        Err(screen) => return Err(format!("no second prompt:\n{screen}").into()),
    }
    b.type_line("n")?;
    b.wait_for_line("rc=77")?;

    // Unanswered, a request expires at its deadline and the prompt goes.
    b.type_line("clear; lazaret-escalate --timeout 2 /usr/bin/id -g; echo rc=$?")?;
    match b.poll(WAIT, |s| s.contains("no answer needed: it expired"))? {
        Ok(_) => {}
        Err(screen) => return Err(format!("the prompt did not expire:\n{screen}").into()),
    }
    b.wait_for_line("rc=75")?;

    // Ctrl-C in the client cancels the host command.
    b.type_line("lazaret-escalate /usr/bin/sleep 30; echo rc=$?")?;
    let pattern = format!("^{sleep} 30$");
    let host_sleep = || {
        let out = std::process::Command::new("pgrep")
            .args(["-u", &host.uid().to_string(), "-f", &pattern])
            .output()
            .ok()?;
        out.status.success().then_some(())
    };
    wait_until(WAIT, "the host's sleep 30", host_sleep)?;
    b.ok(&["send-keys", "-t", "t", "C-c"])?;
    let started = Instant::now();
    wait_until(Duration::from_secs(5), "the host's sleep to end", || {
        host_sleep().is_none().then_some(())
    })?;
    let took = started.elapsed();
    // The poll above looks every 100 ms: what it saw is at most that late.
    assert!(
        took < Duration::from_secs(1),
        "the host command ended {took:?} after Ctrl-C"
    );
    // The terminal echoes ^C before the shell's line.
    match b.poll(WAIT, |s| {
        s.lines().any(|l| l.trim_end().ends_with("rc=130"))
    })? {
        Ok(_) => {}
        Err(screen) => return Err(format!("no rc=130 after Ctrl-C:\n{screen}").into()),
    }
    drop(a);
    drop(b);
    down(&host, &ws)
}

/// A fake prompt painted on rows 3 to 6 that names `/usr/bin/true`, and
/// colours that would draw the real one black on black, as `printf`
/// arguments.
const FAKE_PROMPT: &str = concat!(
    r"\033[2J\033[3;1H-- lazaret: the sandbox asks to run a command on this host --\r\n",
    r"  command  /usr/bin/true\r\n  why      routine check\r\n",
    r"Run it on the host? Type y and Enter to approve; anything else denies:\r\n",
    r"\033]10;#000000\007\033]11;#000000\007",
);

/// The request the fake prompt stands in front of.
const REAL_COMMAND: &str = "/usr/bin/../bin/sh -c \"id > /workspace/ran\"";

/// The prompt a developer sees in `tmux`: the whole real request and
/// nothing of what the sandbox drew, on a screen of its own with the
/// terminal's settings reset (no scrolling region, default colours); after
/// the developer's `n`, the sandbox's settings are back.
fn assert_the_real_prompt(tmux: &Tmux<'_>, region: &str) -> Result {
    let shown = format!("command  {REAL_COMMAND}");
    let screen = match tmux.poll(WAIT, |s| s.contains(&shown))? {
        Ok(screen) => screen,
        Err(screen) => return Err(format!("no prompt:\n{screen}").into()),
    };
    assert!(
        screen.contains("-- lazaret: the sandbox asks to run a command on this host --"),
        "{screen}"
    );
    assert!(
        screen.contains("Run it on the host? Type y and Enter to approve"),
        "the question is shown:\n{screen}"
    );
    assert!(
        !screen.contains("/usr/bin/true"),
        "the fake prompt shows:\n{screen}"
    );
    let state = "#{alternate_on} #{scroll_region_upper}-#{scroll_region_lower} #{origin_flag} \
                 #{insert_flag} #{pane_fg} #{pane_bg}";
    assert_eq!(
        tmux.show(state)?,
        "1 0-29 0 0 default default",
        "the prompt's screen is reset:\n{screen}"
    );
    tmux.type_line("n")?;
    wait_until(WAIT, "the prompt to go", || {
        (tmux.show("#{alternate_on}").ok()? == "0").then_some(())
    })?;
    assert_eq!(
        tmux.show("#{scroll_region_upper}-#{scroll_region_lower} #{pane_fg} #{pane_bg}")?,
        format!("{region} #000000 #000000"),
        "what the sandbox set is back after the prompt"
    );
    Ok(())
}

/// Neither a fake prompt with a scrolling region that traps the real one,
/// nor black on black colours, nor the same written into the interactive
/// session's terminal by a second session that signs the request as the
/// first, can make the prompt show another command or none.
fn painted_terminal() -> Result {
    let (_serial, host) = host_with_config(&escalation_config(&[]));
    let ws = host.workspace.clone();
    up(&host, &ws)?;
    let tmux = shell_in_tmux(&host, "tmux", (100, 30))?;
    let rc = |name: &str| {
        std::fs::read_to_string(ws.join(name))
            .ok()
            .map(|t| t.trim().to_owned())
    };

    // In the session itself: the fake prompt, a two-row scrolling region
    // below it, the request.
    tmux.type_line(&format!(
        "echo $LAZARET_SESSION > /workspace/id-a; echo $$ > /workspace/pid-a; \
         printf '{FAKE_PROMPT}\\033[7;8r\\033[7;1H'; \
         lazaret-escalate /usr/bin/../bin/sh -c 'id > /workspace/ran'; echo rc=$? > /workspace/rc"
    ))?;
    assert_the_real_prompt(&tmux, "6-7")?;
    wait_until(WAIT, "the request's status", || {
        (rc("rc")? == "rc=77").then_some(())
    })?;
    assert!(!ws.join("ran").exists(), "the denied command ran");

    // From a second session without a terminal: the same painted into the
    // first session's shell's output, the request signed as the first.
    let script =
        "printf '{FAKE_PROMPT}\\033[11;12r\\033[11;1H' > /proc/$(cat /workspace/pid-a)/fd/1; \
                  LAZARET_SESSION=$(cat /workspace/id-a) \
                  lazaret-escalate /usr/bin/../bin/sh -c 'id > /workspace/ran'; \
                  echo rc=$? > /workspace/rc2"
            .replace("{FAKE_PROMPT}", FAKE_PROMPT);
    let second = Running::start(attach(&host, &ws, &["sh", "-c", &script]), None)?;
    assert_the_real_prompt(&tmux, "10-11")?;
    let out = second.finish(WAIT)?;
    assert_eq!(rc("rc2").as_deref(), Some("rc=77"), "{}", text(&out));
    assert!(!ws.join("ran").exists(), "the denied command ran");

    // Over a full-screen program, the prompt takes that program's screen,
    // and the program is told to draw it again once the prompt is gone.
    tmux.type_line(
        "printf '\\033[r\\033]110\\007\\033]111\\007\\033[?1049h\\033[H\\033[2Jfull-screen'; \
         trap 'printf \"\\033[H\\033[2Jdrawn-again\"' WINCH; \
         lazaret-escalate /usr/bin/id -g & while :; do sleep 0.2; done",
    )?;
    let asks = |s: &str| s.contains("command  /usr/bin/id -g");
    if let Err(screen) = tmux.poll(WAIT, asks)? {
        return Err(format!("no prompt over the program:\n{screen}").into());
    }
    tmux.type_line("n")?;
    match tmux.poll(WAIT, |s| s.contains("drawn-again") && !asks(s))? {
        Ok(_) => assert_eq!(tmux.show("#{alternate_on}")?, "1"),
        Err(screen) => return Err(format!("the program did not draw again:\n{screen}").into()),
    }
    drop(tmux);
    down(&host, &ws)
}

/// A program that writes without pause while a prompt waits neither ends
/// the session (the Host Coordinator holds the output back instead of
/// timing the client out) nor paints over the prompt.
fn output_while_prompting() -> Result {
    let (_serial, host) = host_with_config(&escalation_config(&[]));
    let ws = host.workspace.clone();
    up(&host, &ws)?;
    let tmux = shell_in_tmux(&host, "tmux", (100, 30))?;
    tmux.type_line(
        "yes & y=$!; lazaret-escalate /usr/bin/id -g; echo rc=$? > /workspace/rc; kill $y",
    )?;
    let asks = |s: &str| s.contains("Run it on the host?") && s.contains("/usr/bin/id -g");
    if let Err(screen) = tmux.poll(WAIT, asks)? {
        return Err(format!("no prompt:\n{screen}").into());
    }
    // Past the coordinator's bound on a client that does not read.
    std::thread::sleep(Duration::from_secs(15));
    let screen = tmux.ok(&["capture-pane", "-p", "-t", "t"])?;
    assert!(asks(&screen), "the prompt is still whole:\n{screen}");
    assert!(
        !has_line(&screen, "y"),
        "output landed on the prompt:\n{screen}"
    );
    tmux.type_line("n")?;
    wait_until(WAIT, "the request's status", || {
        let rc = std::fs::read_to_string(ws.join("rc")).ok()?;
        (rc.trim() == "rc=77").then_some(())
    })?;
    tmux.type_until("clear; echo alive-$((40+2))", "alive-42", WAIT)?;
    drop(tmux);
    down(&host, &ws)
}

/// An interactive `lazaret attach p` in the workspace, in a tmux window of
/// `(columns, rows)` whose server lives under the directory `name`, once its
/// shell answers.
fn shell_in_tmux<'a>(
    host: &'a UserHost,
    name: &str,
    (columns, rows): (u16, u16),
) -> std::result::Result<Tmux<'a>, Failed> {
    let tmux = Tmux {
        host,
        dir: host.user_dir(name),
        cwd: host.workspace.clone(),
    };
    let pane = format!("{} attach p; sleep 60", bin("lazaret").display());
    tmux.start(columns, rows, &pane)?;
    tmux.type_until("echo ready-$((20+22))", "ready-42", Duration::from_secs(30))?;
    Ok(tmux)
}

/// A request as the sandbox would make it, under `bundle`'s binding.
fn request(bundle: &SandboxCredentialBundle, argv: &[&str]) -> MailboxRequest {
    let capability = &bundle.request_capability;
    MailboxRequest {
        protocol_version: ProtocolVersion::V1,
        session_binding: capability.session_binding.clone(),
        request_id: RequestId(lazaret_proto::signing::random_bytes()),
        capability_id: capability.capability_id,
        command_argv: argv.iter().map(|a| (*a).to_owned()).collect(),
        issued_at: UnixTimeNs::now(),
        expires_at: UnixTimeNs::now().after(Duration::from_secs(120)),
    }
}

fn sealed(bundle: &SandboxCredentialBundle, request: &MailboxRequest) -> Vec<u8> {
    lazaret_proto::signing::seal(
        &bundle.protocol_credential.signing_key,
        &MailboxRecord::Request(request.clone()),
    )
    .expect("seal")
}

fn name(request: &MailboxRequest) -> String {
    lazaret_proto::mailbox::record_file_name(request.request_id, RecordFile::Request)
}

fn read_bundle(path: &Path) -> std::result::Result<SandboxCredentialBundle, Failed> {
    let bytes = std::fs::read(path)?;
    Ok(lazaret_proto::codec::decode(&bytes)?)
}

/// Forged records, each planted by the sandbox into a mailbox, are each
/// refused and logged, and the coordinator serves on: another session's
/// key, another generation's, a binding changed, a replayed id, an expired
/// request, a bad signature, a truncated and an oversized file, a link and
/// a FIFO, a request put in another session's mailbox, a rule's executable
/// swapped after `up`, and arguments with a NUL or bytes that are not
/// UTF-8.
fn forgeries() -> Result {
    let dash = canonical("/bin/sh");
    let (_serial, host) = host_with_config("");
    let tools = host.user_dir("tools");
    let tool = tools.join("tool");
    std::fs::copy("/usr/bin/true", &tool)?;
    std::os::unix::fs::chown(&tool, Some(host.uid()), None)?;
    let tool_text = tool.display().to_string();
    host.write_config(&escalation_config(&[
        rule("/usr/bin/id", &["-u"], false),
        rule(&tool_text, &[], false),
        rule(&dash, &["-c"], true),
    ]));
    let ws = host.workspace.clone();

    // A credential of an earlier generation, kept by the sandbox.
    up(&host, &ws)?;
    let out = attached(
        &host,
        &[
            "sh",
            "-c",
            "cp /run/lazaret/mailbox/$LAZARET_SESSION/credential /workspace/cred-old",
        ],
    )?;
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    down(&host, &ws)?;
    let old = read_bundle(&ws.join("cred-old"))?;
    let status = up(&host, &ws)?;
    let coordinator = status["coordinator"]["pid"].as_u64();

    // Session A stays attached; B plants what the host forges into its
    // own mailbox (or A's), one file at a time, as the files name.
    let mut session_a = Running::start(
        attach(
            &host,
            &ws,
            &[
                "sh",
                "-c",
                "cp /run/lazaret/mailbox/$LAZARET_SESSION/credential /workspace/cred-a && \
                 echo $LAZARET_SESSION > /workspace/id-a && sleep 60",
            ],
        ),
        None,
    )?;
    let forged = host.user_dir("project/forged");
    let plant = r#"
        set -ex
        mine=/run/lazaret/mailbox/$LAZARET_SESSION
        cp $mine/credential /workspace/cred-b
        while [ ! -e /workspace/forged/.ready ]; do sleep 0.1; done
        theirs=/run/lazaret/mailbox/$(cat /workspace/id-a)
        for f in /workspace/forged/*; do
            n=${f##*/}; rest=${n#*-}; who=${rest%%-*}; file=${rest#*-}
            if [ "$who" = a ]; then to=$theirs/requests; else to=$mine/requests; fi
            cp "$f" "$to/.$file.part" && mv "$to/.$file.part" "$to/$file"
            sleep 0.4
        done
        # The host refuses and removes these as soon as they appear; the
        # sandbox's own call may then fail (gVisor looks a new entry up
        # after making it), so the host's log is what is checked, not that.
        ln -s /etc/passwd $mine/requests/11111111111111111111111111111111.request || true
        mkfifo $mine/requests/22222222222222222222222222222222.request || true
        echo $LAZARET_SESSION > /workspace/planted
        sleep 3
        echo planted
    "#;
    let session_b = Running::start(attach(&host, &ws, &["sh", "-c", plant]), None)?;
    let a = wait_until(WAIT, "session A's credential", || {
        read_bundle(&ws.join("cred-a")).ok()
    })?;
    let b = wait_until(WAIT, "session B's credential", || {
        read_bundle(&ws.join("cred-b")).ok()
    })?;
    wait_until(WAIT, "session A's id", || {
        std::fs::read(ws.join("id-a")).ok()
    })?;

    // Where each goes (`a` or `b`), its file name, its bytes, and what the
    // refusal must say (nothing: it is valid).
    let mut files: Vec<(&str, String, Vec<u8>, &str)> = Vec::new();
    let id_u = ["/usr/bin/id", "-u"];
    // 1. Signed with session A's key, in B's mailbox.
    let r = request(&b, &id_u);
    files.push(("b", name(&r), sealed(&a, &r), "signature does not verify"));
    // 2. Signed with the earlier generation's key and binding.
    let r = request(&old, &id_u);
    files.push(("b", name(&r), sealed(&old, &r), "signature does not verify"));
    // 3. B's key, but bound to another generation.
    let mut r = request(&b, &id_u);
    r.session_binding.generation_identity.generation_id = GenerationId(99);
    files.push((
        "b",
        name(&r),
        sealed(&b, &r),
        "another session or generation",
    ));
    // 4. A valid request (it runs), then 5. the same file again.
    let r = request(&b, &id_u);
    let valid = sealed(&b, &r);
    files.push(("b", name(&r), valid.clone(), ""));
    files.push(("b", name(&r), valid.clone(), "used before (a replay)"));
    // 6. Expired long before the host reads it.
    let mut r = request(&b, &id_u);
    r.issued_at = UnixTimeNs(UnixTimeNs::now().0 - 600_000_000_000);
    r.expires_at = UnixTimeNs(UnixTimeNs::now().0 - 300_000_000_000);
    files.push(("b", name(&r), sealed(&b, &r), "more than a minute before"));
    // 7. A signature that does not match.
    let r = request(&b, &id_u);
    let mut bad = sealed(&b, &r);
    let last = bad.len() - 1;
    bad[last] ^= 0x40;
    files.push(("b", name(&r), bad, "signature does not verify"));
    // 8. Truncated; 9. larger than any record.
    let r = request(&b, &id_u);
    let whole = sealed(&b, &r);
    files.push((
        "b",
        name(&r),
        whole[..whole.len() / 2].to_vec(),
        "not a signed record",
    ));
    let r = request(&b, &id_u);
    files.push((
        "b",
        name(&r),
        vec![0; MAX_MAILBOX_RECORD_LEN + 4096],
        "it is larger than",
    ));
    // 10. B's own valid request, written into A's mailbox.
    let r = request(&b, &id_u);
    files.push(("a", name(&r), sealed(&b, &r), "signature does not verify"));
    // 11. A rule whose executable is swapped after `up`.
    let r = request(&b, &[tool_text.as_str()]);
    files.push((
        "b",
        name(&r),
        sealed(&b, &r),
        "was replaced since `lazaret up`",
    ));
    // 12. An argument with a NUL.
    let r = request(&b, &[dash.as_str(), "-c", "echo a\0b"]);
    files.push(("b", name(&r), sealed(&b, &r), "contains a NUL"));
    // 13. An argument that is not UTF-8, correctly signed.
    let r = request(&b, &[dash.as_str(), "-c", "echo MARK"]);
    let mut payload =
        lazaret_proto::codec::encode(&MailboxRecord::Request(r.clone())).expect("encode");
    let at = payload
        .windows(4)
        .position(|w| w == b"MARK")
        .ok_or("no mark")?;
    payload[at] = 0xff;
    let not_utf8 =
        lazaret_proto::signing::seal_payload(&b.protocol_credential.signing_key, payload)?;
    files.push(("b", name(&r), not_utf8, "payload is not a mailbox record"));

    // The swap happens now, after `up` checked the file.
    let swapped = tools.join("swapped");
    std::fs::copy("/usr/bin/false", &swapped)?;
    std::os::unix::fs::chown(&swapped, Some(host.uid()), None)?;
    std::fs::rename(&swapped, &tool)?;

    for (i, (who, file, bytes, _)) in files.iter().enumerate() {
        std::fs::write(forged.join(format!("{i:02}-{who}-{file}")), bytes)?;
    }
    std::fs::write(forged.join(".ready"), b"")?;
    // gVisor keeps a FIFO made on a host directory inside the sandbox:
    // the host's side of B's mailbox never holds one (the coordinator's own
    // refusal of FIFOs is unit-tested), and the link is taken away.
    let b_id = match wait_until(Duration::from_secs(60), "the plants", || {
        std::fs::read_to_string(ws.join("planted")).ok()
    }) {
        Ok(id) => id,
        // Show what the plant script did (it traces each command) and
        // what the coordinator logged.
        Err(e) => {
            let b = match session_b.finish(Duration::ZERO) {
                Ok(out) => text(&out),
                Err(e) => format!("{e:?}"),
            };
            return Err(format!("{e:?}; session B: {b}; the log:\n{}", log(&host)).into());
        }
    };
    let supervisor = status["supervisor"]["pid"]
        .as_u64()
        .ok_or("no supervisor pid")?;
    let runsc_root = status["runsc_root"].as_str().ok_or("no runsc root")?;
    let host_requests = PathBuf::from(format!("/proc/{supervisor}/root{runsc_root}"))
        .with_file_name("mailbox")
        .join(b_id.trim())
        .join("requests");
    let left = wait_until(WAIT, "the link to be taken away", || {
        let names: Vec<String> = std::fs::read_dir(&host_requests)
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        (!names.iter().any(|n| n.starts_with("1111"))).then_some(names)
    })?;
    assert!(
        left.is_empty(),
        "the host's side of the mailbox holds {left:?}"
    );
    let planted = session_b.finish(Duration::from_secs(60))?;
    assert!(stdout(&planted).contains("planted"), "{}", text(&planted));

    let log = match wait_until(WAIT, "the last refusal in the log", || {
        let log = log(&host);
        log.contains("symbolic link").then_some(log)
    }) {
        Ok(log) => log,
        Err(e) => return Err(format!("{e:?}; the log:\n{}", log(&host)).into()),
    };
    // Each refusal is a log line naming the request (as its file, or, for
    // a request refused with a result, as its id) and saying why.
    let refused = |file: &str, why: &str| {
        let id = file.split('.').next().unwrap_or(file);
        log.lines().any(|l| {
            (l.contains("refused") || l.contains("outcome=Refused"))
                && l.contains(id)
                && l.contains(why)
        })
    };
    for (who, file, _, why) in &files {
        if !why.is_empty() {
            assert!(
                refused(file, why),
                "{who}/{file}: no refusal saying `{why}` in the log:\n{log}"
            );
        }
    }
    assert!(
        refused("11111111111111111111111111111111.request", "symbolic link"),
        "{log}"
    );
    // The valid request ran once.
    let ran = log
        .lines()
        .filter(|l| l.contains("escalation launched"))
        .count();
    assert_eq!(ran, 1, "{log}");

    // The coordinator serves on: the same process answers a new request.
    let out = attached(&host, &["lazaret-escalate", "/usr/bin/id", "-u"])?;
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    let status = host
        .status(&ws, "p")
        .ok_or("not running after the forgeries")?;
    assert_eq!(status["coordinator"]["pid"].as_u64(), coordinator);
    session_a.kill()?;
    drop(session_a);
    down(&host, &ws)
}

/// With escalation off, every request is refused, saying so.
fn disabled() -> Result {
    let (_serial, host) = host_with_config(&config(&busybox_image(), "\"/root\""));
    let ws = host.workspace.clone();
    up(&host, &ws)?;
    let out = attached(&host, &["lazaret-escalate", "/usr/bin/id", "-u"])?;
    assert_eq!(code(&out), Some(78), "{}", text(&out));
    assert!(stdout(&out).contains("escalation is off"), "{}", text(&out));
    assert!(!has(&out, &host.uid().to_string()), "{}", text(&out));
    // Outside a session, the client says where it must run.
    let status = host.status(&ws, "p").ok_or("not running")?;
    let out = host.exec(&status, "/run/lazaret/bin/lazaret-escalate /usr/bin/id -u");
    assert_eq!(code(&out), Some(69), "{}", text(&out));
    assert!(stderr(&out).contains("LAZARET_SESSION"), "{}", text(&out));
    down(&host, &ws)
}

/// A request for a host path no rule names gets the same reply whether
/// the path is a private file (`0600`), a directory or nothing at all:
/// without a terminal, and with one, where the developer is asked about
/// each and only the prompt says why it cannot run.
fn host_files_unrevealed() -> Result {
    let (_serial, host) =
        host_with_config(&escalation_config(&[rule("/usr/bin/id", &["-u"], false)]));
    let (uid, gid) = lazaret_tests::domain::test_user();
    let ssh = host.home.join(".ssh");
    std::fs::create_dir_all(&ssh)?;
    let key = ssh.join("id_ed25519");
    std::fs::write(&key, "-----BEGIN OPENSSH PRIVATE KEY-----\n")?;
    for (path, mode) in [(&ssh, 0o700), (&key, 0o600)] {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
    }
    let paths = [
        key.display().to_string(),
        ssh.display().to_string(),
        ssh.join("id_missing").display().to_string(),
    ];
    let ws = host.workspace.clone();
    up(&host, &ws)?;

    // The reply with the path asked for taken out, and its exit status.
    let reply = |path: &str, code: Option<i32>, said: &str| {
        format!("{code:?}: {}", said.replace(path, "PATH"))
    };
    let mut without_terminal = Vec::new();
    for path in &paths {
        let out = attached(&host, &["lazaret-escalate", path])?;
        without_terminal.push(reply(path, code(&out), &stdout(&out)));
    }
    assert!(
        without_terminal.iter().all(|r| *r == without_terminal[0]),
        "without a terminal: {without_terminal:#?}"
    );

    let tmux = shell_in_tmux(&host, "tmux", (160, 40))?;
    let mut with_terminal = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        tmux.type_line(&format!(
            "clear; lazaret-escalate {path} >/workspace/reply-{i} 2>&1; echo rc-$?-{i}"
        ))?;
        // The status line, `rc-STATUS-i`, as the pane shows it.
        let status = |s: &str| {
            s.lines().find_map(|l| {
                l.trim_end()
                    .strip_prefix("rc-")?
                    .strip_suffix(&format!("-{i}"))
                    .map(str::to_owned)
            })
        };
        let screen = match tmux.poll(WAIT, |s| {
            s.contains("the sandbox asks to run a command") || status(s).is_some()
        })? {
            Ok(screen) => screen,
            Err(screen) => return Err(format!("{path}: no prompt and no end:\n{screen}").into()),
        };
        // Each is asked about, whatever is at the path; the developer sees
        // why it cannot run, and even `y` runs nothing.
        assert!(
            status(&screen).is_none() && screen.contains("cannot run"),
            "{path} was not asked about: {screen}"
        );
        tmux.type_line("y")?;
        let screen = match tmux.poll(WAIT, |s| status(s).is_some())? {
            Ok(screen) => screen,
            Err(screen) => return Err(format!("{path}: no end:\n{screen}").into()),
        };
        let said = std::fs::read_to_string(ws.join(format!("reply-{i}")))?;
        let rc = status(&screen).unwrap_or_default().parse::<i32>().ok();
        with_terminal.push(reply(path, rc, &said));
    }
    assert!(
        with_terminal.iter().all(|r| *r == with_terminal[0]),
        "with a terminal: {with_terminal:#?}"
    );
    drop(tmux);
    down(&host, &ws)
}

/// The live processes of `uid` on the host that are `sleep N` for one of
/// `numbers`, as (pid, N).
fn host_sleeps(uid: u32, numbers: &[u32]) -> Vec<(u32, u32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let mut words = cmdline.split(|b| *b == 0);
            let program = words.next()?;
            if !program.ends_with(b"sleep") {
                return None;
            }
            let n: u32 = std::str::from_utf8(words.next()?).ok()?.parse().ok()?;
            let owner = std::os::unix::fs::MetadataExt::uid(
                &std::fs::metadata(format!("/proc/{pid}")).ok()?,
            );
            (numbers.contains(&n) && owner == uid && lazaret_tests::domain::pid_exists(pid.into()))
                .then_some((pid, n))
        })
        .collect()
}

/// Kills, when dropped, the test user's `sleep`s a failed trial left on
/// the host.
struct Sweep {
    uid: u32,
    numbers: Vec<u32>,
}

impl Drop for Sweep {
    fn drop(&mut self) {
        for (pid, _) in host_sleeps(self.uid, &self.numbers) {
            let _ = lazaret_tests::domain::signal(pid.into(), "KILL");
        }
    }
}

/// Waits until every one of `numbers` runs as a `sleep` on the host.
fn sleeping(host: &UserHost, numbers: &[u32]) -> Result {
    wait_until(WAIT, &format!("sleeps {numbers:?} on the host"), || {
        let found = host_sleeps(host.uid(), numbers);
        numbers
            .iter()
            .all(|n| found.iter().any(|(_, m)| m == n))
            .then_some(())
    })?;
    Ok(())
}

/// Waits until none of `numbers` runs on the host any more; says which
/// did when some stay.
fn gone(host: &UserHost, numbers: &[u32], after: &str) -> Result {
    match wait_until(Duration::from_secs(3), after, || {
        host_sleeps(host.uid(), numbers).is_empty().then_some(())
    }) {
        Ok(()) => Ok(()),
        Err(_) => Err(format!(
            "{after}, these still run on the host: {:?}",
            host_sleeps(host.uid(), numbers)
        )
        .into()),
    }
}

/// What an approved command starts in sessions of its own (`setsid`,
/// `setsid -f`) ends with it: when it exits, when it is cancelled, when
/// its session ends and when the Domain goes down.
fn setsid_children() -> Result {
    let dash = canonical("/bin/sh");
    let (_serial, host) = host_with_config(&escalation_config(&[rule(&dash, &["-c"], true)]));
    let _sweep = Sweep {
        uid: host.uid(),
        numbers: (303..=313).collect(),
    };
    let ws = host.workspace.clone();
    up(&host, &ws)?;
    let escapees =
        |a: u32, b: u32, then: &str| format!("setsid sleep {a} & setsid -f sleep {b}{then}");

    // It exits as soon as both run, leaving two sessions behind.
    let started = "; for i in $(seq 50); do \
                   pgrep -f '^sleep 303$' >/dev/null && pgrep -f '^sleep 304$' >/dev/null \
                   && echo both-started && break; sleep 0.1; done";
    let out = attached(
        &host,
        &[
            "lazaret-escalate",
            &dash,
            "-c",
            &escapees(303, 304, started),
        ],
    )?;
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert!(has(&out, "both-started"), "{}", text(&out));
    gone(&host, &[303, 304], "after the command exited")?;

    // It is cancelled from inside the sandbox while it runs.
    let script = format!(
        "lazaret-escalate {dash} -c '{}' & c=$!; \
         while [ ! -e /workspace/cancel ]; do sleep 0.1; done; \
         kill -TERM $c; wait $c; echo rc=$?",
        escapees(305, 306, "; sleep 307")
    );
    let cancelled = Running::start(attach(&host, &ws, &["sh", "-c", &script]), None)?;
    sleeping(&host, &[305, 306, 307])?;
    std::fs::write(ws.join("cancel"), b"")?;
    let out = cancelled.finish(WAIT)?;
    assert!(has(&out, "rc=130"), "{}", text(&out));
    gone(&host, &[305, 306, 307], "after the request was cancelled")?;

    // A session whose approved command leaves `setsid` sleeps `a` and `b`
    // behind and sleeps `c` itself, once all three run.
    let escaping = |[a, b, c]: [u32; 3]| -> std::result::Result<Running, Failed> {
        let command = escapees(a, b, &format!("; sleep {c}"));
        let session = Running::start(
            attach(&host, &ws, &["lazaret-escalate", &dash, "-c", &command]),
            None,
        )?;
        sleeping(&host, &[a, b, c])?;
        Ok(session)
    };

    // Its session ends (the client is killed).
    let mut session = escaping([308, 309, 310])?;
    session.kill()?;
    drop(session);
    gone(&host, &[308, 309, 310], "after its session ended")?;

    // The Domain goes down.
    let running = escaping([311, 312, 313])?;
    down(&host, &ws)?;
    gone(&host, &[311, 312, 313], "after `lazaret down`")?;
    drop(running);
    Ok(())
}

/// The Domain's log files (the current one and the one before it), with
/// their sizes.
fn log_files(host: &UserHost) -> Vec<(PathBuf, u64)> {
    let domains = host.runtime.join("lazaret/domains");
    let mut found = Vec::new();
    for domain in std::fs::read_dir(domains).into_iter().flatten().flatten() {
        for name in ["coordinator.log", "coordinator.log.1"] {
            let path = domain.path().join(name);
            if let Ok(meta) = std::fs::metadata(&path) {
                found.push((path, meta.len()));
            }
        }
    }
    found
}

/// The last 4,000 characters of `text`.
fn tail(text: &str) -> String {
    let skip = text.chars().count().saturating_sub(4000);
    text.chars().skip(skip).collect()
}

fn log_bytes(host: &UserHost) -> u64 {
    log_files(host).iter().map(|(_, len)| len).sum()
}

/// A sandbox that floods its mailbox for seconds, with garbage files by
/// the thousand a second and with requests of 100 KB arguments (with
/// escalation off, each is refused), leaves a log that grew by little,
/// whose lines are all short, and which says how many refusals it did not
/// write out.
fn flood() -> Result {
    let (_serial, host) = host_with_config(&config(&busybox_image(), "\"/root\""));
    let ws = host.workspace.clone();
    up(&host, &ws)?;
    let before = log_bytes(&host);
    let script = r#"
        m=/run/lazaret/mailbox/$LAZARET_SESSION/requests
        big=$(head -c 100000 /dev/zero | tr '\0' a)
        ( i=0; while [ ! -e /tmp/stop ]; do
            i=$((i+1)); echo garbage > $m/g$i.request
            # Room for the requests' results: a full mailbox would only
            # stop this session's own escalation.
            if [ $((i % 200)) = 0 ]; then sleep 0.05; fi
          done; echo files=$i ) &
        ( i=0; while [ ! -e /tmp/stop ]; do
            i=$((i+1)); lazaret-escalate --timeout 10 /usr/bin/id "$big" >/dev/null 2>&1
          done; echo requests=$i ) &
        sleep 8; touch /tmp/stop; wait; echo flooded
    "#;
    let out = run(attach(&host, &ws, &["sh", "-c", script]), None)?;
    assert!(has(&out, "flooded"), "{}", text(&out));
    let count = |what: &str| {
        stdout(&out)
            .lines()
            .find_map(|l| l.strip_prefix(what)?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let (files, requests) = (count("files="), count("requests="));
    assert!(files > 1000 && requests > 10, "{}", text(&out));

    // The refusals past the first few are counted, and the count is
    // written once their period ends.
    let log = match wait_until(Duration::from_secs(20), "the refusals' summary", || {
        let log = log(&host);
        log.contains("refusals of this session were not logged")
            .then_some(log)
    }) {
        Ok(log) => log,
        Err(e) => {
            let log = log(&host);
            return Err(
                format!("{e:?}; {} bytes of log, ending:\n{}", log.len(), tail(&log)).into(),
            );
        }
    };
    let grew = log_bytes(&host).saturating_sub(before);
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    eprintln!(
        "flood: {files} files and {requests} requests of 100 KB in 8 s; the log grew by \
         {grew} bytes, its longest line {longest} bytes"
    );
    assert!(grew < 256 * 1024, "the log grew by {grew} bytes");
    for (path, len) in log_files(&host) {
        assert!(
            len <= 4 * 1024 * 1024,
            "{} holds {len} bytes",
            path.display()
        );
    }
    assert!(longest <= 8 * 1024, "a log line of {longest} bytes");
    down(&host, &ws)?;

    // A log at its limit when the next generation starts is rotated, and
    // `lazaret logs` shows the file before the rotation, then the new one.
    let (current, _) = log_files(&host)
        .into_iter()
        .find(|(p, _)| p.ends_with("coordinator.log"))
        .ok_or("no log file")?;
    let mut file = std::fs::OpenOptions::new().append(true).open(&current)?;
    let filler = format!("{}\n", "x".repeat(1023));
    std::io::Write::write_all(&mut file, b"the-last-line-before-the-rotation\n")?;
    for _ in 0..4096 {
        std::io::Write::write_all(&mut file, filler.as_bytes())?;
    }
    drop(file);
    up(&host, &ws)?;
    let files = log_files(&host);
    let size = |name: &str| {
        files
            .iter()
            .find(|(p, _)| p.ends_with(name))
            .map(|(_, len)| *len)
    };
    assert!(
        size("coordinator.log.1") > Some(4 * 1024 * 1024),
        "{files:?}"
    );
    assert!(size("coordinator.log") < Some(64 * 1024), "{files:?}");
    let shown = self::log(&host);
    let before = shown.find("the-last-line-before-the-rotation");
    let continued = shown.find("the Domain log continues here");
    assert!(
        before.is_some() && continued.is_some() && before < continued,
        "{}",
        tail(&shown)
    );
    down(&host, &ws)
}
