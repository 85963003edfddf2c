//! The proxy end to end on 127.0.0.1: credentials put in for the listed
//! host only, HTTP/1.1 and HTTP/2 on both sides, refused names, bad
//! upstream certificates, streamed responses.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use http_body_util::BodyExt;
use lazaret_credproxy::Limits;
use support::*;

/// Upstreams for API and OTHER (one certificate from the test CA) and
/// BAD (a certificate from another CA), and a proxy in front of them.
async fn setup(upstream_alpn: &[&[u8]]) -> (Running, Upstream, Upstream) {
    let ca = TestCa::new("test CA");
    let good = upstream(&ca, &[API, OTHER], upstream_alpn).await;
    let stranger = TestCa::new("another CA");
    let bad = upstream(&stranger, &[BAD], upstream_alpn).await;
    let ports = HashMap::from([
        (API.to_owned(), good.port),
        (OTHER.to_owned(), good.port),
        (BAD.to_owned(), bad.port),
    ]);
    let running = proxy(ca.roots(), local(ports), Limits::default()).await;
    (running, good, bad)
}

#[tokio::test]
async fn the_listed_host_gets_the_real_value_and_another_host_the_placeholder() {
    let bearer = format!("Bearer {PLACEHOLDER}");
    let headers = [
        ("x-api-key", PLACEHOLDER),
        ("authorization", bearer.as_str()),
    ];
    let both: &[&[u8]] = &[b"h2", b"http/1.1"];
    let http1: &[&[u8]] = &[b"http/1.1"];
    for upstream_alpn in [both, http1] {
        let (running, good, _bad) = setup(upstream_alpn).await;
        for http2 in [false, true] {
            for (host, expected) in [(API, REAL), (OTHER, PLACEHOLDER)] {
                let (mut client, _task) = Client::connect(&running, host, http2).await;
                let body = format!("the body keeps {PLACEHOLDER}");
                let request = client.request(host, "/echo", &headers, &body);
                let response = client.send(request).await.unwrap();
                assert_eq!(response.status(), 200);
                assert_eq!(text(response).await, body, "the body is never rewritten");
                let seen = good.seen().pop().unwrap();
                let case = format!("{host} http2={http2} upstream={upstream_alpn:?}");
                assert_eq!(seen.authority, host, "{case}");
                assert_eq!(seen.headers["x-api-key"], expected, "{case}");
                assert_eq!(
                    seen.headers["authorization"],
                    format!("Bearer {expected}"),
                    "{case}"
                );
                let upstream_http2 = upstream_alpn[0] == b"h2";
                assert_eq!(
                    seen.version == http::Version::HTTP_2,
                    upstream_http2,
                    "{case}"
                );
            }
        }
    }
}

#[tokio::test]
async fn several_requests_share_a_connection() {
    let (running, good, _bad) = setup(&[b"h2", b"http/1.1"]).await;
    for http2 in [false, true] {
        let (mut client, _task) = Client::connect(&running, API, http2).await;
        for _ in 0..3 {
            let request = client.request(API, "/echo", &[("x-api-key", PLACEHOLDER)], "");
            let response = client.send(request).await.unwrap();
            assert_eq!(response.status(), 200);
            text(response).await;
        }
    }
    let seen = good.seen();
    assert_eq!(seen.len(), 6);
    assert!(seen.iter().all(|s| s.headers["x-api-key"] == REAL));
}

#[tokio::test]
async fn a_bad_upstream_certificate_fails_the_request_with_a_502_naming_the_host() {
    let (running, _good, bad) = setup(&[b"h2", b"http/1.1"]).await;
    for http2 in [false, true] {
        let (mut client, _task) = Client::connect(&running, BAD, http2).await;
        let request = client.request(BAD, "/echo", &[], "");
        let response = client.send(request).await.unwrap();
        assert_eq!(response.status(), 502);
        let body = text(response).await;
        assert!(body.contains(BAD), "{body}");
        assert!(body.contains("certificate"), "{body}");
        assert!(body.contains("UnknownIssuer"), "{body}");
    }
    assert!(bad.seen().is_empty(), "nothing reached the unverified host");
}

#[tokio::test]
async fn a_handshake_for_a_name_not_served_or_without_a_name_is_refused() {
    let (running, good, _bad) = setup(&[b"h2", b"http/1.1"]).await;
    assert!(tls(&running, UNSERVED, &[b"h2"]).await.is_err());
    // rustls sends no SNI for an address.
    assert!(tls(&running, "127.0.0.1", &[b"h2"]).await.is_err());
    assert!(tls(&running, API, &[b"h2"]).await.is_ok());
    assert!(good.seen().is_empty());
}

#[tokio::test]
async fn a_request_for_another_host_than_the_handshakes_is_misdirected() {
    let (running, good, _bad) = setup(&[b"h2", b"http/1.1"]).await;
    for http2 in [false, true] {
        let (mut client, _task) = Client::connect(&running, OTHER, http2).await;
        let request = client.request(API, "/echo", &[("x-api-key", PLACEHOLDER)], "");
        let response = client.send(request).await.unwrap();
        assert_eq!(response.status(), 421);
    }
    assert!(good.seen().is_empty());
}

#[tokio::test]
async fn a_streamed_response_arrives_before_the_upstream_finishes() {
    let both: &[&[u8]] = &[b"h2", b"http/1.1"];
    let http1: &[&[u8]] = &[b"http/1.1"];
    for upstream_alpn in [both, http1] {
        let (running, good, _bad) = setup(upstream_alpn).await;
        for http2 in [false, true] {
            stream_through(&running, &good, http2).await;
        }
    }
}

/// Asks for `/sse`: its first event arrives while the upstream holds the
/// second back.
async fn stream_through(running: &Running, good: &Upstream, http2: bool) {
    let (mut client, _task) = Client::connect(running, API, http2).await;
    let request = client.request(API, "/sse", &[("x-api-key", PLACEHOLDER)], "");
    let response = client.send(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let first = tokio::time::timeout(BOUND, body.frame())
        .await
        .expect("the first event arrives while the upstream waits")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert_eq!(first, "data: one\n\n");
    // The upstream sends its second event only now.
    good.gate.add_permits(1);
    let rest = tokio::time::timeout(BOUND, body.collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert_eq!(rest, "data: two\n\n");
}

#[tokio::test]
async fn a_value_the_host_echoes_reaches_the_sandbox_as_its_placeholder() {
    let (running, good, _bad) = setup(&[b"h2", b"http/1.1"]).await;
    for http2 in [false, true] {
        let (mut client, _task) = Client::connect(&running, API, http2).await;
        let request = client.request(
            API,
            "/echo-key",
            &[("x-api-key", PLACEHOLDER), ("accept-encoding", "gzip")],
            "",
        );
        let response = client.send(request).await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-echo"], PLACEHOLDER);
        // The placeholder is longer than the value: no stale length.
        assert!(response.headers().get("content-length").is_none());
        assert_eq!(text(response).await, format!("bad key: {PLACEHOLDER}"));
        let seen = good.seen().pop().unwrap();
        assert_eq!(seen.headers["x-api-key"], REAL);
        assert_eq!(seen.headers["accept-encoding"], "identity");
    }
}

#[tokio::test]
async fn an_upstream_that_cannot_be_reached_is_a_502() {
    let ca = TestCa::new("test CA");
    let running = proxy(ca.roots(), local(HashMap::new()), Limits::default()).await;
    let (mut client, _task) = Client::connect(&running, API, false).await;
    let response = client
        .send(client.request(API, "/", &[], ""))
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    let body = text(response).await;
    assert!(body.contains(API), "{body}");
    assert!(!body.contains(REAL), "{body}");
}

#[tokio::test]
async fn connect_is_refused() {
    let (running, good, _bad) = setup(&[b"http/1.1"]).await;
    let (mut client, _task) = Client::connect(&running, API, false).await;
    let request = http::Request::builder()
        .method("CONNECT")
        .uri(format!("{API}:443"))
        .header("host", format!("{API}:443"))
        .body(http_body_util::Full::default())
        .unwrap();
    let response = client.send(request).await.unwrap();
    assert_eq!(response.status(), 405);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(good.seen().is_empty());
}

#[tokio::test]
async fn http1_upstream_connections_are_reused_and_a_closed_one_is_replaced() {
    let (running, good, _bad) = setup(&[b"http/1.1"]).await;
    let (mut client, _task) = Client::connect(&running, API, false).await;
    for path in ["/echo", "/echo", "/close", "/echo", "/echo"] {
        let request = client.request(API, path, &[("x-api-key", PLACEHOLDER)], "");
        let response = client.send(request).await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert!(!response.headers().contains_key("connection"));
        text(response).await;
    }
    let seen = good.seen();
    assert_eq!(seen.len(), 5);
    assert!(seen.iter().all(|s| s.headers["x-api-key"] == REAL));
    let connections = good.connections.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(connections, 2, "one before /close, one after");
}
