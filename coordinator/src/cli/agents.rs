//! `lazaret config init --agent AGENT`: a ready profile for one of the
//! coding agents Lazaret ships images for, written as a new configuration
//! or appended to the user's existing one.
//!
//! Owns what each agent needs: its image tag (built by
//! `packaging/images/build-agent-image.sh`), its API key variable, the
//! directory it keeps its own state in, and the hosts it talks to. An
//! existing file is read as `up` reads it, the result is decoded before
//! anything is written, and it is replaced by rename: the file is the old
//! one or the whole new one, never a mix.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{CONFIG_TEMPLATE, EXIT_INVALID, Failure, failure};
use crate::config::{self, HostEnvironment};
use crate::lifecycle::chain;
use lazaret_proto::config::ProfileName;

/// The agents `config init --agent` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Agent {
    /// Claude Code (npm `@anthropic-ai/claude-code`).
    Claude,
    /// OpenAI Codex CLI (npm `@openai/codex`).
    Codex,
    /// Gemini CLI (npm `@google/gemini-cli`).
    Gemini,
    /// opencode (npm `opencode-ai`).
    Opencode,
}

/// What a profile for one agent says.
struct AgentProfile {
    /// The name shown to people.
    title: &'static str,
    /// The npm package in its image.
    package: &'static str,
    /// The host variable holding its API key, passed in by reference.
    key: &'static str,
    /// Where it keeps its own state inside the sandbox (beneath `/root`).
    state_dir: &'static str,
    /// Published IPv4 ranges of its API, allowed by default.
    allow: &'static [(&'static str, &'static str)],
    /// Hosts it talks to that publish no stable range: named in the
    /// profile, for the user to resolve and allow.
    hosts: &'static [&'static str],
}

impl Agent {
    /// The image tag and default profile name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Claude => "claude",
            Self::Codex => "codex",
            Self::Gemini => "gemini",
            Self::Opencode => "opencode",
        }
    }

    fn profile(self) -> AgentProfile {
        match self {
            Self::Claude => AgentProfile {
                title: "Claude Code",
                package: "@anthropic-ai/claude-code",
                key: "ANTHROPIC_API_KEY",
                state_dir: "/root/.claude",
                allow: &[(
                    "160.79.104.0/23",
                    "api.anthropic.com: Anthropic's published API range",
                )],
                hosts: &[],
            },
            Self::Codex => AgentProfile {
                title: "Codex CLI",
                package: "@openai/codex",
                key: "OPENAI_API_KEY",
                state_dir: "/root/.codex",
                allow: &[],
                hosts: &["api.openai.com"],
            },
            Self::Gemini => AgentProfile {
                title: "Gemini CLI",
                package: "@google/gemini-cli",
                key: "GEMINI_API_KEY",
                state_dir: "/root/.gemini",
                allow: &[],
                hosts: &["generativelanguage.googleapis.com"],
            },
            Self::Opencode => AgentProfile {
                title: "opencode",
                package: "opencode-ai",
                key: "ANTHROPIC_API_KEY",
                state_dir: "/root/.local/share/opencode",
                allow: &[(
                    "160.79.104.0/23",
                    "api.anthropic.com: Anthropic's published API range",
                )],
                hosts: &["models.dev"],
            },
        }
    }
}

/// Where `build-agent-image.sh` is told to put the agent images:
/// `$XDG_DATA_HOME/lazaret-images` (an OCI layout, one tag per agent).
pub fn default_layout(host: &HostEnvironment) -> Result<PathBuf, Failure> {
    Ok(host.data_home()?.join("lazaret-images"))
}

/// `text` as a TOML basic string: quoted, with `"`, `\` and the control
/// characters escaped (nothing else needs it).
fn toml_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Where `build-agent-image.sh` is: installed by the package, else in the
/// sources.
fn image_script() -> &'static str {
    const INSTALLED: &str = "/usr/share/lazaret/images/build-agent-image.sh";
    if Path::new(INSTALLED).is_file() {
        INSTALLED
    } else {
        "packaging/images/build-agent-image.sh"
    }
}

/// The TOML of profile `name` for `agent` on `image`, with the comments
/// that say how to finish it. The name is a valid profile name; it and the
/// image are written as quoted strings.
pub fn profile_text(agent: Agent, name: &str, image: &str) -> String {
    let p = agent.profile();
    let mut text = format!(
        "\n# {title} (npm {package}), written by `lazaret config init --agent {agent}`.\n\
         # `lazaret attach {name}` starts {title} (a login shell in its image does);\n\
         # `lazaret attach {name} -- bash` opens a shell instead.\n\
         [profiles.{table}]\n\
         # Built by: {script} {agent} LAYOUT\n\
         image = {image}\n\
         # The project's git-ignored files (.env, node_modules, build output)\n\
         # stay out of the sandbox; it gets its own, kept between runs.\n\
         isolate_gitignored = true\n\
         # /root keeps what the agent installs and its caches between runs.\n\
         persistent_dirs = [\"/root\"]\n\
         # The agent's own state (login, settings, history) in this profile's\n\
         # storage on the host (<storage>/profiles/{name}/state).\n\
         volumes = [\n  \
           {{ host = \"{{profile_dir}}/state\", container = \"{state}\", kind = \"directory\", access = \"read-write\", create = true }},\n\
         ]\n\
         # The API key by reference: `export {key}=...` before `lazaret up {name}`.\n\
         # Its value is never written to disk or logged.\n\
         env = {{ {key} = \"env:{key}\" }}\n",
        title = p.title,
        package = p.package,
        table = toml_string(name),
        script = image_script(),
        image = toml_string(image),
        agent = agent.name(),
        state = p.state_dir,
        key = p.key,
    );
    text.push_str(
        "# Where the sandbox may connect: IPv4 prefixes, everything else is\n\
         # unreachable (RFC 1918 always is). Add what your work needs, e.g. a\n\
         # package registry: `getent ahostsv4 registry.npmjs.org`, then each\n\
         # address as \"A.B.C.D/32\" (CDN addresses change; check again when it fails).\n",
    );
    for host in p.hosts {
        text.push_str(&format!(
            "# {host} publishes no fixed range: `getent ahostsv4 {host}`, add each /32.\n"
        ));
    }
    let allowed: Vec<String> = p
        .allow
        .iter()
        .map(|(prefix, why)| format!("  \"{prefix}\", # {why}\n"))
        .collect();
    if allowed.is_empty() {
        text.push_str("allow_egress = []\n");
    } else {
        text.push_str(&format!("allow_egress = [\n{}]\n", allowed.concat()));
    }
    text
}

/// `lazaret config init --agent AGENT [--name NAME] [--image REF]`.
pub(super) fn init(
    host: &HostEnvironment,
    path: &Path,
    agent: Agent,
    name: Option<&str>,
    image: Option<&str>,
) -> Result<(), Failure> {
    let name = name.unwrap_or(agent.name());
    ProfileName::parse(name).map_err(|e| Failure {
        message: format!("--name: {e}"),
        status: EXIT_INVALID,
    })?;
    let layout = default_layout(host)?;
    let image = match image {
        Some(image) => image.to_owned(),
        None => format!("oci:{}:{}", layout.display(), agent.name()),
    };
    let profile = profile_text(agent, name, &image);
    let wrote = if std::fs::symlink_metadata(path).is_ok() {
        append(host, path, name, &image, &profile)?
    } else {
        // The template's header and storage table; its example network
        // prefixes and profile are not for an agent.
        let body = CONFIG_TEMPLATE
            .split_once("\n[network]")
            .map_or(CONFIG_TEMPLATE, |(head, _)| head);
        let text = format!("{}\n{profile}", body.trim_end());
        checked(&text, name, &image)?;
        super::create_config(path, text.as_bytes())?;
        "wrote"
    };
    let key = agent.profile().key;
    let built = if image.starts_with(&format!("oci:{}:", layout.display())) {
        format!(
            "  {} {} {}\n",
            image_script(),
            agent.name(),
            layout.display()
        )
    } else {
        String::new()
    };
    super::print(&format!(
        "{wrote} profile `{name}` in {}\nnext:\n{built}  export {key}=...\n  \
         lazaret config check {name}\n  lazaret up {name}\n  lazaret attach {name}\n",
        path.display()
    ))
}

/// Decodes `text` as the whole new configuration and requires it to hold
/// profile `name` on `image` exactly; nothing is written when this fails.
fn checked(text: &str, name: &str, image: &str) -> Result<(), Failure> {
    let document = config::decode_document(text.as_bytes()).map_err(|e| Failure {
        message: format!("the new profile would not load: {}", chain(&e)),
        status: EXIT_INVALID,
    })?;
    let loaded = document
        .profiles
        .iter()
        .find(|(p, _)| p.as_str() == name)
        .map(|(_, profile)| profile.image.as_str() == image);
    if loaded != Some(true) {
        return Err(failure(format!(
            "the new profile `{name}` did not load as written"
        )));
    }
    Ok(())
}

/// Appends `profile` to the configuration at `path`, read as `up` reads it;
/// refused when it does not load, already has profile `name`, or changes
/// while it is rewritten.
fn append(
    host: &HostEnvironment,
    path: &Path,
    name: &str,
    image: &str,
    profile: &str,
) -> Result<&'static str, Failure> {
    let source = config::read_source(path, host.uid)?;
    let target = source.plan.canonical_label().to_owned();
    let existing = std::str::from_utf8(&source.bytes).map_err(|_| Failure {
        message: format!("{} is not UTF-8; fix it first", target.display()),
        status: EXIT_INVALID,
    })?;
    let document = config::decode_document(source.bytes.as_slice()).map_err(|e| Failure {
        message: format!(
            "{} does not load ({}); fix it before adding a profile",
            target.display(),
            chain(&e)
        ),
        status: EXIT_INVALID,
    })?;
    if document.profiles.keys().any(|p| p.as_str() == name) {
        return Err(Failure {
            message: format!(
                "{} already has profile `{name}`; choose another with --name",
                target.display()
            ),
            status: 1,
        });
    }
    let mut text = existing.to_owned();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(profile);
    checked(&text, name, image)?;

    let before = rustix::fs::fstat(&source.fd)
        .map_err(|e| failure(format!("cannot stat {}: {e}", target.display())))?;
    let staging = target.with_file_name(format!(
        ".{}.lazaret-new",
        target
            .file_name()
            .map_or("config.toml".into(), |n| n.to_string_lossy())
    ));
    // The file keeps its mode (the secure read allowed no group or other
    // write), and is replaced only if it is still the one read.
    let still_current = || {
        let now = std::fs::symlink_metadata(&target)?;
        let same = now.ino() == before.st_ino
            && now.dev() == before.st_dev
            && i64::try_from(now.len()).ok() == Some(before.st_size)
            && now.ctime() == before.st_ctime
            && u64::try_from(now.ctime_nsec()).ok() == Some(before.st_ctime_nsec);
        if same {
            Ok(())
        } else {
            Err(std::io::Error::other(
                "it changed while the profile was added; run the command again",
            ))
        }
    };
    let replaced = super::replace_by_rename(
        &target,
        &staging,
        text.as_bytes(),
        before.st_mode & 0o777,
        still_current,
    );
    replaced.map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            failure(format!(
                "cannot create {}: {e}; an earlier `lazaret config init` left it: remove it",
                staging.display()
            ))
        } else {
            failure(format!("cannot update {}: {e}", target.display()))
        }
    })?;
    Ok("added")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_agent_profile_loads() {
        for agent in [Agent::Claude, Agent::Codex, Agent::Gemini, Agent::Opencode] {
            let text = format!(
                "schema = \"lazaret-trusted-host-config-v1\"\n{}",
                profile_text(agent, agent.name(), "oci:/images/agents:x")
            );
            let document = config::decode_document(text.as_bytes())
                .unwrap_or_else(|e| panic!("{agent:?}: {}\n{text}", chain(&e)));
            let profile = &document.profiles[document
                .profiles
                .keys()
                .find(|p| p.as_str() == agent.name())
                .unwrap()];
            assert_eq!(
                profile.image,
                lazaret_proto::config::ImageReference::parse("oci:/images/agents:x").unwrap()
            );
            let key = agent.profile().key;
            assert!(text.contains(&format!("env = {{ {key} = \"env:{key}\" }}")));
        }
    }

    #[test]
    fn names_and_images_cannot_add_keys() {
        let image = "oci:/a\"b\\c\n[profiles.x]\nimage = \"y\":t";
        let text = format!(
            "schema = \"lazaret-trusted-host-config-v1\"\n{}",
            profile_text(Agent::Claude, "my.work", image)
        );
        assert!(checked(&text, "my.work", image).is_ok(), "{text}");
        let document = config::decode_document(text.as_bytes()).unwrap();
        assert_eq!(document.profiles.len(), 1, "{text}");
    }

    #[test]
    fn claude_allows_anthropics_range_only() {
        let text = profile_text(Agent::Claude, "claude", "oci:/i:claude");
        assert!(text.contains("\"160.79.104.0/23\""), "{text}");
        let codex = profile_text(Agent::Codex, "codex", "oci:/i:codex");
        assert!(codex.contains("allow_egress = []"), "{codex}");
        assert!(codex.contains("getent ahostsv4 api.openai.com"), "{codex}");
    }
}
