//! The second enforcement layer: an nftables filter in the enforcement
//! namespace, installed and read back with `nft` and its JSON interface.
//!
//! One table, `inet lazaret`, with two base chains that drop by default:
//! `output` holds the policy's [`FilterRule`]s in order (first match wins),
//! `input` accepts only loopback and replies to what left. The routes
//! already decide every destination; the filter decides again, so a route
//! changed from outside the sandbox (or a bug in how routes are installed)
//! opens nothing. The readback lists the whole ruleset and turns it back
//! into [`FilterRule`]s, refusing anything it does not recognise: what the
//! attestation reports is what the kernel holds. Trusts `nft` at its fixed
//! path, as installed by the host's package manager.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};

use lazaret_proto::network::{FilterRule, IpPrefix, PolicyAction};
use lazaret_proto::sidecar::{SidecarError, SidecarStep};
use serde_json::{Value, json};

use crate::failed;

/// Where `nft` is, in the order tried; never looked up through `PATH`.
const NFT: &[&str] = &["/usr/sbin/nft", "/sbin/nft"];

const FAMILY: &str = "inet";
const TABLE: &str = "lazaret";

fn error(detail: impl std::fmt::Display) -> SidecarError {
    failed(SidecarStep::Filter, detail)
}

/// Two runs of `nft -j -f -`, started before the request comes and
/// waiting for their input: starting `nft` (loading its libraries) takes
/// longer than what it then does, so neither the installation nor the
/// read-back waits for it.
pub struct Runs {
    install: Nft,
    list: Nft,
}

impl Runs {
    /// Starts both runs.
    pub fn start() -> Result<Self, SidecarError> {
        Ok(Self {
            install: Nft::spawn(&["-j", "-f", "-"])?,
            list: Nft::spawn(&["-j", "-f", "-"])?,
        })
    }

    /// Starts installing `filter` as the namespace's only ruleset; the
    /// [`Nft`] run it returns is waited for with [`Nft::finish`], so other
    /// work (the routes) goes on meanwhile. The other run is kept for
    /// [`Listing::start`].
    pub fn install(self, filter: &[FilterRule]) -> Result<(Nft, ListRun), SidecarError> {
        let installing = self
            .install
            .feed(install_document(filter).as_bytes(), "install")?;
        Ok((installing, ListRun(self.list)))
    }

    /// The run kept for a read-back, the other given up.
    pub fn for_listing(self) -> ListRun {
        ListRun(self.list)
    }
}

/// One waiting run of `nft -j -f -`, kept for a listing.
pub struct ListRun(Nft);

/// The whole ruleset, as `nft -j list ruleset` lists it.
const LIST_RULESET: &[u8] = br#"{"nftables": [{"list": {"ruleset": null}}]}"#;

/// The JSON document that installs `filter` as the namespace's only
/// ruleset.
fn install_document(filter: &[FilterRule]) -> String {
    let mut commands = vec![json!({"add": {"table": {"family": FAMILY, "name": TABLE}}})];
    commands.extend(["output", "input"].map(|hook| {
        json!({"add": {"chain": {
            "family": FAMILY, "table": TABLE, "name": hook,
            "type": "filter", "hook": hook, "prio": 0, "policy": "drop",
        }}})
    }));
    let rule = |chain: &str, expr: Value| json!({"add": {"rule": {"family": FAMILY, "table": TABLE, "chain": chain, "expr": expr}}});
    commands.extend(input_rules().into_iter().map(|e| rule("input", e)));
    commands.extend(filter.iter().flat_map(exprs).map(|e| rule("output", e)));
    json!({"nftables": commands}).to_string()
}

/// The `input` chain's rules: loopback, and replies.
fn input_rules() -> [Value; 2] {
    [
        json!([
            {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "lo"}},
            {"accept": null},
        ]),
        json!([
            {"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}},
            {"accept": null},
        ]),
    ]
}

/// The rule expressions that implement one [`FilterRule`]: DNS takes two
/// rules (UDP, then TCP), the others one.
fn exprs(rule: &FilterRule) -> Vec<Value> {
    let daddr = |right: Value| json!({"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": right}});
    match *rule {
        FilterRule::AcceptLoopback => vec![json!([
            {"match": {"op": "==", "left": {"meta": {"key": "oifname"}}, "right": "lo"}},
            {"accept": null},
        ])],
        FilterRule::AcceptDns { resolver } => ["udp", "tcp"]
            .map(|protocol| {
                json!([
                    daddr(json!(resolver.to_string())),
                    {"match": {"op": "==", "left": {"payload": {"protocol": protocol, "field": "dport"}}, "right": 53}},
                    {"accept": null},
                ])
            })
            .into(),
        FilterRule::Prefix { network, action } => {
            let verdict = match action {
                PolicyAction::Allow => json!({"accept": null}),
                PolicyAction::Deny => json!({"drop": null}),
            };
            vec![json!([daddr(destination(&network)), verdict])]
        }
    }
}

/// A destination as `nft` writes it back: a host as a bare address, any
/// other network as a prefix.
fn destination(network: &IpPrefix) -> Value {
    if network.prefix_len == 32 {
        json!(network.address.to_string())
    } else {
        json!({"prefix": {"addr": network.address.to_string(), "len": network.prefix_len}})
    }
}

/// The ruleset being listed.
pub struct Listing(Nft);

impl Listing {
    /// Starts listing the whole ruleset with `run`; [`Listing::rules`]
    /// reads it.
    pub fn start(run: ListRun) -> Result<Self, SidecarError> {
        run.0.feed(LIST_RULESET, "list ruleset").map(Listing)
    }

    /// The output chain's [`FilterRule`]s of the listed ruleset, after
    /// checking that it holds nothing but this table, its two chains as
    /// installed, and the input chain's two rules.
    pub fn rules(self) -> Result<Vec<FilterRule>, SidecarError> {
        rules_of_ruleset(&self.0.finish()?)
    }
}

/// Lists the whole ruleset with `run` and turns it back into
/// [`FilterRule`]s, as [`Listing::rules`] does.
pub fn read_back(run: ListRun) -> Result<Vec<FilterRule>, SidecarError> {
    Listing::start(run)?.rules()
}

fn rules_of_ruleset(listed: &[u8]) -> Result<Vec<FilterRule>, SidecarError> {
    let document: Value =
        serde_json::from_slice(listed).map_err(|e| error(format!("nft listed no JSON: {e}")))?;
    let objects = document["nftables"]
        .as_array()
        .ok_or_else(|| error("nft listed no `nftables` array"))?;
    let mut chains = Vec::new();
    let mut input = Vec::new();
    let mut output = Vec::new();
    for object in objects {
        let Some((kind, body)) = object.as_object().and_then(|o| o.iter().next()) else {
            return Err(error(format!("unexpected ruleset entry {object}")));
        };
        let ours = body["family"] == FAMILY && (body["table"] == TABLE || body["name"] == TABLE);
        match kind.as_str() {
            "metainfo" => {}
            "table" if ours && body["name"] == TABLE => {}
            "chain" if ours => chains.push((
                body["name"].clone(),
                body["type"].clone(),
                body["hook"].clone(),
                body["prio"].clone(),
                body["policy"].clone(),
            )),
            "rule" if ours && body["chain"] == "input" => input.push(body["expr"].clone()),
            "rule" if ours && body["chain"] == "output" => output.push(body["expr"].clone()),
            _ => return Err(error(format!("the namespace holds another {kind}: {body}"))),
        }
    }
    chains.sort_by_key(|c| c.0.to_string());
    let expected_chains: Vec<_> = ["input", "output"]
        .map(|hook| {
            (
                json!(hook),
                json!("filter"),
                json!(hook),
                json!(0),
                json!("drop"),
            )
        })
        .into();
    if chains != expected_chains {
        return Err(error(format!(
            "the filter's chains are not the two drop-by-default base chains: {chains:?}"
        )));
    }
    if input != input_rules() {
        return Err(error(format!(
            "the input chain holds other rules: {input:?}"
        )));
    }
    rules_of(&output)
}

/// Turns the output chain's rule expressions back into [`FilterRule`]s.
fn rules_of(output: &[Value]) -> Result<Vec<FilterRule>, SidecarError> {
    let mut rules = Vec::new();
    let mut rest = output;
    while let Some((first, tail)) = rest.split_first() {
        rest = tail;
        if *first == exprs(&FilterRule::AcceptLoopback)[0] {
            rules.push(FilterRule::AcceptLoopback);
            continue;
        }
        let destination = first[0]["match"]["right"].clone();
        let address = destination
            .as_str()
            .and_then(|a| a.parse::<Ipv4Addr>().ok());
        if let Some(resolver) = address {
            let dns = FilterRule::AcceptDns { resolver };
            let [udp, tcp] = <[Value; 2]>::try_from(exprs(&dns)).unwrap_or_default();
            if *first == udp && tail.first() == Some(&tcp) {
                rest = &tail[1..];
                rules.push(dns);
                continue;
            }
        }
        let network = match (&address, &destination["prefix"]) {
            (Some(host), _) => IpPrefix::host(IpAddr::V4(*host)),
            (None, prefix) => prefix["addr"]
                .as_str()
                .and_then(|a| a.parse::<Ipv4Addr>().ok())
                .zip(prefix["len"].as_u64().and_then(|l| u8::try_from(l).ok()))
                .and_then(|(addr, len)| IpPrefix::ipv4(addr.octets(), len))
                .ok_or_else(|| error(format!("unrecognised output rule {first}")))?,
        };
        let rule = [PolicyAction::Allow, PolicyAction::Deny]
            .into_iter()
            .map(|action| FilterRule::Prefix { network, action })
            .find(|rule| exprs(rule)[0] == *first)
            .ok_or_else(|| error(format!("unrecognised output rule {first}")))?;
        rules.push(rule);
    }
    Ok(rules)
}

/// One run of `nft`, started and not yet waited for.
pub struct Nft {
    /// Until [`Nft::finish`] waits for it.
    child: Option<std::process::Child>,
    program: &'static str,
    args: String,
}

impl Nft {
    /// Starts `nft ARGS`, waiting for its input ([`Nft::feed`]).
    fn spawn(args: &[&str]) -> Result<Self, SidecarError> {
        let program = NFT
            .iter()
            .find(|p| std::path::Path::new(p).is_file())
            .ok_or_else(|| {
                error("nft is not installed; install it with `apt-get install nftables`")
            })?;
        let child = Command::new(program)
            .args(args)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| error(format!("cannot run {program}: {e}")))?;
        Ok(Self {
            child: Some(child),
            program,
            args: args.join(" "),
        })
    }

    /// Gives the run its whole input: it reads to the end before it does
    /// anything.
    fn feed(mut self, input: &[u8], what: &str) -> Result<Self, SidecarError> {
        let program = self.program;
        self.args = format!("{} ({what})", self.args);
        let stdin = self.child.as_mut().and_then(|c| c.stdin.take());
        let mut stdin = stdin.ok_or_else(|| error(format!("{program} was fed already")))?;
        // nft reads its whole input before it writes anything, so this
        // cannot wait on a full output pipe; the input is a few KiB.
        stdin
            .write_all(input)
            .map_err(|e| error(format!("cannot write to {program}: {e}")))?;
        Ok(self)
    }

    /// Waits for the run: its standard output, or an error with what it
    /// said.
    pub fn finish(mut self) -> Result<Vec<u8>, SidecarError> {
        let program = self.program;
        let output = self
            .child
            .take()
            .ok_or_else(|| error(format!("{program} was waited for already")))?
            .wait_with_output()
            .map_err(|e| error(format!("cannot wait for {program}: {e}")))?;
        if !output.status.success() {
            return Err(error(format!(
                "`nft {}` failed ({}): {}",
                self.args,
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(output.stdout)
    }
}

impl Drop for Nft {
    /// A run given up on (its caller failed first) is ended and reaped.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(octets: [u8; 4], len: u8, action: PolicyAction) -> FilterRule {
        FilterRule::Prefix {
            network: IpPrefix::ipv4(octets, len).unwrap(),
            action,
        }
    }

    #[test]
    fn rules_read_back_as_written() {
        let filter = [
            FilterRule::AcceptLoopback,
            FilterRule::AcceptDns {
                resolver: Ipv4Addr::new(10, 0, 2, 3),
            },
            prefix([224, 0, 0, 0], 4, PolicyAction::Deny),
            prefix([255, 255, 255, 255], 32, PolicyAction::Deny),
            prefix([198, 18, 0, 10], 32, PolicyAction::Allow),
            prefix([0, 0, 0, 0], 0, PolicyAction::Allow),
        ];
        let written: Vec<Value> = filter.iter().flat_map(exprs).collect();
        assert_eq!(written.len(), filter.len() + 1, "DNS takes two rules");
        assert_eq!(rules_of(&written).unwrap(), filter);
    }

    #[test]
    fn unknown_rules_are_refused() {
        let foreign = [
            json!([{"accept": null}]),
            json!([{"match": {"op": "!=", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "1.2.3.4"}}, {"accept": null}]),
            json!([{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "1.2.3.4"}}, {"counter": null}, {"accept": null}]),
        ];
        for rule in foreign {
            assert!(rules_of(std::slice::from_ref(&rule)).is_err(), "{rule}");
        }
        // Half of a DNS pair is not DNS.
        let dns = exprs(&FilterRule::AcceptDns {
            resolver: Ipv4Addr::new(10, 0, 2, 3),
        });
        assert!(rules_of(&dns[..1]).is_err());
    }
}
