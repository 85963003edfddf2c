//! `lazaret config init --agent AGENT`: a ready profile for one of the
//! coding agents Lazaret ships images for, written as a new configuration
//! or appended to the user's existing one.
//!
//! Owns what each agent needs: its image tag (built by
//! `packaging/images/build-agent-image.sh`), its API key variable, the
//! directory it keeps its own state in, and the hosts it talks to, by name
//! (a v2 profile's `allow_hosts`): its API, the package registries and the
//! git host its work uses. An existing file is read as `up` reads it, the
//! new profile is written in that file's schema (a v1 file gets addresses
//! where it can, and the names to resolve), the result is decoded before
//! anything is written, and it is replaced by rename: the file is the old
//! one or the whole new one, never a mix.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{CONFIG_TEMPLATE, EXIT_INVALID, Failure, failure};
use crate::config::{self, ConfigSchema, HostEnvironment};
use crate::lifecycle::chain;
use lazaret_proto::config::{ProfileName, SCHEMA_ID_V2};

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
    /// The host its API key is for: the Credential Proxy puts the real
    /// key in requests to it (one of `api_hosts`).
    key_host: &'static str,
    /// The hosts of its API, and what each is for.
    api_hosts: &'static [(&'static str, &'static str)],
    /// For a v1 file, which cannot name hosts: the published IPv4 ranges
    /// of its API, and what each is.
    v1_prefixes: &'static [(&'static str, &'static str)],
}

/// The hosts every agent's work needs beside its API: the package
/// registries of the image's toolchains (the agents themselves are npm
/// packages) and the git host, each with what it is for.
const WORK_HOSTS: &[(&str, &str)] = &[
    ("registry.npmjs.org", "npm packages"),
    ("pypi.org", "Python packages: the index"),
    ("files.pythonhosted.org", "Python packages: the files"),
    ("github.com", "git over HTTPS"),
    ("codeload.github.com", "GitHub archives"),
    (
        "objects.githubusercontent.com",
        "GitHub release assets and LFS objects",
    ),
];

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
                key_host: "api.anthropic.com",
                state_dir: "/root/.claude",
                api_hosts: &[("api.anthropic.com", "Claude Code's API")],
                v1_prefixes: &[(
                    "160.79.104.0/23",
                    "api.anthropic.com: Anthropic's published API range",
                )],
            },
            Self::Codex => AgentProfile {
                title: "Codex CLI",
                package: "@openai/codex",
                key: "OPENAI_API_KEY",
                key_host: "api.openai.com",
                state_dir: "/root/.codex",
                api_hosts: &[("api.openai.com", "the Codex CLI's API")],
                v1_prefixes: &[],
            },
            Self::Gemini => AgentProfile {
                title: "Gemini CLI",
                package: "@google/gemini-cli",
                key: "GEMINI_API_KEY",
                key_host: "generativelanguage.googleapis.com",
                state_dir: "/root/.gemini",
                api_hosts: &[("generativelanguage.googleapis.com", "the Gemini API")],
                v1_prefixes: &[],
            },
            Self::Opencode => AgentProfile {
                title: "opencode",
                package: "opencode-ai",
                key: "ANTHROPIC_API_KEY",
                key_host: "api.anthropic.com",
                state_dir: "/root/.local/share/opencode",
                api_hosts: &[
                    (
                        "api.anthropic.com",
                        "Anthropic's API, opencode's default provider",
                    ),
                    ("models.dev", "opencode's list of models"),
                ],
                v1_prefixes: &[(
                    "160.79.104.0/23",
                    "api.anthropic.com: Anthropic's published API range",
                )],
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

/// The TOML of profile `name` for `agent` on `image`, in a file of
/// `schema`, with the comments that say how to finish it. The name is a
/// valid profile name; it and the image are written as quoted strings.
pub fn profile_text(agent: Agent, name: &str, image: &str, schema: ConfigSchema) -> String {
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
         ]\n",
        title = p.title,
        package = p.package,
        table = toml_string(name),
        script = image_script(),
        image = toml_string(image),
        agent = agent.name(),
        state = p.state_dir,
    );
    let hosts = p.api_hosts.iter().chain(WORK_HOSTS);
    match schema {
        ConfigSchema::V2 => {
            text.push_str(
                "# The hosts the sandbox may reach, by name: its API, the package\n\
                 # registries and the git host. Only these names resolve inside the\n\
                 # sandbox; add what your work needs (`*.example.org` allows every\n\
                 # name beneath example.org).\n\
                 allow_hosts = [\n",
            );
            for (host, why) in hosts {
                text.push_str(&format!("  \"{host}\", # {why}\n"));
            }
            text.push_str(
                "]\n\
                 # IPv4 prefixes the sandbox may reach beside the names (RFC 1918 never).\n\
                 allow_egress = []\n",
            );
            // Array tables come last: every key after one is its own.
            text.push_str(&format!(
                "# The API key, by reference: `export {key}=...` before `lazaret up {name}`.\n\
                 # The sandbox holds a placeholder in {key}; Lazaret's Credential Proxy\n\
                 # puts the real key in the requests to {host}, and nowhere else.\n\
                 # The value is never written to disk or logged.\n\
                 [[profiles.{table}.credentials]]\n\
                 env = \"{key}\"\n\
                 value = \"env:{key}\"\n\
                 hosts = [\"{host}\"]\n",
                key = p.key,
                host = p.key_host,
                table = toml_string(name),
            ));
        }
        ConfigSchema::V1 => {
            text.push_str(&format!(
                "# The API key by reference: `export {key}=...` before `lazaret up {name}`.\n\
                 # Its value is never written to disk or logged, but the sandbox sees it\n\
                 # (a v2 file can keep it out, as a credential).\n\
                 env = {{ {key} = \"env:{key}\" }}\n",
                key = p.key,
            ));
            text.push_str(&format!(
                "# Where the sandbox may connect: IPv4 prefixes, everything else is\n\
                 # unreachable (RFC 1918 always is). This file is v1, which allows\n\
                 # addresses only: for each host below that has no prefix here, add\n\
                 # each address of `getent ahostsv4 HOST` as \"A.B.C.D/32\" (CDN\n\
                 # addresses change; check again when it fails). v2 names them:\n\
                 # set schema = \"{SCHEMA_ID_V2}\" and list them in\n\
                 # allow_hosts (docs/config.md, \"Migrating from v1\").\n"
            ));
            for (host, why) in hosts {
                text.push_str(&format!("# {host}: {why}\n"));
            }
            let allowed: Vec<String> = p
                .v1_prefixes
                .iter()
                .map(|(prefix, why)| format!("  \"{prefix}\", # {why}\n"))
                .collect();
            if allowed.is_empty() {
                text.push_str("allow_egress = []\n");
            } else {
                text.push_str(&format!("allow_egress = [\n{}]\n", allowed.concat()));
            }
        }
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
    let (wrote, schema) = if std::fs::symlink_metadata(path).is_ok() {
        append(host, path, agent, name, &image)?
    } else {
        // The template's header and storage table; its example network
        // prefixes and profile are not for an agent.
        let body = CONFIG_TEMPLATE
            .split_once("\n[network]")
            .map_or(CONFIG_TEMPLATE, |(head, _)| head);
        let profile = profile_text(agent, name, &image, ConfigSchema::V2);
        let text = format!("{}\n{profile}", body.trim_end());
        checked(&text, agent, name, &image)?;
        super::create_config(path, text.as_bytes())?;
        ("wrote", ConfigSchema::V2)
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
    let v1 = if schema == ConfigSchema::V1 {
        "the file is v1, which allows addresses only: the profile lists the hosts to \
         resolve and allow, or migrate the file to v2 to name them (docs/config.md, \
         \"Migrating from v1\")\n"
    } else {
        ""
    };
    super::print(&format!(
        "{wrote} profile `{name}` in {}\n{v1}next:\n{built}  export {key}=...\n  \
         lazaret config check {name}\n  lazaret up {name}\n  lazaret attach {name}\n",
        path.display()
    ))
}

/// Decodes `text` as the whole new configuration and requires it to hold
/// profile `name` on `image` exactly, with `agent`'s host names when the
/// file is v2; nothing is written when this fails.
fn checked(text: &str, agent: Agent, name: &str, image: &str) -> Result<(), Failure> {
    let decoded = config::decode_configuration(text.as_bytes()).map_err(|e| Failure {
        message: format!("the new profile would not load: {}", chain(&e)),
        status: EXIT_INVALID,
    })?;
    let p = agent.profile();
    let expected: Vec<&str> = match decoded.schema {
        ConfigSchema::V1 => Vec::new(),
        ConfigSchema::V2 => p.api_hosts.iter().chain(WORK_HOSTS).map(|h| h.0).collect(),
    };
    let loaded = decoded
        .document
        .profiles
        .iter()
        .find(|(p, _)| p.as_str() == name)
        .map(|(profile_name, profile)| {
            let hosts = decoded.name_policy(profile_name).allow_hosts;
            profile.image.as_str() == image
                && hosts
                    .iter()
                    .map(|h| h.as_str())
                    .eq(expected.iter().copied())
        });
    if loaded != Some(true) {
        return Err(failure(format!(
            "the new profile `{name}` did not load as written"
        )));
    }
    Ok(())
}

/// Appends profile `name` for `agent` to the configuration at `path`, read
/// as `up` reads it, in that file's schema; refused when it does not load,
/// already has profile `name`, or changes while it is rewritten.
fn append(
    host: &HostEnvironment,
    path: &Path,
    agent: Agent,
    name: &str,
    image: &str,
) -> Result<(&'static str, ConfigSchema), Failure> {
    let source = config::read_source(path, host.uid)?;
    let target = source.plan.canonical_label().to_owned();
    let existing = std::str::from_utf8(&source.bytes).map_err(|_| Failure {
        message: format!("{} is not UTF-8; fix it first", target.display()),
        status: EXIT_INVALID,
    })?;
    let decoded = config::decode_configuration(source.bytes.as_slice()).map_err(|e| Failure {
        message: format!(
            "{} does not load ({}); fix it before adding a profile",
            target.display(),
            chain(&e)
        ),
        status: EXIT_INVALID,
    })?;
    if decoded.document.profiles.keys().any(|p| p.as_str() == name) {
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
    text.push_str(&profile_text(agent, name, image, decoded.schema));
    checked(&text, agent, name, image)?;

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
    Ok(("added", decoded.schema))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lazaret_proto::config::SCHEMA_ID;

    fn document(schema: ConfigSchema, profile: &str) -> String {
        format!("schema = \"{}\"\n{profile}", schema.id())
    }

    #[test]
    fn every_agent_profile_loads() {
        for schema in ConfigSchema::ALL {
            for agent in [Agent::Claude, Agent::Codex, Agent::Gemini, Agent::Opencode] {
                let text = document(
                    schema,
                    &profile_text(agent, agent.name(), "oci:/images/agents:x", schema),
                );
                let decoded = config::decode_configuration(text.as_bytes())
                    .unwrap_or_else(|e| panic!("{agent:?}: {}\n{text}", chain(&e)));
                assert_eq!(decoded.schema, schema);
                let (name, profile) = decoded
                    .document
                    .profiles
                    .iter()
                    .find(|(p, _)| p.as_str() == agent.name())
                    .unwrap();
                assert_eq!(
                    profile.image,
                    lazaret_proto::config::ImageReference::parse("oci:/images/agents:x").unwrap()
                );
                let key = agent.profile().key;
                let hosts = decoded.name_policy(name).allow_hosts;
                let credentials = decoded.name_policy(name).credentials;
                match schema {
                    ConfigSchema::V1 => {
                        assert!(hosts.is_empty());
                        assert!(text.contains(&format!("env = {{ {key} = \"env:{key}\" }}")));
                    }
                    ConfigSchema::V2 => {
                        assert!(!hosts.is_empty(), "{text}");
                        // The key is a credential, never in the sandbox.
                        assert!(!text.contains("env = {"), "{text}");
                        assert_eq!(credentials.len(), 1, "{text}");
                        assert_eq!(credentials[0].env.as_str(), key);
                        assert_eq!(credentials[0].hosts[0].as_str(), agent.profile().key_host);
                    }
                }
                assert!(checked(&text, agent, agent.name(), "oci:/images/agents:x").is_ok());
            }
        }
    }

    #[test]
    fn names_and_images_cannot_add_keys() {
        let image = "oci:/a\"b\\c\n[profiles.x]\nimage = \"y\":t";
        for schema in ConfigSchema::ALL {
            let text = document(
                schema,
                &profile_text(Agent::Claude, "my.work", image, schema),
            );
            assert!(
                checked(&text, Agent::Claude, "my.work", image).is_ok(),
                "{text}"
            );
            let document = config::decode_document(text.as_bytes()).unwrap();
            assert_eq!(document.profiles.len(), 1, "{text}");
        }
    }

    /// The names of profile `name` of `text`, a v2 document.
    fn hosts_of(text: &str, name: &str) -> Vec<String> {
        let decoded = config::decode_configuration(text.as_bytes()).unwrap();
        let name = ProfileName::parse(name).unwrap();
        decoded
            .name_policy(&name)
            .allow_hosts
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn each_agent_names_its_api_registries_and_git_host() {
        let work = [
            "registry.npmjs.org",
            "pypi.org",
            "files.pythonhosted.org",
            "github.com",
            "codeload.github.com",
            "objects.githubusercontent.com",
        ];
        for (agent, api) in [
            (Agent::Claude, &["api.anthropic.com"][..]),
            (Agent::Codex, &["api.openai.com"]),
            (Agent::Gemini, &["generativelanguage.googleapis.com"]),
            (Agent::Opencode, &["api.anthropic.com", "models.dev"]),
        ] {
            let text = document(
                ConfigSchema::V2,
                &profile_text(agent, agent.name(), "oci:/i:x", ConfigSchema::V2),
            );
            let expected: Vec<&str> = api.iter().copied().chain(work).collect();
            assert_eq!(hosts_of(&text, agent.name()), expected, "{text}");
            // Names, not addresses: no prefix, no `getent` to run.
            assert!(text.contains("allow_egress = []\n"), "{text}");
            assert!(!text.contains("/23") && !text.contains("/32\""), "{text}");
            assert!(!text.contains("getent"), "{text}");
        }
    }

    #[test]
    fn a_v1_file_gets_the_published_range_and_the_names_to_resolve() {
        let claude = profile_text(Agent::Claude, "claude", "oci:/i:claude", ConfigSchema::V1);
        assert!(claude.contains("\"160.79.104.0/23\""), "{claude}");
        assert!(!claude.contains("allow_hosts ="), "{claude}");
        assert!(
            claude.contains("# registry.npmjs.org: npm packages"),
            "{claude}"
        );
        assert!(claude.contains(SCHEMA_ID_V2), "{claude}");
        let codex = profile_text(Agent::Codex, "codex", "oci:/i:codex", ConfigSchema::V1);
        assert!(codex.contains("allow_egress = []"), "{codex}");
        assert!(codex.contains("# api.openai.com:"), "{codex}");
        assert!(codex.contains("getent ahostsv4 HOST"), "{codex}");
        // It loads as v1.
        let text = format!("schema = \"{SCHEMA_ID}\"\n{claude}");
        assert!(checked(&text, Agent::Claude, "claude", "oci:/i:claude").is_ok());
    }

    #[test]
    fn a_profile_without_the_agents_names_is_not_taken_as_written() {
        let text = document(
            ConfigSchema::V2,
            &profile_text(Agent::Codex, "codex", "oci:/i:x", ConfigSchema::V2),
        );
        assert!(checked(&text, Agent::Codex, "codex", "oci:/i:x").is_ok());
        let fewer = text.replace("  \"pypi.org\", # Python packages: the index\n", "");
        assert_ne!(fewer, text);
        assert!(checked(&fewer, Agent::Codex, "codex", "oci:/i:x").is_err());
        assert!(checked(&text, Agent::Claude, "codex", "oci:/i:x").is_err());
    }
}
