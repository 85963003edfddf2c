//! Named pause points for the fault-injection tests, compiled into debug
//! builds only: a release build has none.
//!
//! With `LAZARET_FAULT_PAUSE=STEP` in its environment, a process that
//! reaches `STEP` writes its pid to the file `LAZARET_FAULT_MARKER` names
//! and stops itself (SIGSTOP), so a test can kill any participant at that
//! exact point and then let it go on (SIGCONT). The steps are the
//! lifecycle's durable points: `intent:SLOT` after a participant's intent
//! is committed, `active:SLOT` after what it became is, `release:SLOT`
//! after its release intent is, `image:staged` once a preparation's
//! operation is recorded and its staging directory held. With
//! `LAZARET_FAULT_TRACE=FILE`, every step reached is appended to `FILE`,
//! so a test learns the steps of this build in their order. Trusts its
//! own environment, which only the invoking user sets.

/// Pauses here if the environment names step `KIND:NAME` (debug builds
/// only; a release build does not even form the name).
pub fn point(kind: &str, name: &str) {
    #[cfg(debug_assertions)]
    {
        let step = format!("{kind}:{name}");
        if let Some(trace) = std::env::var_os("LAZARET_FAULT_TRACE") {
            use std::io::Write;
            if let Ok(mut file) = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(trace)
            {
                let _ = writeln!(file, "{step}");
            }
        }
        if std::env::var("LAZARET_FAULT_PAUSE").as_deref() == Ok(step.as_str()) {
            if let Some(marker) = std::env::var_os("LAZARET_FAULT_MARKER") {
                let _ = std::fs::write(marker, format!("{}\n", std::process::id()));
            }
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::STOP,
            );
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = (kind, name);
}
