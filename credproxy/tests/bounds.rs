//! Each of the proxy's bounds, met by a client that tries to pass it.

mod support;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lazaret_credproxy::{Connecting, Limits};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn setup(limits: Limits) -> (Running, Upstream) {
    let ca = TestCa::new("test CA");
    let good = upstream(&ca, &[API, OTHER], &[b"h2", b"http/1.1"]).await;
    let ports = HashMap::from([(API.to_owned(), good.port), (OTHER.to_owned(), good.port)]);
    let running = proxy(ca.roots(), local(ports), limits).await;
    (running, good)
}

/// Reads until the peer closes (or resets); how long that took.
async fn until_closed<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> Duration {
    let start = Instant::now();
    let mut buffer = [0; 1024];
    loop {
        match tokio::time::timeout(BOUND, stream.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) => return start.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the proxy kept the connection open"),
        }
    }
}

#[tokio::test]
async fn connections_at_once_are_bounded_and_a_silent_client_is_dropped() {
    let handshake = Duration::from_millis(600);
    let limits = Limits {
        connections: 2,
        handshake,
        ..Limits::default()
    };
    let (running, _good) = setup(limits).await;
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(TcpStream::connect(running.address).await.unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A third is closed at once, while the two hold their slots.
    let mut third = TcpStream::connect(running.address).await.unwrap();
    assert!(until_closed(&mut third).await < handshake);
    // The silent ones are closed once the handshake's time is up ...
    for stream in &mut silent {
        until_closed(stream).await;
    }
    // ... and their slots are free again.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (mut client, _task) = Client::connect(&running, API, false).await;
    let response = client
        .send(client.request(API, "/", &[], ""))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn http2_streams_per_connection_are_bounded() {
    let limits = Limits {
        streams: 2,
        ..Limits::default()
    };
    let (running, good) = setup(limits).await;
    let (mut client, _task) = Client::connect(&running, API, true).await;
    // Once the proxy's settings have arrived, the client keeps to them;
    // a client that does not gets the stream past the bound refused.
    let response = client
        .send(client.request(API, "/", &[], ""))
        .await
        .unwrap();
    text(response).await;
    let Client::Http2(send) = client else {
        unreachable!()
    };
    let mut requests = Vec::new();
    for _ in 0..3 {
        let mut send = send.clone();
        let request = http::Request::builder()
            .uri(format!("https://{API}/hold"))
            .body(http_body_util::Full::default())
            .unwrap();
        requests.push(tokio::spawn(
            async move { send.send_request(request).await },
        ));
    }
    for _ in 0..200 {
        if good.held.load(Ordering::SeqCst) >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        good.held.load(Ordering::SeqCst),
        2,
        "the third stream waits"
    );
    good.gate.add_permits(3);
    for request in requests {
        let response = tokio::time::timeout(BOUND, request)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(good.held.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn requests_at_once_are_bounded() {
    let limits = Limits {
        requests: 1,
        ..Limits::default()
    };
    let (running, good) = setup(limits).await;
    let (mut first, _task) = Client::connect(&running, API, false).await;
    let held = tokio::spawn(async move {
        let request = first.request(API, "/hold", &[], "");
        let response = first.send(request).await.unwrap();
        text(response).await
    });
    for _ in 0..100 {
        if good.held.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (mut second, _task) = Client::connect(&running, API, false).await;
    let response = second
        .send(second.request(API, "/", &[], ""))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    good.gate.add_permits(1);
    assert_eq!(
        tokio::time::timeout(BOUND, held).await.unwrap().unwrap(),
        "held"
    );
    // The slot is free once the response has ended.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let response = second
        .send(second.request(API, "/", &[], ""))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn a_request_head_over_the_bound_is_refused() {
    let limits = Limits {
        header_bytes: 16 * 1024,
        ..Limits::default()
    };
    let (running, good) = setup(limits).await;
    let big = "x".repeat(32 * 1024);
    for http2 in [false, true] {
        let (mut client, _task) = Client::connect(&running, API, http2).await;
        let request = client.request(API, "/", &[("x-big", big.as_str())], "");
        match client.send(request).await {
            Ok(response) => assert_eq!(response.status(), 431, "http2={http2}"),
            // HTTP/2 may reset the stream instead.
            Err(e) => assert!(http2, "{e}"),
        }
    }
    // Just under the bound passes.
    let fits = "x".repeat(8 * 1024);
    for http2 in [false, true] {
        let (mut client, _task) = Client::connect(&running, API, http2).await;
        let request = client.request(API, "/", &[("x-fits", fits.as_str())], "");
        assert_eq!(client.send(request).await.unwrap().status(), 200);
    }
    assert!(good.seen().iter().all(|s| !s.headers.contains_key("x-big")));
}

#[tokio::test]
async fn a_head_sent_forever_is_cut_off() {
    let header_read = Duration::from_millis(500);
    let limits = Limits {
        header_read,
        ..Limits::default()
    };
    let (running, good) = setup(limits).await;
    let mut stream = tls(&running, API, &[b"http/1.1"]).await.unwrap();
    stream
        .write_all(format!("GET / HTTP/1.1\r\nhost: {API}\r\n").as_bytes())
        .await
        .unwrap();
    let start = Instant::now();
    // One header line every 100 ms, never the end of the head.
    let trickle = async {
        for i in 0.. {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if stream
                .write_all(format!("x-{i}: {i}\r\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
            if start.elapsed() > BOUND {
                panic!("the proxy kept reading the head");
            }
        }
    };
    tokio::time::timeout(BOUND, trickle).await.ok();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(BOUND, stream.read_to_end(&mut rest)).await;
    assert!(start.elapsed() < header_read * 4, "{:?}", start.elapsed());
    assert!(good.seen().is_empty());
}

#[tokio::test]
async fn an_idle_connection_is_closed() {
    let idle = Duration::from_millis(500);
    let limits = Limits {
        idle,
        ..Limits::default()
    };
    let (running, _good) = setup(limits).await;
    for http2 in [false, true] {
        let (mut client, task) = Client::connect(&running, API, http2).await;
        let response = client
            .send(client.request(API, "/", &[], ""))
            .await
            .unwrap();
        text(response).await;
        let start = Instant::now();
        tokio::time::timeout(BOUND, task)
            .await
            .expect("the proxy closed the idle connection")
            .unwrap();
        assert!(start.elapsed() >= idle / 2, "http2={http2}");
    }
}

#[tokio::test]
async fn a_streamed_response_that_pauses_is_not_idle_while_its_head_is_awaited() {
    let idle = Duration::from_millis(300);
    let limits = Limits {
        idle,
        ..Limits::default()
    };
    let (running, good) = setup(limits).await;
    let (mut client, _task) = Client::connect(&running, API, false).await;
    let request = client.request(API, "/hold", &[], "");
    let answer = tokio::spawn(async move {
        let response = client.send(request).await.unwrap();
        text(response).await
    });
    // The host takes three idle periods to answer.
    tokio::time::sleep(idle * 3).await;
    good.gate.add_permits(1);
    assert_eq!(
        tokio::time::timeout(BOUND, answer).await.unwrap().unwrap(),
        "held"
    );
}

#[tokio::test]
async fn an_upstream_that_does_not_connect_in_time_is_a_504() {
    let connect = Duration::from_millis(300);
    let limits = Limits {
        upstream_connect: connect,
        ..Limits::default()
    };
    let ca = TestCa::new("test CA");
    let never =
        std::sync::Arc::new(|_: &str, _: u16| -> Connecting { Box::pin(std::future::pending()) });
    let running = proxy(ca.roots(), never, limits).await;
    let (mut client, _task) = Client::connect(&running, API, true).await;
    let start = Instant::now();
    let response = client
        .send(client.request(API, "/", &[], ""))
        .await
        .unwrap();
    assert_eq!(response.status(), 504);
    assert!(start.elapsed() < connect * 4);
    assert!(text(response).await.contains(API));
}

#[tokio::test]
async fn an_upstream_that_does_not_answer_in_time_is_a_504() {
    let limits = Limits {
        upstream_response: Duration::from_millis(300),
        ..Limits::default()
    };
    let (running, good) = setup(limits).await;
    let (mut client, _task) = Client::connect(&running, API, false).await;
    let response = client
        .send(client.request(API, "/hold", &[], ""))
        .await
        .unwrap();
    assert_eq!(response.status(), 504);
    good.gate.add_permits(1);
}

#[tokio::test]
async fn a_client_that_says_nothing_after_the_handshake_is_closed() {
    let idle = Duration::from_millis(500);
    let limits = Limits {
        idle,
        ..Limits::default()
    };
    let (running, _good) = setup(limits).await;
    for alpn in [b"h2".as_slice(), b"http/1.1"] {
        let mut stream = tls(&running, API, &[alpn]).await.unwrap();
        let took = until_closed(&mut stream).await;
        assert!(took >= idle / 2, "{took:?}");
    }
}

/// An HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut frame = vec![length[1], length[2], length[3], kind, flags];
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

#[tokio::test]
async fn an_http2_head_sent_forever_is_cut_off() {
    const HEADERS: u8 = 1;
    const SETTINGS: u8 = 4;
    const CONTINUATION: u8 = 9;
    const END_STREAM: u8 = 1;
    let idle = Duration::from_millis(500);
    let limits = Limits {
        idle,
        ..Limits::default()
    };
    let (running, good) = setup(limits).await;
    let mut stream = tls(&running, API, &[b"h2"]).await.unwrap();
    let mut start = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    start.extend(frame(SETTINGS, 0, 0, &[]));
    // :method GET, :scheme https, :path /, :authority API; no END_HEADERS.
    let mut head = vec![0x82, 0x87, 0x84, 0x41, u8::try_from(API.len()).unwrap()];
    head.extend_from_slice(API.as_bytes());
    start.extend(frame(HEADERS, END_STREAM, 1, &head));
    stream.write_all(&start).await.unwrap();
    let began = Instant::now();
    let (mut reader, mut writer) = tokio::io::split(stream);
    let trickle = async {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            // One more header field, never the end of the head.
            let field = frame(CONTINUATION, 0, 1, b"\x00\x03x-a\x01b");
            if writer.write_all(&field).await.is_err() || began.elapsed() > BOUND {
                return;
            }
        }
    };
    let closed = until_closed(&mut reader);
    tokio::select! {
        took = closed => assert!(took < idle * 8, "{took:?}"),
        () = trickle => panic!("the proxy kept reading the head"),
    }
    assert!(good.seen().is_empty());
}
