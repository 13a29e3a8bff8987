//! A lean HTTP/1.1 client for providers reached over plain HTTP (a model server
//! on the machine or the network: vLLM, Ollama, llama.cpp's server…).
//!
//! A call runs on the caller's task: it writes the request, waits for the
//! response with no buffer held (a run parked on a slow model costs its socket
//! and little else), and reads the body as it arrives. Connections are kept for
//! reuse (a streamed reply's connection too, when the end of its body arrives
//! after the reply's last event). A kept connection that the server had closed
//! (it fails at once, before any response) is replaced by a new one, once; a
//! request that may have reached the server is never sent again here. HTTPS,
//! proxied providers and URLs with credentials use the general client.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use reqwest::Url;
use reqwest::header::{HeaderName, HeaderValue};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Largest chunk-size or trailer line accepted.
const MAX_LINE: usize = 4 * 1024;
/// Bytes asked of the socket in one read.
const READ_SIZE: usize = 8 * 1024;
/// A kept connection idle for longer is closed rather than reused (servers
/// close theirs after a few seconds to a few minutes).
const KEEP_IDLE: Duration = Duration::from_secs(60);
/// A kept connection that fails before any response within this time of the
/// request being written was closed by the server before it read the request
/// (its idle timeout): the request goes again on a new connection. A failure
/// later may follow the server's work on it (a crash mid-reply), and is an error.
const STALE_WITHIN: Duration = Duration::from_millis(250);
/// Headers the client writes itself; configured ones would break the framing.
const OWN_HEADERS: [&str; 5] = ["host", "content-length", "transfer-encoding", "connection", "expect"];

/// Where a provider's requests go, and its kept connections.
pub struct Endpoint {
    host: String,
    port: u16,
    /// The request line and every header but the per-request ones, each line
    /// ended by CRLF.
    head: Vec<u8>,
    connect_timeout: Duration,
    /// Connections ready for the next request, the most recent last.
    idle: Mutex<Vec<Idle>>,
    max_idle: usize,
}

impl Endpoint {
    /// An endpoint for `url` (an `http://` URL), sending `headers` with every
    /// request. An invalid header name or value is an error here, not at the
    /// first request.
    pub fn new(
        url: &Url,
        headers: &[(&str, &str)],
        connect_timeout: Duration,
        max_idle: usize,
    ) -> Result<Arc<Self>, String> {
        if url.scheme() != "http" {
            return Err(format!("{url}: only http:// is served by this client"));
        }
        let Some(authority_host) = url.host_str().filter(|host| !host.is_empty()) else {
            return Err(format!("{url}: no host"));
        };
        // An IPv6 address is written in brackets in a URL, and without to connect.
        let host = authority_host.trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = url.port_or_known_default().unwrap_or(80);
        let mut target = url.path().to_owned();
        if let Some(query) = url.query() {
            target.push('?');
            target.push_str(query);
        }
        let authority = match url.port() {
            Some(port) => format!("{authority_host}:{port}"),
            None => authority_host.to_owned(),
        };
        let mut head = format!("POST {target} HTTP/1.1\r\nhost: {authority}\r\n").into_bytes();
        for (name, value) in headers {
            let valid = HeaderName::from_bytes(name.as_bytes()).is_ok() && HeaderValue::from_str(value).is_ok();
            if !valid {
                return Err(format!("the header {name:?} is not a valid HTTP header name and value"));
            }
            if OWN_HEADERS.iter().any(|own| name.eq_ignore_ascii_case(own)) {
                return Err(format!("the header {name:?} is written by the client and may not be configured"));
            }
            head.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        Ok(Arc::new(Self {
            host,
            port,
            head,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
            max_idle: max_idle.max(1),
        }))
    }

    /// Sends `body` (JSON) with `extra` headers (already valid) and reads the
    /// response head. The body is read from the returned [`Response`].
    pub async fn post(self: &Arc<Self>, extra: &[(&str, &str)], body: &Bytes) -> io::Result<Response> {
        let mut head = self.head.clone();
        for (name, value) in extra {
            head.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        head.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
        let head = Bytes::from(head);
        if let Some(stream) = self.take_idle() {
            match exchange(stream, &head, body).await {
                Ok(response) => return Ok(self.response(response)),
                Err(Failure { stale: true, error }) => {
                    // The server closed its idle connections (a timeout, a restart):
                    // the others kept are likely gone too.
                    tracing::debug!(%error, "a kept connection to the model server was closed; sending on a new one");
                    self.lock_idle().clear();
                }
                Err(Failure { error, .. }) => return Err(error),
            }
        }
        let stream = self.connect().await?;
        exchange(stream, &head, body).await.map(|response| self.response(response)).map_err(|failure| failure.error)
    }

    fn response(self: &Arc<Self>, (head, stream, buffer): (Head, TcpStream, BytesMut)) -> Response {
        let body = Body {
            stream: Some(stream),
            buffer,
            framing: head.framing,
            reusable: head.reusable,
            endpoint: self.clone(),
        };
        Response { status: head.status, retry_after: head.retry_after, body }
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The most recent kept connection still fit for a request, if any: not
    /// idle for too long, its body read to the end (if it was kept before its
    /// end had arrived), nothing unasked from the server.
    fn take_idle(&self) -> Option<TcpStream> {
        let mut idle = self.lock_idle();
        while let Some(Idle { stream, since, rest }) = idle.pop() {
            if since.elapsed() >= KEEP_IDLE {
                continue;
            }
            let finished = match rest {
                None => true,
                Some((mut buffer, mut framing)) => {
                    buffer.reserve(MAX_LINE);
                    let _ = stream.try_read_buf(&mut buffer);
                    skip_to_end(&mut buffer, &mut framing) && buffer.is_empty()
                }
            };
            if finished && quiet(&stream) {
                return Some(stream);
            }
        }
        None
    }

    /// Keeps `stream` for a later request; `rest` is what remains of a body whose
    /// end had not arrived yet (read when the connection is taken again).
    fn keep(&self, stream: TcpStream, rest: Option<(BytesMut, Framing)>) {
        let mut idle = self.lock_idle();
        // One reading of the clock for all of them: with many kept (one per
        // request in flight at the busiest) a reading each cost more than the rest.
        let now = Instant::now();
        idle.retain(|kept| now.saturating_duration_since(kept.since) < KEEP_IDLE);
        if idle.len() >= self.max_idle {
            idle.remove(0);
        }
        idle.push(Idle { stream, since: now, rest });
    }

    async fn connect(&self) -> io::Result<TcpStream> {
        let connecting = async {
            let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{} resolves to no address", self.host));
            for address in tokio::net::lookup_host((self.host.as_str(), self.port)).await? {
                match TcpStream::connect(address).await {
                    Ok(stream) => return Ok(stream),
                    Err(error) => last = error,
                }
            }
            Err(last)
        };
        let stream = match tokio::time::timeout(self.connect_timeout, connecting).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                return Err(io::Error::new(
                    error.kind(),
                    format!("cannot connect to {}:{}: {error}", self.host, self.port),
                ));
            }
            Err(_) => {
                let message = format!("connecting to {}:{} timed out", self.host, self.port);
                return Err(io::Error::new(io::ErrorKind::TimedOut, message));
            }
        };
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

/// A kept connection.
struct Idle {
    stream: TcpStream,
    since: Instant,
    /// The unread end of the last body, if it had not all arrived.
    rest: Option<(BytesMut, Framing)>,
}

/// Decodes and drops what `buffer` holds of a body; whether its end was reached.
fn skip_to_end(buffer: &mut BytesMut, framing: &mut Framing) -> bool {
    loop {
        match decode(buffer, framing) {
            Ok(Some(_)) => {}
            Ok(None) => return matches!(framing, Framing::Done),
            Err(_) => return false,
        }
    }
}

/// Whether a kept connection has nothing to say: the server neither closed it
/// nor sent anything unasked.
fn quiet(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(error) if error.kind() == io::ErrorKind::WouldBlock)
}

/// A failed exchange; `stale` when nothing of a response came back and nothing
/// says the server read the request (it had closed the connection).
struct Failure {
    error: io::Error,
    stale: bool,
}

/// Writes the request and reads the response head; the bytes after it begin
/// the body.
async fn exchange(mut stream: TcpStream, head: &Bytes, body: &Bytes) -> Result<(Head, TcpStream, BytesMut), Failure> {
    let mut request = head.clone().chain(body.clone());
    if let Err(error) = stream.write_all_buf(&mut request).await {
        return Err(Failure { error, stale: true });
    }
    let written = Instant::now();
    // Whether any byte of a response came back (an informational one counts: the
    // server has the request).
    let mut answered = false;
    let mut buffer = BytesMut::new();
    loop {
        if !buffer.is_empty() {
            match parse_head(&buffer) {
                Ok(Some((head, length))) => {
                    buffer.advance(length);
                    match head {
                        Some(head) => return Ok((head, stream, buffer)),
                        // An informational response (100 Continue, 103 Early Hints):
                        // the final one follows.
                        None => continue,
                    }
                }
                Ok(None) if buffer.len() > MAX_HEAD => {
                    return Err(Failure {
                        error: invalid(format!("a response head over {MAX_HEAD} bytes")),
                        stale: false,
                    });
                }
                Ok(None) => {}
                Err(error) => return Err(Failure { error, stale: false }),
            }
        }
        if buffer.is_empty() {
            // Nothing is held while the model thinks: the buffer is allocated when
            // the socket has something.
            buffer = BytesMut::new();
        }
        let stale = |answered: bool| !answered && written.elapsed() < STALE_WITHIN;
        if let Err(error) = stream.readable().await {
            return Err(Failure { error, stale: stale(answered) });
        }
        buffer.reserve(READ_SIZE);
        match stream.try_read_buf(&mut buffer) {
            Ok(0) => {
                let error = io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection before its response",
                );
                return Err(Failure { error, stale: stale(answered) });
            }
            Ok(_) => answered = true,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => {
                let stale = stale(answered) && error.kind() == io::ErrorKind::ConnectionReset;
                return Err(Failure { error, stale });
            }
        }
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// A final response's head.
struct Head {
    status: u16,
    retry_after: Option<String>,
    framing: Framing,
    /// The connection may carry another request once this body is read.
    reusable: bool,
}

/// The head at the start of `bytes` and its length, `None` inside for an
/// informational one; `Ok(None)` when it is not all there yet.
#[allow(clippy::type_complexity)]
fn parse_head(bytes: &[u8]) -> io::Result<Option<(Option<Head>, usize)>> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    let length = match response.parse(bytes) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(error) => return Err(invalid(format!("an invalid response head: {error}"))),
    };
    let status = response.code.unwrap_or_default();
    if status == 101 {
        return Err(invalid("a protocol switch (101) that was not asked for".to_owned()));
    }
    if (100..200).contains(&status) {
        return Ok(Some((None, length)));
    }
    let mut content_length = None;
    let mut chunked = false;
    let mut encoded = false;
    let mut close = response.version == Some(0);
    let mut retry_after = None;
    for header in response.headers.iter() {
        let value = std::str::from_utf8(header.value).unwrap_or_default().trim();
        if header.name.eq_ignore_ascii_case("content-length") {
            let length = digits(value, 10).ok_or_else(|| invalid(format!("an invalid content-length {value:?}")))?;
            if content_length.is_some_and(|known| known != length) {
                return Err(invalid("two different content-lengths".to_owned()));
            }
            content_length = Some(length);
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            encoded = true;
            chunked = value.rsplit(',').next().is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        } else if header.name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    close = true;
                } else if token.eq_ignore_ascii_case("keep-alive") && response.version == Some(0) {
                    close = false;
                }
            }
        } else if header.name.eq_ignore_ascii_case("retry-after") {
            retry_after = Some(value.to_owned());
        }
    }
    let framing = if status == 204 || status == 304 {
        Framing::Length(0)
    } else if chunked {
        Framing::Chunked(Chunk::Size)
    } else if encoded {
        return Err(invalid("a transfer coding other than chunked last".to_owned()));
    } else if let Some(length) = content_length {
        Framing::Length(length)
    } else {
        Framing::UntilClose
    };
    // Both a length and chunked (RFC 9112 6.3): read as chunked, never reused.
    let ambiguous = encoded && content_length.is_some();
    let reusable = !close && !ambiguous && !matches!(framing, Framing::UntilClose);
    Ok(Some((Some(Head { status, retry_after, framing, reusable }), length)))
}

/// `text` as a number in `radix`: its digits only (no sign, no space inside).
fn digits(text: &str, radix: u32) -> Option<u64> {
    let all_digits = !text.is_empty() && text.chars().all(|c| c.is_digit(radix));
    all_digits.then(|| u64::from_str_radix(text, radix).ok()).flatten()
}

/// A response: its status, its `Retry-After`, and its body to read.
pub struct Response {
    pub status: u16,
    pub retry_after: Option<String>,
    pub body: Body,
}

/// How a body ends.
enum Framing {
    /// After this many more bytes.
    Length(u64),
    /// At its last chunk.
    Chunked(Chunk),
    /// When the server closes the connection.
    UntilClose,
    Done,
}

/// Where a chunked body is.
enum Chunk {
    /// At a chunk's size line.
    Size,
    /// Inside a chunk's data, with this much to go.
    Data(u64),
    /// At the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one.
    Trailers,
}

/// A response body, read as it arrives. Once read to its end the connection is
/// kept for reuse; dropped before, it is closed.
pub struct Body {
    stream: Option<TcpStream>,
    /// Bytes read and not yet decoded.
    buffer: BytesMut,
    framing: Framing,
    reusable: bool,
    endpoint: Arc<Endpoint>,
}

impl Body {
    /// The next piece of the body; `None` at its end.
    pub async fn next(&mut self) -> Option<io::Result<Bytes>> {
        loop {
            match decode(&mut self.buffer, &mut self.framing) {
                Ok(Some(piece)) => return Some(Ok(piece)),
                Ok(None) if matches!(self.framing, Framing::Done) => {
                    self.give_back();
                    return None;
                }
                Ok(None) => {}
                Err(error) => return Some(Err(self.fail(error))),
            }
            if let Err(error) = self.read().await {
                return Some(Err(self.fail(error)));
            }
        }
    }

    /// Ends the body without waiting: what has arrived is decoded and dropped.
    /// The connection is kept if the body is whole, or if its end may yet come
    /// (then it is read when the connection is taken again: a streamed reply's
    /// server often writes the body's last chunk after the reply's last event).
    pub fn finish_now(mut self) {
        let Some(stream) = self.stream.take() else { return };
        self.buffer.reserve(MAX_LINE);
        let _ = stream.try_read_buf(&mut self.buffer);
        let whole = skip_to_end(&mut self.buffer, &mut self.framing);
        if !self.reusable {
            return;
        }
        if whole {
            if self.buffer.is_empty() {
                self.endpoint.keep(stream, None);
            }
        } else if matches!(self.framing, Framing::Chunked(_) | Framing::Length(_)) {
            let rest = std::mem::take(&mut self.buffer);
            let framing = std::mem::replace(&mut self.framing, Framing::Done);
            self.endpoint.keep(stream, Some((rest, framing)));
        }
    }

    /// Reads what the socket has into the buffer, waiting for it.
    async fn read(&mut self) -> io::Result<()> {
        let Some(stream) = &self.stream else {
            return Err(io::Error::new(io::ErrorKind::NotConnected, "the body has failed"));
        };
        if self.buffer.is_empty() {
            // Nothing is held while the model thinks.
            self.buffer = BytesMut::new();
        }
        stream.readable().await?;
        self.buffer.reserve(READ_SIZE);
        match stream.try_read_buf(&mut self.buffer) {
            Ok(0) if matches!(self.framing, Framing::UntilClose) => {
                self.framing = Framing::Done;
                Ok(())
            }
            Ok(0) => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the server closed the connection mid-body")),
            Ok(_) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(error) => Err(error),
        }
    }

    fn fail(&mut self, error: io::Error) -> io::Error {
        self.stream = None;
        self.buffer = BytesMut::new();
        error
    }

    /// The body is over: its connection is kept if it can carry another request
    /// (nothing unasked came after the body).
    fn give_back(&mut self) {
        if let Some(stream) = self.stream.take()
            && self.reusable
            && self.buffer.is_empty()
        {
            self.endpoint.keep(stream, None);
        }
        self.buffer = BytesMut::new();
    }
}

/// The next decoded piece of a body in `buffer`; `None` when more must be read
/// or the body is over (`framing` is then `Done`).
fn decode(buffer: &mut BytesMut, framing: &mut Framing) -> io::Result<Option<Bytes>> {
    loop {
        match framing {
            Framing::Done => return Ok(None),
            Framing::Length(0) => *framing = Framing::Done,
            Framing::Length(rest) => return Ok(take(buffer, rest)),
            Framing::UntilClose => return Ok((!buffer.is_empty()).then(|| buffer.split().freeze())),
            Framing::Chunked(Chunk::Data(rest)) => {
                let piece = take(buffer, rest);
                if *rest == 0 {
                    *framing = Framing::Chunked(Chunk::DataEnd);
                }
                return Ok(piece);
            }
            Framing::Chunked(Chunk::DataEnd) => {
                if buffer.len() < 2 {
                    return Ok(None);
                }
                if &buffer[..2] != b"\r\n" {
                    return Err(invalid("a chunk longer than its size".to_owned()));
                }
                buffer.advance(2);
                *framing = Framing::Chunked(Chunk::Size);
            }
            Framing::Chunked(Chunk::Size) => {
                let Some(line) = line(buffer)? else { return Ok(None) };
                let size = line.split(|byte| *byte == b';').next().unwrap_or_default().trim_ascii();
                let size = std::str::from_utf8(size)
                    .ok()
                    .and_then(|size| digits(size, 16))
                    .ok_or_else(|| invalid(format!("an invalid chunk size {:?}", String::from_utf8_lossy(size))))?;
                *framing = Framing::Chunked(if size == 0 { Chunk::Trailers } else { Chunk::Data(size) });
            }
            Framing::Chunked(Chunk::Trailers) => {
                let Some(line) = line(buffer)? else { return Ok(None) };
                if line.is_empty() {
                    *framing = Framing::Done;
                }
            }
        }
    }
}

/// Up to `rest` bytes off the front of `buffer`.
fn take(buffer: &mut BytesMut, rest: &mut u64) -> Option<Bytes> {
    if buffer.is_empty() {
        return None;
    }
    let length = usize::try_from(*rest).unwrap_or(usize::MAX).min(buffer.len());
    *rest -= length as u64;
    Some(buffer.split_to(length).freeze())
}

/// A CRLF-ended line off the front of `buffer`, without its CRLF.
fn line(buffer: &mut BytesMut) -> io::Result<Option<Bytes>> {
    match memchr::memmem::find(buffer, b"\r\n") {
        Some(end) => {
            let line = buffer.split_to(end).freeze();
            buffer.advance(2);
            Ok(Some(line))
        }
        None if buffer.len() > MAX_LINE => Err(invalid(format!("a chunk line over {MAX_LINE} bytes"))),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// What the test server does after reading a request.
    #[derive(Clone, Copy)]
    enum Step {
        Send(&'static [u8]),
        Pause(u64),
        /// Closes the connection; the next response goes to a new one.
        Close,
    }
    use Step::{Close, Pause, Send};

    /// A server that answers each request with the next of `responses`, on the
    /// same connection until one closes it; it returns the connections it took.
    async fn server(responses: Vec<Vec<Step>>) -> (Arc<Endpoint>, tokio::task::JoinHandle<usize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}/v1/chat/completions", listener.local_addr().unwrap())).unwrap();
        let endpoint = Endpoint::new(&url, &[("authorization", "Bearer k")], Duration::from_secs(5), 4).unwrap();
        let task = tokio::spawn(async move {
            let mut responses = responses.into_iter().peekable();
            let mut connections = 0;
            while responses.peek().is_some() {
                let (mut socket, _) = listener.accept().await.unwrap();
                connections += 1;
                'requests: for response in responses.by_ref() {
                    if !read_request(&mut socket).await {
                        break;
                    }
                    for step in response {
                        match step {
                            Send(bytes) => {
                                socket.write_all(bytes).await.unwrap();
                                socket.flush().await.unwrap();
                                tokio::task::yield_now().await;
                            }
                            Pause(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                            Close => break 'requests,
                        }
                    }
                }
            }
            connections
        });
        (endpoint, task)
    }

    /// Reads one request (head and content-length body); false if the client
    /// closed the connection instead.
    async fn read_request(socket: &mut TcpStream) -> bool {
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 1024];
        loop {
            if let Some(end) = bytes.windows(4).position(|window| window == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&bytes[..end]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length: "))
                    .and_then(|value| value.parse().ok())
                    .unwrap_or(0);
                if bytes.len() >= end + 4 + length {
                    return true;
                }
            }
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(read) => bytes.extend_from_slice(&chunk[..read]),
            }
        }
    }

    async fn body_of(response: &mut Response) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        while let Some(piece) = response.body.next().await {
            bytes.extend_from_slice(&piece?);
        }
        Ok(bytes)
    }

    fn json() -> Bytes {
        Bytes::from_static(b"{}")
    }

    #[tokio::test]
    async fn a_chunked_body_in_pieces_is_decoded_and_the_connection_reused() {
        let (endpoint, server) = server(vec![
            vec![
                Send(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel"),
                Send(b"lo\r\n"),
                Send(b"6;ext=1\r"),
                Send(b"\n world\r\n0\r\ntrailer: x\r\n"),
                Send(b"\r\n"),
            ],
            vec![Send(b"HTTP/1.1 429 Too Many\r\nContent-Length: 2\r\nRetry-After: 3\r\n\r\n{}")],
        ])
        .await;
        let mut response = endpoint.post(&[], &json()).await.unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(body_of(&mut response).await.unwrap(), b"hello world");
        let mut response = endpoint.post(&[("traceparent", "00-a-b-01")], &json()).await.unwrap();
        assert_eq!((response.status, response.retry_after.as_deref()), (429, Some("3")));
        assert_eq!(body_of(&mut response).await.unwrap(), b"{}");
        assert_eq!(server.await.unwrap(), 1, "both requests went over one connection");
    }

    /// Every split of a chunked body decodes to the same bytes.
    #[test]
    fn a_chunked_body_fed_a_byte_at_a_time_decodes_whole() {
        let wire = b"5\r\nhello\r\n1;name=value\r\n \r\n5\r\nworld\r\n0\r\nx-trailer: 1\r\n\r\n";
        let mut buffer = BytesMut::new();
        let mut framing = Framing::Chunked(Chunk::Size);
        let mut body = Vec::new();
        for byte in wire {
            buffer.extend_from_slice(&[*byte]);
            while let Some(piece) = decode(&mut buffer, &mut framing).unwrap() {
                body.extend_from_slice(&piece);
            }
        }
        assert_eq!(body, b"hello world");
        assert!(matches!(framing, Framing::Done) && buffer.is_empty());
        for bad in [&b"+5\r\nhello\r\n"[..], b"5\r\nhello!!", b"zz\r\n"] {
            let mut framing = Framing::Chunked(Chunk::Size);
            let mut buffer = BytesMut::from(bad);
            let decoded = std::iter::from_fn(|| decode(&mut buffer, &mut framing).transpose()).find(Result::is_err);
            assert!(decoded.is_some(), "{:?} is refused", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn ambiguous_or_unreadable_heads_are_refused_or_not_reused() {
        let head = |text: &str| parse_head(text.as_bytes()).map(|parsed| parsed.and_then(|(head, _)| head));
        let both = head("HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n").unwrap().unwrap();
        assert!(matches!(both.framing, Framing::Chunked(_)) && !both.reusable);
        assert!(head("HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\n").is_err());
        assert!(head("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n").is_err());
        assert!(head("HTTP/1.1 101 Switching Protocols\r\n\r\n").is_err());
        let closing = head("HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").unwrap().unwrap();
        assert!(!closing.reusable);
        let kept = head("HTTP/1.0 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n").unwrap().unwrap();
        assert!(kept.reusable);
    }

    #[tokio::test]
    async fn a_kept_connection_the_server_closed_is_replaced_and_a_cut_body_is_an_error() {
        let (endpoint, server) = server(vec![
            vec![Send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"), Close],
            vec![Send(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\ncut"), Close],
        ])
        .await;
        let mut response = endpoint.post(&[], &json()).await.unwrap();
        assert_eq!(body_of(&mut response).await.unwrap(), b"ok");
        // The server closed the kept connection; the request goes on a new one.
        let mut response = endpoint.post(&[], &json()).await.unwrap();
        let error = body_of(&mut response).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(server.await.unwrap(), 2);
        assert!(endpoint.take_idle().is_none(), "a failed body's connection is not kept");
    }

    /// A server that had the request for a while and then closed may have done
    /// its work: the request is not sent again.
    #[tokio::test]
    async fn a_request_the_server_may_have_worked_on_is_not_sent_again() {
        let (endpoint, server) = server(vec![
            vec![Send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")],
            vec![Pause(400), Close],
            vec![Send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")],
        ])
        .await;
        let mut response = endpoint.post(&[], &json()).await.unwrap();
        assert_eq!(body_of(&mut response).await.unwrap(), b"ok");
        let error = endpoint.post(&[], &json()).await.err().unwrap();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        // A later call opens a new connection (the server's third answer).
        let mut response = endpoint.post(&[], &json()).await.unwrap();
        assert_eq!(body_of(&mut response).await.unwrap(), b"ok");
        assert_eq!(server.await.unwrap(), 2, "the second request went once, on the kept connection");
    }

    /// A streamed reply ends before its body does; its connection is kept and
    /// reused once the body's last chunk has come.
    #[tokio::test]
    async fn a_body_ended_early_keeps_its_connection_for_the_end_to_arrive() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}/v1/chat/completions", listener.local_addr().unwrap())).unwrap();
        let endpoint = Endpoint::new(&url, &[], Duration::from_secs(5), 4).unwrap();
        let (ended, end) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            assert!(read_request(&mut socket).await);
            socket.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\ndone\r\n").await.unwrap();
            // The body's last chunk only once the client has let the body go.
            end.await.unwrap();
            socket.write_all(b"0\r\n\r\n").await.unwrap();
            assert!(read_request(&mut socket).await, "the next request came on this connection");
            socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.unwrap();
        });
        let mut response = endpoint.post(&[], &json()).await.unwrap();
        assert_eq!(&response.body.next().await.unwrap().unwrap()[..], b"done");
        response.body.finish_now();
        let kept = endpoint.lock_idle().pop().expect("the connection is kept before its body ended");
        assert!(kept.rest.is_some());
        ended.send(()).unwrap();
        kept.stream.readable().await.unwrap();
        endpoint.lock_idle().push(kept);
        let mut response = endpoint.post(&[], &json()).await.unwrap();
        assert_eq!(body_of(&mut response).await.unwrap(), b"ok");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_body_until_close_and_invalid_heads_are_read_as_such() {
        let (endpoint, server) = server(vec![
            vec![Send(b"HTTP/1.0 200 OK\r\n\r\nall of it"), Close],
            vec![Send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"), Close],
            vec![Send(b"not http at all\r\n\r\n"), Close],
        ])
        .await;
        let mut response = endpoint.post(&[], &json()).await.unwrap();
        assert_eq!(body_of(&mut response).await.unwrap(), b"all of it");
        let mut response = endpoint.post(&[], &json()).await.unwrap();
        let error = body_of(&mut response).await.unwrap_err();
        assert!(error.to_string().contains("invalid chunk size"), "{error}");
        let error = endpoint.post(&[], &json()).await.err().unwrap();
        assert!(error.to_string().contains("invalid response head"), "{error}");
        assert_eq!(server.await.unwrap(), 3);
    }

    #[test]
    fn invalid_or_framing_headers_are_refused_when_the_endpoint_is_made() {
        let url = Url::parse("http://127.0.0.1:9/v1/chat/completions").unwrap();
        for (name, value) in [("bad name", "v"), ("x-ok", "line\r\nbreak"), ("Content-Length", "5"), ("host", "x")] {
            let error = Endpoint::new(&url, &[(name, value)], Duration::from_secs(1), 1).err().unwrap();
            assert!(error.contains(name), "{error}");
        }
    }
}
