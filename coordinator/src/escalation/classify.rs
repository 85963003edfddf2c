//! How a request's `command_argv` is classified against the profile's
//! auto-approval rules (seed §3.2): pure, no filesystem.
//!
//! Element zero must be byte-for-byte the rule's canonical executable path
//! and the rest must be the rule's arguments exactly, or (with
//! `allow_extra_args`) begin with them. Nothing is looked up on `PATH`, no
//! path is normalized, and a form that needs a shell is never run. Whatever
//! no rule approves is a question for the developer, or refused when it
//! cannot be run as a direct vector at all.

use lazaret_proto::config::ResolvedAutoApprovalRule;
use lazaret_proto::mailbox::CommandArgvError;

/// What a request is, against the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classification {
    /// Rule `rule` (its index in `auto_approve`) approves it as it is.
    AutoApproved {
        /// The rule's index.
        rule: usize,
    },
    /// A direct vector that no rule approves: only the developer may.
    AskDeveloper {
        /// Why no rule approved it, naming the nearest rule.
        reason: String,
    },
    /// `CommandRequiresShell`: a command string, not a vector. Lazaret never
    /// interprets one, so it is refused.
    RequiresShell {
        /// What gave it away.
        reason: String,
    },
    /// Breaks the structural rules (empty, NUL, not an absolute path, too
    /// long): refused.
    Invalid {
        /// The rule broken, and what to do.
        reason: String,
    },
}

/// Characters that mean a shell was expected to read the text.
const SHELL_SYNTAX: &[char] = &[
    ' ', '\t', '\n', '|', '&', ';', '<', '>', '(', ')', '$', '`', '\\', '"', '\'', '*', '?', '[',
    ']', '#', '~', '=', '%', '{', '}',
];

/// The argv as the developer and the log see it: each element quoted
/// where it would be ambiguous, control characters escaped.
pub fn shown(argv: &[String]) -> String {
    quoted(argv, |c, out| out.extend(c.escape_debug()))
}

/// The argv as a prompt shows it: as [`shown`], with every character
/// outside printable ASCII escaped too (`\u{e9}`), so that what the
/// developer reads is what runs, whatever a terminal makes of other
/// characters (their width, their direction, look-alike letters).
pub fn shown_ascii(argv: &[String]) -> String {
    quoted(argv, |c, out| {
        if c.is_ascii() {
            out.extend(c.escape_debug());
        } else {
            out.extend(c.escape_unicode());
        }
    })
}

/// Each element escaped by `escape`, and quoted when it is empty, holds
/// shell syntax or was escaped.
fn quoted(argv: &[String], escape: impl Fn(char, &mut String)) -> String {
    argv.iter()
        .map(|a| {
            let mut escaped = String::with_capacity(a.len());
            for c in a.chars() {
                escape(c, &mut escaped);
            }
            if a.is_empty() || a.contains(SHELL_SYNTAX) || escaped != *a {
                format!("\"{escaped}\"")
            } else {
                escaped
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn rule_shown(rule: &ResolvedAutoApprovalRule) -> String {
    let mut argv = vec![String::from_utf8_lossy(&rule.canonical_executable).into_owned()];
    argv.extend(rule.args.iter().cloned());
    let extra = if rule.allow_extra_args { " ..." } else { "" };
    format!("{}{extra}", shown(&argv))
}

/// Whether `rule` approves `argv` exactly as it stands.
fn matches(rule: &ResolvedAutoApprovalRule, argv: &[String]) -> bool {
    let Some((program, args)) = argv.split_first() else {
        return false;
    };
    if program.as_bytes() != rule.canonical_executable.as_slice() {
        return false;
    }
    if rule.allow_extra_args {
        // A rule with extra arguments has at least one of its own (the
        // configuration refuses one without); its arguments are a prefix.
        !rule.args.is_empty() && args.starts_with(&rule.args)
    } else {
        args == rule.args.as_slice()
    }
}

/// Classifies `argv` against `rules` (in declared order).
pub fn classify(argv: &[String], rules: &[ResolvedAutoApprovalRule]) -> Classification {
    let structural = lazaret_proto::mailbox::MailboxRequest::validate_argv(argv);
    let Some(program) = argv.first() else {
        return invalid(CommandArgvError::Empty);
    };
    if argv.len() == 1 && program.contains(SHELL_SYNTAX) && !program.starts_with('/') {
        return Classification::RequiresShell {
            reason: format!(
                "{} is a command string for a shell; Lazaret runs only an absolute \
                 executable path and its arguments as separate words, never a shell",
                shown(argv)
            ),
        };
    }
    if let Err(error) = structural {
        return invalid(error);
    }
    if let Some(rule) = rules.iter().position(|r| matches(r, argv)) {
        return Classification::AutoApproved { rule };
    }
    let same_program: Vec<(usize, &ResolvedAutoApprovalRule)> = rules
        .iter()
        .enumerate()
        .filter(|(_, r)| r.canonical_executable == program.as_bytes())
        .collect();
    let reason = match same_program.as_slice() {
        [] if rules.is_empty() => "the profile has no auto-approval rules".to_owned(),
        [] => format!(
            "no auto-approval rule names {} (rules name canonical paths, compared byte for byte)",
            shown(std::slice::from_ref(program))
        ),
        [(i, rule), ..] => format!(
            "auto_approve[{i}] ({}) does not match these arguments",
            rule_shown(rule)
        ),
    };
    Classification::AskDeveloper { reason }
}

fn invalid(error: CommandArgvError) -> Classification {
    Classification::Invalid {
        reason: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(exe: &str, args: &[&str], extra: bool) -> ResolvedAutoApprovalRule {
        ResolvedAutoApprovalRule {
            canonical_executable: exe.as_bytes().to_vec(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            allow_extra_args: extra,
        }
    }

    fn argv(list: &[&str]) -> Vec<String> {
        list.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn exact_rules_match_exactly() {
        let rules = [rule("/usr/bin/id", &["-u"], false)];
        assert_eq!(
            classify(&argv(&["/usr/bin/id", "-u"]), &rules),
            Classification::AutoApproved { rule: 0 }
        );
        for other in [
            &["/usr/bin/id", "-g"][..],
            &["/usr/bin/id"],
            &["/usr/bin/id", "-u", "-n"],
            &["/bin/../usr/bin/id", "-u"],
            &["/usr/bin//id", "-u"],
            &["/usr/bin/id ", "-u"],
        ] {
            assert!(
                matches!(
                    classify(&argv(other), &rules),
                    Classification::AskDeveloper { .. }
                ),
                "{other:?}"
            );
        }
    }

    #[test]
    fn extra_arguments_follow_the_rules_prefix() {
        let rules = [rule("/usr/bin/gh", &["pr", "view"], true)];
        let ok =
            |a: &[&str]| classify(&argv(a), &rules) == Classification::AutoApproved { rule: 0 };
        assert!(ok(&["/usr/bin/gh", "pr", "view"]));
        assert!(ok(&["/usr/bin/gh", "pr", "view", "12", "--json"]));
        assert!(!ok(&["/usr/bin/gh", "pr"]));
        assert!(!ok(&["/usr/bin/gh", "pr", "merge", "view"]));
        assert!(!ok(&["/usr/bin/gh", "view", "pr"]));
    }

    #[test]
    fn the_first_matching_rule_is_named() {
        let rules = [
            rule("/bin/ls", &["-l"], false),
            rule("/bin/ls", &["-la"], false),
        ];
        assert_eq!(
            classify(&argv(&["/bin/ls", "-la"]), &rules),
            Classification::AutoApproved { rule: 1 }
        );
        let Classification::AskDeveloper { reason } = classify(&argv(&["/bin/ls", "-R"]), &rules)
        else {
            panic!("not asked")
        };
        assert!(reason.contains("auto_approve[0] (/bin/ls -l)"), "{reason}");
    }

    #[test]
    fn shells_paths_and_bad_bytes_are_never_approved() {
        let rules = [rule("/bin/sh", &["-c", "make test"], false)];
        // The exact configured shell vector matches only itself.
        assert_eq!(
            classify(&argv(&["/bin/sh", "-c", "make test"]), &rules),
            Classification::AutoApproved { rule: 0 }
        );
        assert!(matches!(
            classify(&argv(&["/bin/sh", "-c", "make test; rm -rf /"]), &rules),
            Classification::AskDeveloper { .. }
        ));
        assert!(matches!(
            classify(&argv(&["make test && echo ok"]), &rules),
            Classification::RequiresShell { .. }
        ));
        for bad in [&["id"][..], &["./id", "-u"], &["usr/bin/id"], &[]] {
            assert!(
                matches!(classify(&argv(bad), &rules), Classification::Invalid { .. }),
                "{bad:?}"
            );
        }
        assert!(matches!(
            classify(&argv(&["/bin/echo", "a\0b"]), &rules),
            Classification::Invalid { .. }
        ));
    }

    #[test]
    fn what_is_shown_cannot_hide_anything() {
        let text = shown(&argv(&["/bin/echo", "a b", "\u{1b}[2J", "", "plain"]));
        assert_eq!(text, "/bin/echo \"a b\" \"\\u{1b}[2J\" \"\" plain");
        assert!(!text.chars().any(char::is_control));
        let bidi = shown(&argv(&["/bin/echo", "\u{202e}evil"]));
        assert!(!bidi.contains('\u{202e}'), "{bidi}");
    }
}
