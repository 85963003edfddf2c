//! Parsing the `image` field of a profile into an [`ImageSource`].
//!
//! Three forms are understood: `oci:PATH[:TAG]` (a local OCI image layout
//! directory), `oci-archive:PATH[:TAG]` (a tar of one) and a registry
//! reference such as `docker.io/library/debian:trixie`, optionally written
//! `docker://...` and optionally pinned with `@sha256:<hex>`. Parsing looks
//! at the text only; it opens nothing and trusts nothing but the grammar.

use std::fmt;
use std::path::{Path, PathBuf};

use lazaret_proto::ids::ManifestDigest;

use super::ImageError;

/// Where an image comes from, as parsed from a profile's `image` field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageSource {
    /// A local OCI image layout directory (`oci:PATH[:TAG]`).
    OciLayout {
        /// The layout directory, absolute.
        path: PathBuf,
        /// The tag to select (the index's `org.opencontainers.image.ref.name`
        /// annotation); `None` selects the only image, else `latest`.
        tag: Option<String>,
    },
    /// A tar archive of an OCI image layout (`oci-archive:PATH[:TAG]`).
    OciArchive {
        /// The archive file, absolute.
        path: PathBuf,
        /// The tag to select, as for [`ImageSource::OciLayout`].
        tag: Option<String>,
    },
    /// An image in a registry, fetched with `skopeo`.
    Registry {
        /// The reference, fully qualified.
        reference: RegistryReference,
    },
}

impl fmt::Display for ImageSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let with_tag =
            |f: &mut fmt::Formatter<'_>, scheme: &str, path: &Path, tag: &Option<String>| {
                write!(f, "{scheme}:{}", path.display())?;
                match tag {
                    Some(tag) => write!(f, ":{tag}"),
                    None => Ok(()),
                }
            };
        match self {
            Self::OciLayout { path, tag } => with_tag(f, "oci", path, tag),
            Self::OciArchive { path, tag } => with_tag(f, "oci-archive", path, tag),
            Self::Registry { reference } => reference.fmt(f),
        }
    }
}

/// A registry reference in its fully qualified form: domain, repository,
/// and a tag, a digest, or both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryReference {
    /// The registry host, with an optional port (`docker.io`,
    /// `localhost:5000`).
    pub domain: String,
    /// The repository path (`library/debian`).
    pub repository: String,
    /// The tag; `latest` when neither a tag nor a digest was given.
    pub tag: Option<String>,
    /// The manifest digest the reference is pinned to, if any.
    pub digest: Option<ManifestDigest>,
}

impl RegistryReference {
    /// `domain/repository`, without tag or digest.
    pub fn name(&self) -> String {
        format!("{}/{}", self.domain, self.repository)
    }

    /// The reference pinned to `digest`: what is copied once the registry
    /// said which manifest the tag names.
    pub fn pinned(&self, digest: ManifestDigest) -> String {
        format!("{}@{}", self.name(), digest.to_oci_string())
    }
}

impl fmt::Display for RegistryReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{}", digest.to_oci_string())?;
        }
        Ok(())
    }
}

/// Transports other tools accept that Lazaret does not.
const UNSUPPORTED_TRANSPORTS: &[&str] = &[
    "dir",
    "docker-archive",
    "docker-daemon",
    "containers-storage",
    "ostree",
    "sif",
    "tarball",
];

/// Parses a profile's `image` field.
pub fn parse_reference(text: &str) -> Result<ImageSource, ImageError> {
    let invalid = |reason: &str| ImageError::Reference {
        reference: text.to_owned(),
        reason: reason.to_owned(),
    };
    if text.is_empty() {
        return Err(invalid("is empty"));
    }
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid("contains whitespace or control characters"));
    }
    if let Some(rest) = text.strip_prefix("oci:") {
        let (path, tag) = split_path_tag(text, rest)?;
        return Ok(ImageSource::OciLayout { path, tag });
    }
    if let Some(rest) = text.strip_prefix("oci-archive:") {
        let (path, tag) = split_path_tag(text, rest)?;
        return Ok(ImageSource::OciArchive { path, tag });
    }
    let registry = text.strip_prefix("docker://").unwrap_or(text);
    if let Some((scheme, _)) = registry.split_once(':')
        && UNSUPPORTED_TRANSPORTS.contains(&scheme)
    {
        return Err(invalid(&format!(
            "uses the `{scheme}:` transport, which Lazaret does not support; use `oci:PATH:TAG`, `oci-archive:PATH` or a registry reference"
        )));
    }
    if registry.contains("://") {
        return Err(invalid(
            "has an unknown scheme; use `oci:PATH:TAG`, `oci-archive:PATH` or a registry reference",
        ));
    }
    parse_registry(text, registry).map(|reference| ImageSource::Registry { reference })
}

/// Splits `PATH[:TAG]` at the first `:` (an OCI layout path cannot contain
/// one, as in skopeo).
fn split_path_tag(text: &str, rest: &str) -> Result<(PathBuf, Option<String>), ImageError> {
    let invalid = |reason: &str| ImageError::Reference {
        reference: text.to_owned(),
        reason: reason.to_owned(),
    };
    let (path, tag) = match rest.split_once(':') {
        Some((path, tag)) => (path, Some(tag)),
        None => (rest, None),
    };
    if !path.starts_with('/') {
        return Err(invalid(
            "names a relative path; write the layout's absolute path, e.g. `oci:/home/me/images/busybox:latest`",
        ));
    }
    if path.split('/').any(|c| c == "..") {
        return Err(invalid(
            "has a `..` component in its path; write the real path",
        ));
    }
    if let Some(tag) = tag {
        if tag.is_empty() {
            return Err(invalid(
                "has an empty tag after `:`; write `PATH:TAG` or just `PATH`",
            ));
        }
        if !tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:/@+".contains(&b))
        {
            return Err(invalid(
                "has a tag with characters outside A-Z a-z 0-9 . _ - : / @ +",
            ));
        }
    }
    Ok((PathBuf::from(path), tag.map(str::to_owned)))
}

fn is_component(text: &str) -> bool {
    // [a-z0-9]+(?:(?:[._]|__|[-]*)[a-z0-9]+)*
    let bytes = text.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &text[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-');
        if !ok {
            return false;
        }
    }
    true
}

fn is_domain(text: &str) -> bool {
    let (host, port) = match text.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (text, None),
    };
    let host_ok = !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    host_ok && port_ok
}

fn is_tag(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && (bytes[0].is_ascii_alphanumeric() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

/// Parses a registry reference, normalizing it as Docker does: a name
/// without a domain is on `docker.io`, and a one-component Docker Hub name
/// is in `library/`.
fn parse_registry(text: &str, reference: &str) -> Result<RegistryReference, ImageError> {
    let invalid = |reason: &str| ImageError::Reference {
        reference: text.to_owned(),
        reason: reason.to_owned(),
    };
    let (rest, digest) = match reference.split_once('@') {
        Some((rest, digest)) => {
            let parsed = ManifestDigest::from_oci_str(digest).ok_or_else(|| {
                invalid("has a digest that is not `sha256:` followed by 64 lowercase hex digits")
            })?;
            (rest, Some(parsed))
        }
        None => (reference, None),
    };
    // A tag follows the last `:` after the last `/`.
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(tag) = tag
        && !is_tag(tag)
    {
        return Err(invalid(
            "has an invalid tag (letters, digits, `_`, `.` and `-`, at most 128)",
        ));
    }
    let mut components: Vec<&str> = name.split('/').collect();
    let domain = if components.len() > 1
        && (components[0].contains('.')
            || components[0].contains(':')
            || components[0] == "localhost")
    {
        let domain = components.remove(0);
        if !is_domain(domain) {
            return Err(invalid("has an invalid registry host"));
        }
        domain.to_owned()
    } else {
        "docker.io".to_owned()
    };
    if components.is_empty() || !components.iter().all(|c| is_component(c)) {
        return Err(invalid(
            "is not a valid image reference: repository names are lowercase letters, digits and separators (`docker.io/library/debian:trixie`, `oci:/path/to/layout:TAG`, `oci-archive:/path/to/image.tar`)",
        ));
    }
    if domain == "docker.io" && components.len() == 1 {
        components.insert(0, "library");
    }
    let tag = match (tag, digest) {
        (None, None) => Some("latest".to_owned()),
        (tag, _) => tag.map(str::to_owned),
    };
    Ok(RegistryReference {
        domain,
        repository: components.join("/"),
        tag,
        digest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(text: &str) -> String {
        match parse_reference(text).unwrap() {
            ImageSource::Registry { reference } => reference.to_string(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn local_forms() {
        assert_eq!(
            parse_reference("oci:/images/bb:1.0").unwrap(),
            ImageSource::OciLayout {
                path: "/images/bb".into(),
                tag: Some("1.0".into())
            }
        );
        assert_eq!(
            parse_reference("oci:/images/bb").unwrap(),
            ImageSource::OciLayout {
                path: "/images/bb".into(),
                tag: None
            }
        );
        assert_eq!(
            parse_reference("oci-archive:/images/bb.tar:v2").unwrap(),
            ImageSource::OciArchive {
                path: "/images/bb.tar".into(),
                tag: Some("v2".into())
            }
        );
        for bad in [
            "oci:images/bb",
            "oci:/images/../bb",
            "oci:/images/bb:",
            "oci-archive:",
            "",
            "oci:/a b",
        ] {
            assert!(
                matches!(parse_reference(bad), Err(ImageError::Reference { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn registry_forms_normalize() {
        assert_eq!(registry("debian"), "docker.io/library/debian:latest");
        assert_eq!(registry("debian:trixie"), "docker.io/library/debian:trixie");
        assert_eq!(
            registry("docker.io/library/debian:trixie"),
            "docker.io/library/debian:trixie"
        );
        assert_eq!(registry("docker://me/tool"), "docker.io/me/tool:latest");
        assert_eq!(registry("localhost:5000/a/b:c"), "localhost:5000/a/b:c");
        assert_eq!(registry("registry.invalid/x:1"), "registry.invalid/x:1");
        let digest = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(
            registry(&format!("quay.io/x/y@{digest}")),
            format!("quay.io/x/y@{digest}")
        );
        for bad in [
            "Debian",
            "debian:",
            "debian@sha256:zz",
            "dir:/x",
            "docker-archive:/x.tar",
            "http://x/y",
            "a//b",
            "-x",
        ] {
            assert!(
                matches!(parse_reference(bad), Err(ImageError::Reference { .. })),
                "{bad}"
            );
        }
    }
}
