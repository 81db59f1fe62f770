//! h2peer: gRPC over HTTP/2 on the `h2` crate (the implementation under
//! tonic and hyper, which the OpenShell gateway and driver use), speaking
//! the gRPC wire format by hand (no protobuf library: the driver proxy is
//! byte-transparent for the methods used here).
//!
//!   h2peer client SOCKET   run a fixed suite of calls in the gateway's
//!                          role and print one JSON line per call
//!   h2peer soak SOCKET     in the gateway's role, run the calls read from
//!                          stdin (one a line, see soak) up to 16 at a time
//!                          on one connection and print one JSON line per
//!                          call; sinks/gateway's relay soak writes them
//!                          from its seed and checks the answers
//!   h2peer server SOCKET   serve in the driver's role: every method echoes
//!                          each request message with field 906 appended
//!                          ("echo:" + path), like gatewaytest.Driver
//!
//! The suite covers sequential calls whose metadata churns the HPACK dynamic
//! table (repeated, unique and oversized values, binary metadata), then
//! unary and streaming calls all at once on the one connection, messages
//! beyond the default 64 KiB windows (up to 3 MiB), trailers-only error
//! answers and deadlines. sinks/gateway/h2interop_test.go checks the lines.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use h2::RecvStream;
use http::{HeaderMap, Request, Response};
use tokio::net::{UnixListener, UnixStream};

const SVC: &str = "/openshell.compute.v1.ComputeDriver/";
const CHAT: &str = "/openshell.compute.v2.ComputeDriverNext/Chat";
const CANCEL: &str = "cancel-after-2";
const PAUSE: &str = "x-h2peer-pause-ms";
const FAILING_ID: &str = "7f7c2c8e-4a9b-4c1e-9e57-1f0b3a9d2c11";

/// One call of the suite.
#[derive(Clone)]
struct Call {
    name: String,
    method: String,
    msgs: Vec<Vec<u8>>,
    meta: Vec<(String, String)>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 || args.len() > 4 || (args.len() == 4 && args[3] != "hyper") {
        eprintln!("usage: h2peer client|hol|goaway|soak|server SOCKET [hyper]");
        std::process::exit(2);
    }
    let hyper = args.len() == 4;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let res = match args[1].as_str() {
        "client" => rt.block_on(client(&args[2], hyper)),
        "hol" => rt.block_on(hol(&args[2], hyper)),
        "goaway" => rt.block_on(goaway(&args[2], hyper)),
        "soak" => rt.block_on(soak(&args[2], hyper)),
        "server" => rt.block_on(server(&args[2], hyper)),
        _ => Err("unknown mode".into()),
    };
    if let Err(e) = res {
        eprintln!("h2peer: {}", e);
        std::process::exit(1);
    }
}

type Error = Box<dyn std::error::Error>;

/// Deterministic filler bytes (an LCG), so every run sends the same suite.
fn fill(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect()
}

fn suite(hyper: bool) -> (Vec<Call>, Vec<Call>) {
    let unknown = format!("{}DescribeSandboxFuture", SVC);
    let mut seq = Vec::new();
    for i in 0..24u64 {
        let mut meta = vec![
            ("x-tenant".to_string(), "tenant-a".to_string()),
            ("x-call".to_string(), format!("seq-{}", i)),
            (
                "traceparent".to_string(),
                format!("00-{:032x}-{:016x}-01", i * 7919 + 1, i + 11),
            ),
            ("x-bin-bin".to_string(), b64(&fill(i + 1000, 20))),
        ];
        if i % 5 == 0 {
            // Over a third of the default 4096-byte table: evicts entries.
            let big: String = fill(i + 2000, 1500)
                .iter()
                .map(|b| (b'a' + b % 26) as char)
                .collect();
            meta.push(("x-big".to_string(), big));
        }
        if i % 3 == 0 {
            meta.push(("grpc-timeout".to_string(), "30S".to_string()));
        }
        seq.push(Call {
            name: format!("seq-{}", i),
            method: unknown.clone(),
            msgs: vec![fill(i, 100 + 37 * i as usize)],
            meta,
        });
        if i == 11 {
            // The gateway cancels a stream midway (RST_STREAM CANCEL); the
            // calls after it share the connection.
            seq.push(Call {
                name: CANCEL.into(),
                method: CHAT.to_string(),
                msgs: (0..5u64).map(|j| fill(600 + j, 3000)).collect(),
                meta: vec![("x-call".to_string(), CANCEL.to_string())],
            });
        }
    }
    if !hyper {
        // A header block over the 16 KiB frame size (h2 sends CONTINUATION
        // frames; the echo comes back as large). hyper's clients refuse
        // header lists over 16 KiB, so only with h2's defaults.
        let huge: String = fill(900, 20_000)
            .iter()
            .map(|b| (b'a' + b % 26) as char)
            .collect();
        seq.push(Call {
            name: "huge-header".into(),
            method: unknown.clone(),
            msgs: vec![fill(901, 10)],
            meta: vec![("x-huge".to_string(), huge)],
        });
    }
    let mut conc = Vec::new();
    for i in 0..16u64 {
        conc.push(Call {
            name: format!("conc-unary-{}", i),
            method: unknown.clone(),
            msgs: vec![fill(100 + i, 10 + (i as usize * 331) % 5000)],
            meta: vec![
                ("x-call".to_string(), format!("conc-unary-{}", i)),
                ("x-tenant".to_string(), "tenant-b".to_string()),
            ],
        });
    }
    for i in 0..4u64 {
        conc.push(Call {
            name: format!("conc-stream-{}", i),
            method: CHAT.to_string(),
            msgs: (0..25u64)
                .map(|j| fill(200 + i * 100 + j, 1 + ((i * 25 + j) as usize * 797) % 20000))
                .collect(),
            meta: vec![("x-call".to_string(), format!("conc-stream-{}", i))],
        });
    }
    conc.push(Call {
        name: "large-unary-1.5MiB".into(),
        method: unknown.clone(),
        msgs: vec![fill(300, 3 << 19)],
        meta: vec![],
    });
    conc.push(Call {
        name: "large-unary-3MiB".into(),
        method: unknown.clone(),
        msgs: vec![fill(301, 3 << 20)],
        meta: vec![],
    });
    conc.push(Call {
        name: "large-stream".into(),
        method: CHAT.to_string(),
        msgs: (0..3u64)
            .map(|j| fill(310 + j, 1_200_000 + j as usize))
            .collect(),
        meta: vec![("grpc-timeout".to_string(), "60S".to_string())],
    });
    conc.push(Call {
        name: "caps".into(),
        method: format!("{}GetCapabilities", SVC),
        msgs: vec![vec![]],
        meta: vec![],
    });
    conc.push(Call {
        name: "stop".into(),
        method: format!("{}StopSandbox", SVC),
        msgs: vec![vec![0x0a, 2, b's', b'1']],
        meta: vec![],
    });
    let mut get = vec![0x0a, 10];
    get.extend_from_slice(b"sb-missing");
    conc.push(Call {
        name: "get-missing".into(),
        method: format!("{}GetSandbox", SVC),
        msgs: vec![get],
        meta: vec![],
    });
    // The failing sandbox of sinks/gateway's relay tests: while the proxy
    // knows its pull failure, the frame relay answers Get and List itself.
    let mut get = vec![0x0a, FAILING_ID.len() as u8];
    get.extend_from_slice(FAILING_ID.as_bytes());
    conc.push(Call {
        name: "get-failing".into(),
        method: format!("{}GetSandbox", SVC),
        msgs: vec![get],
        meta: vec![("x-call".into(), "get-failing".into())],
    });
    conc.push(Call {
        name: "list".into(),
        method: format!("{}ListSandboxes", SVC),
        msgs: vec![vec![]],
        meta: vec![],
    });
    (seq, conc)
}

/// connect opens a client connection: h2's defaults (64 KiB stream and
/// connection windows, so every large message needs many WINDOW_UPDATEs),
/// or with `hyper` the settings hyper 1.x gives a tonic client (2 MiB
/// stream and 5 MiB connection windows, 16 KiB header lists).
async fn connect(
    path: &str,
    hyper: bool,
) -> Result<
    (
        h2::client::SendRequest<Bytes>,
        tokio::task::JoinHandle<Result<(), h2::Error>>,
    ),
    Error,
> {
    let io = UnixStream::connect(path).await?;
    let mut b = h2::client::Builder::new();
    if hyper {
        b.initial_window_size(2 << 20)
            .initial_connection_window_size(5 << 20)
            .max_header_list_size(16 << 10);
    }
    let (h2c, conn) = b.handshake(io).await?;
    Ok((h2c, tokio::spawn(conn)))
}

async fn client(path: &str, hyper: bool) -> Result<(), Error> {
    let (h2c, conn) = connect(path, hyper).await?;
    let (seq, conc) = suite(hyper);
    let mut n = 0;
    for c in seq {
        println!("{}", run_call(h2c.clone(), c).await);
        n += 1;
    }
    let mut tasks = Vec::new();
    for c in conc {
        tasks.push(tokio::spawn(run_call(h2c.clone(), c)));
    }
    for t in tasks {
        println!("{}", t.await?);
        n += 1;
    }
    drop(h2c);
    let end = tokio::time::timeout(Duration::from_secs(5), conn).await;
    println!(
        "{{\"done\":{},\"conn\":{}}}",
        n,
        json_str(&format!(
            "{:?}",
            end.map(|r| r.map(|r| r.map_err(|e| e.to_string())))
        ))
    );
    Ok(())
}

/// run_call makes one call and renders its result as a JSON line.
async fn run_call(h2c: h2::client::SendRequest<Bytes>, c: Call) -> String {
    let mut out = format!(
        "{{\"name\":{},\"method\":{}",
        json_str(&c.name),
        json_str(&c.method)
    );
    out.push_str(",\"req\":");
    out.push_str(&msgs_json(&c.msgs));
    match call(h2c, &c).await {
        Ok((status, headers, msgs, trailers)) => {
            let _ = write!(
                out,
                ",\"status\":{},\"headers\":{},\"msgs\":{},\"trailers\":{}",
                status,
                headers_json(&headers),
                msgs_json(&msgs),
                headers_json(&trailers)
            );
        }
        Err(e) => {
            let _ = write!(out, ",\"error\":{}", json_str(&e.to_string()));
        }
    }
    out.push('}');
    out
}

/// early_response_reset is the peer's RST_STREAM(NO_ERROR): a server that
/// answered before reading the whole request asks the client to stop
/// sending (RFC 9113, 8.1), and a client must not discard the answer for it.
/// The h2 crate of this peer (0.3.13) reports it as an error once the
/// stream has ended, even after a trailers-only answer whose status is in
/// the response headers; hyper (PRs 3275 and 3998), the layer under tonic,
/// ends the body and the trailers there instead, and so does this peer.
fn early_response_reset(e: &h2::Error) -> bool {
    e.is_remote() && e.reason() == Some(h2::Reason::NO_ERROR)
}

async fn call(
    h2c: h2::client::SendRequest<Bytes>,
    c: &Call,
) -> Result<(u16, HeaderMap, Vec<Vec<u8>>, HeaderMap), Error> {
    let mut h2c = h2c.ready().await?;
    let mut req = Request::builder()
        .method("POST")
        .uri(format!("http://driver{}", c.method))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("user-agent", "h2peer");
    for (k, v) in &c.meta {
        req = req.header(k.as_str(), v.as_str());
    }
    let (resp, mut send) = h2c.send_request(req.body(())?, false)?;
    if c.name == CANCEL {
        // Send every message but keep the stream open, read two answers,
        // then reset the stream.
        for m in &c.msgs {
            let mut b = BytesMut::with_capacity(5 + m.len());
            b.extend_from_slice(&[0]);
            b.extend_from_slice(&(m.len() as u32).to_be_bytes());
            b.extend_from_slice(m);
            send.send_data(b.freeze(), false)?;
        }
        let resp: Response<RecvStream> = resp.await?;
        let (parts, mut body) = resp.into_parts();
        let mut buf = Vec::new();
        while split_msgs_prefix(&buf) < 2 {
            match body.data().await {
                Some(chunk) => {
                    let chunk = chunk?;
                    let _ = body.flow_control().release_capacity(chunk.len());
                    buf.extend_from_slice(&chunk);
                }
                None => return Err("the stream ended before two answers".into()),
            }
        }
        send.send_reset(h2::Reason::CANCEL);
        let mut msgs = split_msgs(&buf[..split_msgs_len(&buf, 2)])?;
        msgs.truncate(2);
        return Ok((parts.status.as_u16(), parts.headers, msgs, HeaderMap::new()));
    }
    // Requests are written by a task of their own: a streaming call's
    // answers arrive while it still sends, as with tonic.
    let msgs = c.msgs.clone();
    let sender = tokio::spawn(async move {
        let n = msgs.len();
        for (i, m) in msgs.into_iter().enumerate() {
            let mut b = BytesMut::with_capacity(5 + m.len());
            b.extend_from_slice(&[0]);
            b.extend_from_slice(&(m.len() as u32).to_be_bytes());
            b.extend_from_slice(&m);
            let mut b = b.freeze();
            // Send within the capacity h2 grants, so flow control paces us.
            while !b.is_empty() {
                send.reserve_capacity(b.len());
                let cap = match futures_capacity(&mut send).await {
                    Some(Ok(c)) => c,
                    Some(Err(e)) => return Err(e.to_string()),
                    None => return Err("stream closed while sending".into()),
                };
                let chunk = b.split_to(cap.min(b.len()));
                send.send_data(chunk, i + 1 == n && b.is_empty())
                    .map_err(|e| e.to_string())?;
            }
        }
        if n == 0 {
            send.send_data(Bytes::new(), true)
                .map_err(|e| e.to_string())?;
        }
        Ok::<(), String>(())
    });
    let resp: Response<RecvStream> = resp.await?;
    let (parts, mut body) = resp.into_parts();
    if let Some((_, ms)) = c.meta.iter().find(|(k, _)| k == PAUSE) {
        // A slow reader: nothing is read (so no window is given back) for
        // a while after the response headers.
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
    }
    let mut buf = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) if early_response_reset(&e) => break,
            Err(e) => return Err(e.into()),
        };
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
    }
    let trailers = match body.trailers().await {
        Ok(t) => t.unwrap_or_default(),
        Err(e) if early_response_reset(&e) => HeaderMap::new(),
        Err(e) => return Err(e.into()),
    };
    match sender.await? {
        Ok(()) => {}
        // A server may answer (trailers-only) before reading the request.
        Err(e) if trailers.is_empty() && !parts.headers.contains_key("grpc-status") => {
            return Err(e.into())
        }
        Err(_) => {}
    }
    Ok((
        parts.status.as_u16(),
        parts.headers,
        split_msgs(&buf)?,
        trailers,
    ))
}

/// soak runs the calls of stdin, one a line, tab-separated: id, method,
/// cancel_ms (reset the stream after that long; 0: never), final (1: run
/// after every other call has ended, alone), the request messages
/// (comma-separated: a size n is fill((id << 8) | i, n), "x" + hex is
/// literal), then metadata as key, value pairs. Results are printed as the
/// calls end: messages up to 2 MiB whole (hex), larger ones as digests.
async fn soak(path: &str, hyper: bool) -> Result<(), Error> {
    let (h2c, conn) = connect(path, hyper).await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(64);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(l) = line else { return };
            if tx.blocking_send(l).is_err() {
                return;
            }
        }
    });
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(16));
    let (mut tasks, mut finals, mut n) = (Vec::new(), Vec::new(), 0);
    while let Some(line) = rx.recv().await {
        let (id, cancel, last, c) = soak_line(&line)?;
        if last {
            finals.push((id, c));
            continue;
        }
        let permit = sem.clone().acquire_owned().await?;
        let h2c = h2c.clone();
        tasks.push(tokio::spawn(async move {
            println!("{}", soak_call(h2c, id, cancel, c).await);
            drop(permit);
        }));
        n += 1;
    }
    for t in tasks {
        t.await?;
    }
    for (id, c) in finals {
        println!("{}", soak_call(h2c.clone(), id, 5000, c).await);
        n += 1;
    }
    drop(h2c);
    let end = tokio::time::timeout(Duration::from_secs(5), conn).await;
    println!(
        "{{\"done\":{},\"conn\":{}}}",
        n,
        json_str(&format!(
            "{:?}",
            end.map(|r| r.map(|r| r.map_err(|e| e.to_string())))
        ))
    );
    Ok(())
}

fn soak_line(line: &str) -> Result<(u64, u64, bool, Call), Error> {
    let f: Vec<&str> = line.split('\t').collect();
    if f.len() < 5 || f.len() % 2 == 0 {
        return Err(format!("soak: bad line {:?}", line).into());
    }
    let id: u64 = f[0].parse()?;
    let mut msgs = Vec::new();
    for (i, m) in f[4].split(',').filter(|m| !m.is_empty()).enumerate() {
        msgs.push(match m.strip_prefix('x') {
            Some(h) => (0..h.len() / 2)
                .map(|j| u8::from_str_radix(&h[2 * j..2 * j + 2], 16))
                .collect::<Result<_, _>>()?,
            None => fill((id << 8) | i as u64, m.parse()?),
        });
    }
    let meta = f[5..]
        .chunks(2)
        .map(|kv| (kv[0].to_string(), kv[1].to_string()))
        .collect();
    let c = Call {
        name: f[0].to_string(),
        method: f[1].to_string(),
        msgs,
        meta,
    };
    Ok((id, f[2].parse()?, f[3] == "1", c))
}

async fn soak_call(h2c: h2::client::SendRequest<Bytes>, id: u64, cancel: u64, c: Call) -> String {
    let res = if cancel > 0 {
        match tokio::time::timeout(Duration::from_millis(cancel), call(h2c, &c)).await {
            Ok(r) => r,
            // Dropping the call's streams resets them (RST_STREAM CANCEL).
            Err(_) => return format!("{{\"id\":{},\"cancelled\":true}}", id),
        }
    } else {
        call(h2c, &c).await
    };
    match res {
        Ok((status, headers, msgs, trailers)) => format!(
            "{{\"id\":{},\"status\":{},\"headers\":{},\"msgs\":{},\"trailers\":{}}}",
            id,
            status,
            headers_json(&headers),
            msgs_json_hex(&msgs, 2 << 20),
            headers_json(&trailers)
        ),
        Err(e) => format!("{{\"id\":{},\"error\":{}}}", id, json_str(&e.to_string())),
    }
}

/// hol: calls whose answers the gateway does not read yet fill its
/// connection window; meanwhile a call that uploads more than the driver's
/// window and is answered without DATA (trailers-only) must still complete,
/// as it does on a direct connection: the driver's WINDOW_UPDATEs and
/// header blocks are not flow-controlled. Then the held answers are read.
async fn hol(path: &str, hyper: bool) -> Result<(), Error> {
    let (h2c, conn) = connect(path, hyper).await?;
    // Enough unread answer bytes to exceed the gateway's connection window
    // (64 KiB, or 5 MiB with hyper) while each fits its stream window.
    let (n, size) = if hyper { (3, 1_900_000) } else { (2, 60_000) };
    let mut held = Vec::new();
    for i in 0..n {
        let mut h2c = h2c.clone().ready().await?;
        let req = Request::builder()
            .method("POST")
            .uri(format!("http://driver{}", CHAT))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())?;
        let (resp, mut send) = h2c.send_request(req, false)?;
        let m = fill(400 + i, size);
        let mut b = BytesMut::new();
        b.extend_from_slice(&[0]);
        b.extend_from_slice(&(m.len() as u32).to_be_bytes());
        b.extend_from_slice(&m);
        send.send_data(b.freeze(), true)?;
        held.push((resp, send, m.len()));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let up = Call {
        name: "hol-upload".into(),
        method: format!("{}StopSandbox", SVC),
        msgs: vec![fill(500, if hyper { 3 << 20 } else { 300_000 })],
        meta: vec![],
    };
    let t0 = std::time::Instant::now();
    let line = match tokio::time::timeout(Duration::from_secs(5), run_call(h2c.clone(), up)).await {
        Ok(line) => line,
        Err(_) => "{\"name\":\"hol-upload\",\"error\":\"no answer within 5s\"}".to_string(),
    };
    println!("{}", line);
    eprintln!("h2peer hol: upload call took {:?}", t0.elapsed());
    let mut done = 1;
    for (i, (resp, _send, n)) in held.into_iter().enumerate() {
        let r = tokio::time::timeout(Duration::from_secs(10), async move {
            let resp = resp.await?;
            let mut body = resp.into_body();
            let mut got = 0;
            while let Some(c) = body.data().await {
                let c = c?;
                let _ = body.flow_control().release_capacity(c.len());
                got += c.len();
            }
            let t = body.trailers().await?.unwrap_or_default();
            Ok::<_, h2::Error>((
                got,
                t.get("grpc-status")
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
            ))
        })
        .await;
        let r = match r {
            Ok(Ok((got, st))) => format!(
                "{{\"bytes\":{},\"grpc_status\":{}}}",
                got,
                json_str(&st.unwrap_or_default())
            ),
            Ok(Err(e)) => format!("{{\"error\":{}}}", json_str(&e.to_string())),
            Err(_) => "{\"error\":\"no answer within 10s\"}".to_string(),
        };
        println!(
            "{{\"name\":\"hol-held-{}\",\"sent\":{},\"result\":{}}}",
            i, n, r
        );
        done += 1;
    }
    drop(h2c);
    let end = tokio::time::timeout(Duration::from_secs(5), conn).await;
    println!(
        "{{\"done\":{},\"conn\":{}}}",
        done,
        json_str(&format!(
            "{:?}",
            end.map(|r| r.map(|r| r.map_err(|e| e.to_string())))
        ))
    );
    Ok(())
}

/// goaway: 30 unary calls one after another, redialling when the
/// connection is going away (the driver shuts connections down
/// gracefully, see server); a call is tried at most 3 times. Every error
/// is reported with its call.
async fn goaway(path: &str, hyper: bool) -> Result<(), Error> {
    let mut cur: Option<h2::client::SendRequest<Bytes>> = None;
    let mut dials = 0;
    for i in 0..30u64 {
        let c = Call {
            name: format!("goaway-{}", i),
            method: format!("{}DescribeSandboxFuture", SVC),
            msgs: vec![fill(700 + i, 2000)],
            meta: vec![("x-call".to_string(), format!("goaway-{}", i))],
        };
        let mut errors = Vec::new();
        let mut line = String::new();
        for _ in 0..3 {
            let h2c = match &cur {
                Some(h) => h.clone(),
                None => {
                    dials += 1;
                    let (h, _conn) = connect(path, hyper).await?;
                    cur = Some(h.clone());
                    h
                }
            };
            match call(h2c, &c).await {
                Ok((status, headers, msgs, trailers)) => {
                    line = format!(
                        "{{\"name\":{},\"method\":{},\"req\":{},\"status\":{},\"headers\":{},\"msgs\":{},\"trailers\":{}",
                        json_str(&c.name), json_str(&c.method), msgs_json(&c.msgs), status, headers_json(&headers), msgs_json(&msgs), headers_json(&trailers)
                    );
                    break;
                }
                Err(e) => {
                    errors.push(json_str(&e.to_string()));
                    cur = None;
                }
            }
        }
        if line.is_empty() {
            line = format!(
                "{{\"name\":{},\"error\":\"3 attempts failed\"",
                json_str(&c.name)
            );
        }
        println!("{},\"retries\":[{}]}}", line, errors.join(","));
    }
    println!(
        "{{\"done\":30,\"dials\":{},\"conn\":\"Ok(Ok(Ok(())))\"}}",
        dials
    );
    Ok(())
}

async fn futures_capacity(s: &mut h2::SendStream<Bytes>) -> Option<Result<usize, h2::Error>> {
    std::future::poll_fn(|cx| s.poll_capacity(cx)).await
}

/// split_msgs_prefix counts the whole gRPC messages at the start of b.
fn split_msgs_prefix(b: &[u8]) -> usize {
    let (mut n, mut off) = (0, 0);
    while b.len() >= off + 5 {
        let l = u32::from_be_bytes([b[off + 1], b[off + 2], b[off + 3], b[off + 4]]) as usize;
        if b.len() < off + 5 + l {
            break;
        }
        off += 5 + l;
        n += 1;
    }
    n
}

/// split_msgs_len is the byte length of the first k whole messages of b.
fn split_msgs_len(b: &[u8], k: usize) -> usize {
    let mut off = 0;
    for _ in 0..k {
        let l = u32::from_be_bytes([b[off + 1], b[off + 2], b[off + 3], b[off + 4]]) as usize;
        off += 5 + l;
    }
    off
}

fn split_msgs(mut b: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
    let mut out = Vec::new();
    while !b.is_empty() {
        if b.len() < 5 {
            return Err("truncated gRPC message prefix".into());
        }
        if b[0] != 0 {
            return Err("compressed gRPC message".into());
        }
        let n = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        if b.len() < 5 + n {
            return Err("truncated gRPC message".into());
        }
        out.push(b[5..5 + n].to_vec());
        b = &b[5 + n..];
    }
    Ok(out)
}

// ---- server (the driver's role) ----

/// server serves the driver's role: with `hyper`, with the settings hyper
/// 1.x gives a tonic server (1 MiB windows, 200 concurrent streams, 16 KiB
/// header lists), else with h2's defaults.
async fn server(path: &str, hyper: bool) -> Result<(), Error> {
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path)?;
    println!("{{\"listening\":{}}}", json_str(path));
    loop {
        let (io, _) = l.accept().await?;
        let mut b = h2::server::Builder::new();
        if hyper {
            b.initial_window_size(1 << 20)
                .initial_connection_window_size(1 << 20)
                .max_concurrent_streams(200)
                .max_header_list_size(16 << 10);
        }
        // H2PEER_GOAWAY_AFTER=n: shut each connection down gracefully
        // after its n-th stream (h2 sends GOAWAY with the last id 2^31-1
        // and a PING, then GOAWAY with the real last id), as a tonic driver
        // that is stopping does.
        let goaway_after: usize = std::env::var("H2PEER_GOAWAY_AFTER")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        tokio::spawn(async move {
            let mut conn = match b.handshake(io).await {
                Ok(c) => c,
                Err(e) => return eprintln!("h2peer server: handshake: {}", e),
            };
            let mut streams = 0;
            while let Some(r) = conn.accept().await {
                streams += 1;
                if streams == goaway_after {
                    conn.graceful_shutdown();
                }
                match r {
                    Ok((req, respond)) => {
                        tokio::spawn(async move {
                            if let Err(e) = serve(req, respond).await {
                                eprintln!("h2peer server: stream: {}", e);
                            }
                        });
                    }
                    Err(e) => return eprintln!("h2peer server: connection: {}", e),
                }
            }
        });
    }
}

async fn serve(
    req: Request<RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) -> Result<(), Error> {
    let (parts, mut body) = req.into_parts();
    let method = parts.uri.path().to_string();
    let mut resp = Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .header("x-driver-method", method.as_str());
    let mut echo: Vec<(String, String)> = Vec::new();
    for (k, v) in parts.headers.iter() {
        let k = k.as_str();
        if k == "content-type" || k == "user-agent" || k == "te" || k == "grpc-timeout" {
            continue;
        }
        echo.push((
            format!("x-echo-{}", k),
            String::from_utf8_lossy(v.as_bytes()).into_owned(),
        ));
    }
    echo.sort();
    for (k, v) in &echo {
        resp = resp.header(k.as_str(), v.as_str());
    }
    let deadline = if parts.headers.contains_key("grpc-timeout") {
        "set"
    } else {
        "none"
    };
    resp = resp.header("x-driver-deadline", deadline);
    if method.ends_with("/StopSandbox") {
        // A trailers-only answer (the status in the only header block),
        // after reading the request as a tonic unary handler does.
        while let Some(chunk) = body.data().await {
            let _ = body.flow_control().release_capacity(chunk?.len());
        }
        let r = resp
            .header("grpc-status", "9")
            .header("grpc-message", "sandbox is deleting")
            .body(())?;
        respond.send_response(r, true)?;
        return Ok(());
    }
    let mut send = respond.send_response(resp.body(())?, false)?;
    let suffix = echo_field(&method);
    let mut buf = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        while buf.len() >= 5 {
            let n = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if buf.len() < 5 + n {
                break;
            }
            let m = buf.split_to(5 + n);
            let mut out = BytesMut::with_capacity(m.len() + suffix.len());
            out.extend_from_slice(&[0]);
            out.extend_from_slice(&((n + suffix.len()) as u32).to_be_bytes());
            out.extend_from_slice(&m[5..]);
            out.extend_from_slice(&suffix);
            send.send_data(out.freeze(), false)?;
        }
    }
    let mut t = HeaderMap::new();
    t.insert("grpc-status", "0".parse()?);
    t.insert("x-driver-trailer", format!("t:{}", method).parse()?);
    send.send_trailers(t)?;
    Ok(())
}

/// echo_field is protobuf field 906 (length-delimited) holding "echo:"+method.
fn echo_field(method: &str) -> Vec<u8> {
    let v = format!("echo:{}", method);
    let mut b = Vec::new();
    varint(&mut b, (906 << 3) | 2);
    varint(&mut b, v.len() as u64);
    b.extend_from_slice(v.as_bytes());
    b
}

fn varint(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push((v as u8) | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

// ---- output ----

/// FNV-1a 64: a message's digest. It has no finalisation, so the test can
/// extend a request's digest by the echo suffix to predict the answer's.
fn fnv(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &c in b {
        h ^= c as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn msgs_json(msgs: &[Vec<u8>]) -> String {
    msgs_json_hex(msgs, 4096)
}

/// msgs_json_hex: messages up to hex_max bytes are printed whole.
fn msgs_json_hex(msgs: &[Vec<u8>], hex_max: usize) -> String {
    let mut s = String::from("[");
    for (i, m) in msgs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{{\"n\":{},\"fnv\":\"{:016x}\"", m.len(), fnv(m));
        if m.len() <= hex_max {
            s.push_str(",\"hex\":\"");
            for c in m {
                let _ = write!(s, "{:02x}", c);
            }
            s.push('"');
        }
        s.push('}');
    }
    s.push(']');
    s
}

fn headers_json(h: &HeaderMap) -> String {
    let mut s = String::from("[");
    for (i, (k, v)) in h.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(
            s,
            "[{},{}]",
            json_str(k.as_str()),
            json_str(&String::from_utf8_lossy(v.as_bytes()))
        );
    }
    s.push(']');
    s
}

fn json_str(v: &str) -> String {
    let mut s = String::from("\"");
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

fn b64(b: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for ch in b.chunks(3) {
        let n = (ch[0] as u32) << 16
            | (*ch.get(1).unwrap_or(&0) as u32) << 8
            | *ch.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= ch.len() {
                s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
    }
    s
}
