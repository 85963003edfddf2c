//! Lazaret's Credential Proxy: the sandbox holds a placeholder for each
//! credential; the proxy, outside the sandbox, terminates the sandbox's
//! TLS to a credential host with a certificate from a per-generation CA,
//! puts the real value in place of the placeholder in the request's
//! header values, and forwards the request to the real host over TLS it
//! verifies.
//!
//! The modules, in the order a request meets them:
//! - [`ca`]: the CA (its key in memory only) and the handshake's choice
//!   of certificate, refusing names not served;
//! - [`proxy`]: one sandbox connection, its bounds ([`proxy::Limits`]),
//!   and each request's checks, forwarding and streamed response;
//! - [`rewrite`]: the placeholders replaced in header values, nowhere
//!   else;
//! - [`upstream`]: connections to the real hosts, verified against the
//!   roots the caller gives;
//! - `redact`: the real values taken back out of a response (an echo),
//!   as its placeholders, and the response body that streams them;
//! - `substitute`: the one scan both directions use.
//!
//! [`hosts`] holds what is served and the real values;
//! [`Placeholder`] (in `lazaret_proto`, since the Host Coordinator makes
//! them) is what the sandbox holds in their place.
//!
//! The role uses it in this order:
//! ```text
//! let authority = Arc::new(Authority::generate(["api.anthropic.com"])?); // key in memory
//! authority.certificate_pem();                         // into the sandbox's trust
//! let mut hosts = Hosts::new();
//! hosts.add("api.anthropic.com", placeholder, value)?;
//! let proxy = Proxy::new(authority, Config {
//!     hosts,
//!     roots: roots(&ders)?,                            // the host's trust store
//!     connector,                                       // resolve, connect
//!     upstream_port: proxy::UPSTREAM_PORT,
//!     limits: Limits::default(),
//! })?;
//! proxy.serve(&listener).await;                        // or serve_connection each
//! ```
//! The sandbox side
//! is hostile throughout; an upstream is trusted only after its
//! certificate is verified. This crate is the role's library; the role's
//! channel, configuration and binary are its caller's.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod activity;
pub mod ca;
pub mod hosts;
pub mod proxy;
mod redact;
pub mod rewrite;
pub mod role;
mod seccomp;
mod substitute;
pub mod upstream;

pub use ca::{Authority, CaError, Resolver};
pub use hosts::{Credential, Hosts, HostsError};
pub use lazaret_proto::placeholder::Placeholder;
pub use proxy::{Config, ConnectionError, Limits, Proxy, ProxyError};
pub use rewrite::{RewriteError, rewrite};
pub use upstream::{Connect, Connecting, UpstreamError, roots};
