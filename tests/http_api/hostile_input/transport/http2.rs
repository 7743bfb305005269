//! HTTP/2 clients that open streams and send nothing: the connection's
//! stream bound and per-stream time limit end them.

use super::*;

/// One HTTP/2 frame: type, flags, stream and payload.
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn read_frame(stream: &mut TcpStream) -> Option<Frame> {
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).ok()?;
    let length = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; length];
    stream.read_exact(&mut payload).ok()?;
    Some(Frame {
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
        payload,
    })
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len())
        .expect("small frame")
        .to_be_bytes();
    let mut out = vec![length[1], length[2], length[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// HPACK "literal without indexing" with a name from the static table, no
/// Huffman coding: all a hand-written request needs.
fn literal(name_index: u8, value: &str) -> Vec<u8> {
    let mut out = vec![name_index, u8::try_from(value.len()).expect("short value")];
    out.extend_from_slice(value.as_bytes());
    out
}

/// HTTP/2: the server announces a bound on the requests one connection may
/// have open, and a request whose body never comes is ended by the server
/// (the body read timeout, as on HTTP/1.1), not left open for as long as
/// the connection is busy with others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_bounds_streams_per_connection_and_ends_a_stream_that_sends_nothing() {
    const SETTINGS: u8 = 0x4;
    const HEADERS: u8 = 0x1;
    const RST_STREAM: u8 = 0x3;
    const END_STREAM: u8 = 0x1;
    let server = live(Duration::from_secs(2)).await;
    let addr = server.addr;
    let (max_streams, ended_after) = tokio::task::spawn_blocking(move || {
        let mut h2 = TcpStream::connect(addr).expect("connect");
        h2.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        h2.write_all(H2_PREFACE).expect("preface");
        let settings = loop {
            let f = read_frame(&mut h2).expect("the server's SETTINGS");
            if f.kind == SETTINGS && f.flags & 0x1 == 0 {
                break f.payload;
            }
        };
        let max_streams = settings.chunks(6).find_map(|entry| {
            (entry[..2] == [0, 3])
                .then(|| u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]))
        });
        h2.write_all(&frame(SETTINGS, 0x1, 0, &[])).expect("ack");
        // POST /v1/receipts as JSON, END_HEADERS but not END_STREAM: a body
        // is promised and never sent.
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
        block.extend(literal(0x04, "/v1/receipts"));
        block.extend(literal(0x01, "127.0.0.1"));
        block.extend([0x0f, 0x10, 16]); // content-type (index 31)
        block.extend_from_slice(b"application/json");
        h2.write_all(&frame(HEADERS, 0x4, 1, &block))
            .expect("headers");
        let sent = Instant::now();
        loop {
            let Some(f) = read_frame(&mut h2) else {
                // The server closing the connection ends the stream too.
                break (max_streams, sent.elapsed());
            };
            if f.stream == 1 && (f.kind == RST_STREAM || f.flags & END_STREAM != 0) {
                break (max_streams, sent.elapsed());
            }
        }
    })
    .await
    .expect("client");
    assert_eq!(max_streams, Some(settled::server::H2_MAX_STREAMS));
    assert!(
        ended_after >= Duration::from_secs(9) && ended_after < Duration::from_secs(25),
        "the stream that sent nothing ended after {ended_after:?} (body read timeout: 10 s)"
    );
    server.stop().await;
}
