//! `lazaret completions SHELL` and `lazaret man-pages DIR`: what the shells
//! and `man` know of the command line, generated from the clap definitions
//! in `args.rs` so they cannot disagree with the parser.
//!
//! Owns the page names (`lazaret.1`, `lazaret-up.1`,
//! `lazaret-state-reset.1`, ...). Trusts nothing but the directory the user
//! names, which it writes pages into by rename.

use std::path::Path;

use clap::CommandFactory;

use super::args::Cli;
use super::{Failure, failure};

/// `lazaret completions SHELL`: the script on standard output.
pub(super) fn completions(shell: clap_complete::Shell) -> Result<(), Failure> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "lazaret", &mut script);
    super::print_bytes(&script)
}

/// `lazaret man-pages DIR`: one page per command and subcommand.
pub(super) fn man_pages(dir: &Path) -> Result<(), Failure> {
    let mut command = Cli::command();
    command.build();
    let mut written = Vec::new();
    write_pages(&command, "lazaret", dir, &mut written)?;
    super::print(&format!(
        "wrote {} man pages in {}\n",
        written.len(),
        dir.display()
    ))
}

/// Writes `name`'s page and those of its subcommands, each named after the
/// words that reach it (`lazaret-state-reset`).
fn write_pages(
    command: &clap::Command,
    name: &str,
    dir: &Path,
    written: &mut Vec<String>,
) -> Result<(), Failure> {
    let page = command.clone().name(name.to_owned());
    let mut roff = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut roff)
        .map_err(|e| failure(format!("cannot render the man page of {name}: {e}")))?;
    let file = format!("{name}.1");
    write_replacing(&dir.join(&file), &roff)?;
    written.push(file);
    for sub in command.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}

/// Writes `path` (mode 0644) by a rename from a new file beside it, so a
/// page is either the old one or the whole new one.
fn write_replacing(path: &Path, contents: &[u8]) -> Result<(), Failure> {
    let staging = path.with_extension("1.new");
    // One an interrupted run left is ours to replace.
    let _ = std::fs::remove_file(&staging);
    super::replace_by_rename(path, &staging, contents, 0o644, || Ok(()))
        .map_err(|e| failure(format!("cannot write {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_for_every_command() {
        let dir = tempfile::tempdir().unwrap();
        man_pages(dir.path()).unwrap();
        for page in [
            "lazaret.1",
            "lazaret-up.1",
            "lazaret-attach.1",
            "lazaret-config-check.1",
            "lazaret-state-reset.1",
            "lazaret-completions.1",
        ] {
            let text = std::fs::read_to_string(dir.path().join(page)).unwrap();
            assert!(text.starts_with(".ie"), "{page}: {text}");
            assert!(text.contains(".SH NAME"), "{page}");
        }
        let up = std::fs::read_to_string(dir.path().join("lazaret-up.1")).unwrap();
        assert!(up.contains("PROFILE"), "{up}");
        assert!(!dir.path().join("lazaret-help.1").exists());
        // Generating again replaces the pages.
        man_pages(dir.path()).unwrap();
        let names = std::fs::read_dir(dir.path()).unwrap().count();
        assert!(names > 15, "{names} pages");
        assert!(
            std::fs::read_dir(dir.path()).unwrap().all(|e| e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".1"))
        );
    }
}
