//! Attacks on the configuration source, the Lazaret roots and the volume
//! sources: each must be refused with an error that names what and why, and
//! nothing may hang or be followed.

mod support;

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::fs::{FileType, Mode};
use support::{Fixture, message, minimal, write_file};

/// Whether this test runs as root. CI runs the suite as root, so a test that
/// needs root fails there rather than passing without running.
fn is_root() -> bool {
    let root = rustix::process::getuid().is_root();
    assert!(
        root || std::env::var_os("CI").is_none(),
        "CI must run this test as root"
    );
    root
}

fn mkfifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        FileType::Fifo,
        Mode::RUSR | Mode::WUSR,
        0,
    )
    .unwrap();
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn data_root_config(root: &Path) -> String {
    format!(
        "schema = \"lazaret-trusted-host-config-v1\"\n[storage]\ndata_root = \"{}\"\n\
         [profiles.p]\nimage = \"oci:/images/base:1\"\n",
        root.display()
    )
}

#[test]
fn a_fifo_as_configuration_is_refused_without_blocking() {
    let f = Fixture::new();
    let fifo = f.base().join("config.fifo");
    mkfifo(&fifo);
    let started = Instant::now();
    let error = message(f.load_from("p", &fifo));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the read blocked"
    );
    assert!(error.contains("is a FIFO"), "{error}");
    assert!(error.contains("regular file"), "{error}");
}

#[test]
fn a_device_directory_or_socket_as_configuration_is_refused() {
    let f = Fixture::new();
    let error = message(f.load_from("p", Path::new("/dev/null")));
    assert!(error.contains("/dev/null is a character device"), "{error}");
    let error = message(f.load_from("p", &f.workspace));
    assert!(error.contains("is a directory"), "{error}");
    let socket_path = f.base().join("config.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    let error = message(f.load_from("p", &socket_path));
    assert!(error.contains("is a socket"), "{error}");
}

#[test]
fn a_hard_linked_configuration_is_refused() {
    let f = Fixture::new();
    f.write_config(&minimal(""));
    assert!(f.load("p").is_ok());
    std::fs::hard_link(&f.config, f.base().join("second-name.toml")).unwrap();
    let error = message(f.load("p"));
    assert!(error.contains("has 2 hard links"), "{error}");
}

#[test]
fn a_group_or_other_writable_configuration_is_refused() {
    let f = Fixture::new();
    f.write_config(&minimal(""));
    for mode in [0o620, 0o602, 0o666] {
        chmod(&f.config, mode);
        let error = message(f.load("p"));
        assert!(
            error.contains("writable by its group or others"),
            "{mode:o}: {error}"
        );
        assert!(error.contains("chmod go-w"), "{error}");
    }
    for mode in [0o600, 0o644, 0o400] {
        chmod(&f.config, mode);
        assert!(f.load("p").is_ok(), "mode {mode:o} should be accepted");
    }
}

#[test]
fn a_configuration_over_the_size_limit_is_refused() {
    let f = Fixture::new();
    let base = minimal("");
    let limit = 1_048_576;
    let fill = |total: usize| {
        let pad = total - base.len() - 2;
        format!("{base}#{}\n", "x".repeat(pad))
    };
    let at_limit = fill(limit);
    assert_eq!(at_limit.len(), limit);
    f.write_config(&at_limit);
    assert!(f.load("p").is_ok(), "exactly the limit is accepted");
    f.write_config(&fill(limit + 1));
    let error = message(f.load("p"));
    assert!(error.contains("1048577 bytes"), "{error}");
    assert!(error.contains("at most 1048576"), "{error}");
}

#[test]
fn a_configuration_owned_by_another_user_is_refused() {
    if !is_root() {
        // Only root can give a file away; CI runs this as root.
        eprintln!("needs root to chown; CI runs it as root");
        return;
    }
    let f = Fixture::new();
    f.write_config(&minimal(""));
    std::os::unix::fs::chown(&f.config, Some(65534), None).unwrap();
    let error = message(f.load("p"));
    assert!(error.contains("owned by uid 65534"), "{error}");
}

#[test]
fn a_symlinked_configuration_is_resolved_once_to_its_target() {
    let f = Fixture::new();
    let real = f.base().join("real-config.toml");
    write_file(&real, &minimal(""), 0o600);
    let link = f.base().join("link.toml");
    symlink(&real, &link).unwrap();
    let resolved = f.load_from("p", &link).unwrap();
    assert_eq!(resolved.authorities().config_file.canonical_label(), real);
}

#[test]
fn a_relative_or_missing_configuration_path_is_refused() {
    let f = Fixture::new();
    let error = message(f.load_from("p", Path::new("config.toml")));
    assert!(error.starts_with("--config: "), "{error}");
    let error = message(f.load("p"));
    assert!(error.contains("does not exist"), "{error}");
    assert!(error.contains("lazaret config init"), "{error}");
}

#[test]
fn a_symlinked_storage_root_is_refused() {
    let f = Fixture::new();
    let target = f.base().join("elsewhere");
    std::fs::create_dir(&target).unwrap();
    chmod(&target, 0o700);
    let root = f.base().join("data");
    symlink(&target, &root).unwrap();
    let error = message(f.load_text("p", &data_root_config(&root)));
    assert!(error.starts_with("storage.data_root: "), "{error}");
    assert!(error.contains("symbolic link"), "{error}");
}

#[test]
fn symlinked_components_beneath_a_root_are_refused() {
    let f = Fixture::new();
    let root = f.base().join("data");
    let text = data_root_config(&root);
    let first = f.load_text("p", &text).unwrap();
    let domain = first.domain_id().to_hex();
    drop(first);

    let target = f.base().join("attacker");
    std::fs::create_dir(&target).unwrap();
    chmod(&target, 0o700);
    for component in ["profiles", "domains", &format!("domains/{domain}")] {
        let path = root.join(component);
        let moved = f.base().join("moved");
        std::fs::rename(&path, &moved).unwrap();
        symlink(&target, &path).unwrap();
        let error = message(f.load("p"));
        assert!(error.contains("symbolic link"), "{component}: {error}");
        std::fs::remove_file(&path).unwrap();
        std::fs::rename(&moved, &path).unwrap();
        assert!(f.load("p").is_ok(), "restored {component}");
    }

    let runtime_root = f.runtime.join("lazaret");
    std::fs::remove_dir_all(&runtime_root).unwrap();
    symlink(&target, &runtime_root).unwrap();
    let error = message(f.load("p"));
    assert!(error.starts_with("XDG_RUNTIME_DIR: "), "{error}");
    assert!(error.contains("symbolic link"), "{error}");
}

#[test]
fn roots_are_created_component_wise_at_0700_and_checked_when_they_exist() {
    let f = Fixture::new();
    let root = f.base().join("a/b/data");
    let resolved = f.load_text("p", &data_root_config(&root)).unwrap();
    for dir in [
        f.base().join("a"),
        f.base().join("a/b"),
        root.clone(),
        root.join("profiles/p"),
        root.join("domains").join(resolved.domain_id().to_hex()),
        f.runtime.join("lazaret"),
    ] {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700, "{}", dir.display());
    }
    drop(resolved);
    chmod(&root, 0o755);
    let error = message(f.load("p"));
    assert!(error.contains("mode 0755"), "{error}");
    assert!(error.contains("chmod 700"), "{error}");
    chmod(&root, 0o700);
    chmod(&root.join("profiles"), 0o750);
    let error = message(f.load("p"));
    assert!(error.contains("profiles has mode 0750"), "{error}");
    chmod(&root.join("profiles"), 0o700);

    if is_root() {
        std::os::unix::fs::chown(&root, Some(65534), None).unwrap();
        let error = message(f.load("p"));
        assert!(error.contains("owned by uid 65534"), "{error}");
    }
}

#[test]
fn a_root_that_is_a_file_is_refused() {
    let f = Fixture::new();
    let root = f.base().join("data");
    write_file(&root, "", 0o600);
    let error = message(f.load_text("p", &data_root_config(&root)));
    assert!(
        error.contains("is a regular file, not a directory"),
        "{error}"
    );
}

#[test]
fn a_volume_source_that_is_a_symlink_is_refused() {
    let f = Fixture::new();
    let real = f.base().join("real-dir");
    std::fs::create_dir(&real).unwrap();
    let link = f.base().join("link-dir");
    symlink(&real, &link).unwrap();
    let volume = |host: &Path| {
        minimal(&format!(
            "persistent_dirs = [\"/root\"]\nvolumes = [{{ host = \"{}\", container = \"/root/v\", kind = \"directory\" }}]",
            host.display()
        ))
    };
    assert!(f.load_text("p", &volume(&real)).is_ok());
    let error = message(f.load_text("p", &volume(&link)));
    assert!(error.starts_with("profiles.p.volumes[0].host: "), "{error}");
    assert!(error.contains("symbolic link"), "{error}");

    // Beneath {profile_dir}/ no component may be a symbolic link either.
    let profile_dir = f.home.join(".local/share/lazaret/profiles/p");
    symlink(&real, profile_dir.join("state")).unwrap();
    let text = minimal(
        "persistent_dirs = [\"/root\"]\nvolumes = [{ host = \"{profile_dir}/state/x\", container = \"/root/v\", kind = \"directory\" }]",
    );
    let error = message(f.load_text("p", &text));
    assert!(error.contains("symbolic link"), "{error}");
}

#[test]
fn special_files_cannot_be_volume_sources() {
    let f = Fixture::new();
    let fifo = f.base().join("pipe");
    mkfifo(&fifo);
    for (host, found) in [
        (fifo.as_path(), "FIFO"),
        (Path::new("/dev/null"), "character device"),
    ] {
        let text = minimal(&format!(
            "persistent_dirs = [\"/root\"]\nvolumes = [{{ host = \"{}\", container = \"/root/v\", kind = \"file\" }}]",
            host.display()
        ));
        let error = message(f.load_text("p", &text));
        assert!(
            error.contains(&format!("is a {found}, not a regular file")),
            "{error}"
        );
    }
}

#[test]
fn the_configuration_may_not_overlap_the_workspace_or_roots() {
    let f = Fixture::new();
    let inside = f.workspace.join("lazaret.toml");
    write_file(&inside, &minimal(""), 0o600);
    let error = message(f.load_from("p", &inside));
    assert!(error.starts_with("--config: "), "{error}");
    assert!(error.contains("lies inside the workspace"), "{error}");

    let root = f.base().join("data");
    let in_root = root.join("config.toml");
    std::fs::create_dir(&root).unwrap();
    chmod(&root, 0o700);
    write_file(&in_root, &data_root_config(&root), 0o600);
    let error = message(f.load_from("p", &in_root));
    assert!(error.contains("lies inside the Storage Root"), "{error}");
}

#[test]
fn roots_and_workspace_may_not_overlap() {
    let f = Fixture::new();
    // The Storage Root inside the workspace: refused before anything is made there.
    let root = f.workspace.join(".lazaret");
    let error = message(f.load_text("p", &data_root_config(&root)));
    assert!(error.starts_with("storage.data_root: "), "{error}");
    assert!(error.contains("lies inside the workspace"), "{error}");
    assert!(!root.exists(), "nothing is created inside the workspace");

    // The Storage Root is the workspace, or contains it.
    let error = message(f.load_text("p", &data_root_config(&f.workspace)));
    assert!(error.contains("is the same as the workspace"), "{error}");
    let mut g = Fixture::new();
    let data = g.base().join("data");
    g.workspace = data.join("project");
    std::fs::create_dir_all(&g.workspace).unwrap();
    let error = message(g.load_text("p", &data_root_config(&data)));
    assert!(error.contains("contains the workspace"), "{error}");

    // The Runtime Root inside the Storage Root.
    let root = f.runtime.clone();
    let error = message(f.load_text("p", &data_root_config(&root)));
    assert!(error.contains("Runtime Root"), "{error}");
}

#[test]
fn volume_sources_may_not_overlap_lazaret_trees_or_each_other() {
    let f = Fixture::new();
    f.write_config(&minimal(""));
    let resolved = f.load("p").unwrap();
    let domain = resolved.domain_id().to_hex();
    drop(resolved);
    let storage = f.home.join(".local/share/lazaret");
    let cases = [
        (storage.join("domains").join(&domain), "Storage Root"),
        (f.runtime.join("lazaret"), "Runtime Root"),
        (f.workspace.clone(), "workspace"),
        (f.home.join(".config/lazaret"), "configuration file"),
    ];
    for (host, named) in cases {
        let text = minimal(&format!(
            "persistent_dirs = [\"/root\"]\nvolumes = [{{ host = \"{}\", container = \"/root/v\", kind = \"directory\" }}]",
            host.display()
        ));
        let error = message(f.load_text("p", &text));
        assert!(error.starts_with("profiles.p.volumes[0].host: "), "{error}");
        assert!(error.contains(named), "{named}: {error}");
    }

    let outer = f.base().join("shared");
    std::fs::create_dir_all(outer.join("inner")).unwrap();
    let text = minimal(&format!(
        "persistent_dirs = [\"/root\", \"/opt\"]\nvolumes = [\n\
         {{ host = \"{0}\", container = \"/root/a\", kind = \"directory\" }},\n\
         {{ host = \"{0}/inner\", container = \"/opt/b\", kind = \"directory\" }},\n]",
        outer.display()
    ));
    let error = message(f.load_text("p", &text));
    assert!(error.starts_with("profiles.p.volumes[1].host: "), "{error}");
    assert!(error.contains("lies inside the volume source"), "{error}");

    // A bind mount would alias one directory under two names; the same
    // inode twice is refused just as nesting is (shown here with `{profile_dir}`
    // sources, which may live inside the Storage Root).
    let text = minimal(
        "persistent_dirs = [\"/root\"]\nvolumes = [\n\
         { host = \"{profile_dir}/a\", container = \"/root/a\", kind = \"directory\", create = true },\n\
         { host = \"{profile_dir}/a/b\", container = \"/root/b\", kind = \"directory\", create = true },\n]",
    );
    let error = message(f.load_text("p", &text));
    assert!(error.starts_with("profiles.p.volumes[1].host: "), "{error}");
}

#[test]
fn a_replaced_workspace_is_noticed_by_its_identity() {
    // The loader reopens every plan after the comparisons; a workspace whose
    // canonical path names another directory than the one retained is refused.
    let f = Fixture::new();
    f.write_config(&minimal(""));
    let resolved = f.load("p").unwrap();
    let moved = f.base().join("work-moved");
    std::fs::rename(&f.workspace, &moved).unwrap();
    std::fs::create_dir(&f.workspace).unwrap();
    let error = resolved.authorities().workspace.revalidate().unwrap_err();
    assert!(error.to_string().contains("was replaced"), "{error}");
}
