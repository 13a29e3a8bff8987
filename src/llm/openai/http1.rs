//! A lean HTTP/1.1 client for providers reached over plain HTTP (a model server
//! on the machine or the network: vLLM, Ollama, llama.cpp's server…).
//!
//! A call runs on the caller's task: it writes the request, waits for the
//! response with no buffer held (a run parked on a slow model costs its socket
//! and little else), and reads the body as it arrives. Connections are kept for
//! reuse; a kept one that the server has closed meanwhile is replaced once, at
//! no cost to the caller. HTTPS and proxied providers use the general client.

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

/// Where a provider's requests go, and its kept connections.
pub struct Endpoint {
    host: String,
    port: u16,
    /// The request line and every header but the per-request ones, each line
    /// ended by CRLF.
    head: Vec<u8>,
    connect_timeout: Duration,
    /// Connections ready for the next request, the most recent last.
    idle: Mutex<Vec<(TcpStream, Instant)>>,
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
        // A kept connection the server closed meanwhile fails before any byte of
        // the response: the request goes once more, on a new connection.
        while let Some(stream) = self.take_idle() {
            match exchange(stream, &head, body).await {
                Ok(response) => return Ok(self.response(response)),
                Err(Failure { stale: true, .. }) => continue,
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

    /// The most recent kept connection still fit for a request, if any.
    fn take_idle(&self) -> Option<TcpStream> {
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while let Some((stream, since)) = idle.pop() {
            if since.elapsed() < KEEP_IDLE && quiet(&stream) {
                return Some(stream);
            }
        }
        None
    }

    fn keep(&self, stream: TcpStream) {
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if idle.len() >= self.max_idle {
            idle.remove(0);
        }
        idle.push((stream, Instant::now()));
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
        // Nothing is held while the model thinks: the buffer is allocated when
        // the socket has something.
        let nothing_yet = buffer.is_empty();
        if let Err(error) = stream.readable().await {
            return Err(Failure { error, stale: nothing_yet });
        }
        buffer.reserve(READ_SIZE);
        match stream.try_read_buf(&mut buffer) {
            Ok(0) => {
                let error = io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection before its response",
                );
                return Err(Failure { error, stale: nothing_yet });
            }
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => {
                let stale = nothing_yet && error.kind() == io::ErrorKind::ConnectionReset;
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
            let length: u64 = value.parse().map_err(|_| invalid(format!("an invalid content-length {value:?}")))?;
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
        // Another transfer coding last: the body runs to the connection's end.
        Framing::UntilClose
    } else if let Some(length) = content_length {
        Framing::Length(length)
    } else {
        Framing::UntilClose
    };
    let reusable = !close && !matches!(framing, Framing::UntilClose);
    Ok(Some((Some(Head { status, retry_after, framing, reusable }), length)))
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
            match self.decode() {
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

    /// Ends the body without waiting: what has arrived is decoded, and if that
    /// was the whole body the connection is kept; otherwise it is closed.
    pub fn finish_now(mut self) {
        if let Some(stream) = &self.stream {
            self.buffer.reserve(MAX_LINE);
            let _ = stream.try_read_buf(&mut self.buffer);
        }
        while let Ok(Some(_)) = self.decode() {}
        if matches!(self.framing, Framing::Done) {
            self.give_back();
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

    /// The next decoded piece in the buffer; `None` when more must be read or
    /// the body is over.
    fn decode(&mut self) -> io::Result<Option<Bytes>> {
        loop {
            let buffer = &mut self.buffer;
            match &mut self.framing {
                Framing::Done => return Ok(None),
                Framing::Length(0) => self.framing = Framing::Done,
                Framing::Length(rest) => return Ok(take(buffer, rest)),
                Framing::UntilClose => return Ok((!buffer.is_empty()).then(|| buffer.split().freeze())),
                Framing::Chunked(Chunk::Data(rest)) => {
                    let piece = take(buffer, rest);
                    if *rest == 0 {
                        self.framing = Framing::Chunked(Chunk::DataEnd);
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
                    self.framing = Framing::Chunked(Chunk::Size);
                }
                Framing::Chunked(Chunk::Size) => {
                    let Some(line) = line(buffer)? else { return Ok(None) };
                    let digits = line.split(|byte| *byte == b';').next().unwrap_or_default().trim_ascii();
                    let size = std::str::from_utf8(digits)
                        .ok()
                        .and_then(|digits| u64::from_str_radix(digits, 16).ok())
                        .ok_or_else(|| {
                            invalid(format!("an invalid chunk size {:?}", String::from_utf8_lossy(digits)))
                        })?;
                    self.framing = Framing::Chunked(if size == 0 { Chunk::Trailers } else { Chunk::Data(size) });
                }
                Framing::Chunked(Chunk::Trailers) => {
                    let Some(line) = line(buffer)? else { return Ok(None) };
                    if line.is_empty() {
                        self.framing = Framing::Done;
                    }
                }
            }
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
            self.endpoint.keep(stream);
        }
        self.buffer = BytesMut::new();
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

    /// A server that answers each request on each connection with the next of
    /// `responses` (raw bytes, each written in the pieces given), then closes
    /// the connection if the piece list ends with `None`.
    async fn server(responses: Vec<Vec<Option<&'static [u8]>>>) -> (Arc<Endpoint>, tokio::task::JoinHandle<usize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}/v1/chat/completions", listener.local_addr().unwrap())).unwrap();
        let endpoint = Endpoint::new(&url, &[("authorization", "Bearer k")], Duration::from_secs(5), 4).unwrap();
        let task = tokio::spawn(async move {
            let mut responses = responses.into_iter();
            let mut connections = 0;
            'connections: while let Some(mut response) = responses.next() {
                let (mut socket, _) = listener.accept().await.unwrap();
                connections += 1;
                loop {
                    read_request(&mut socket).await;
                    for piece in &response {
                        match piece {
                            Some(bytes) => {
                                socket.write_all(bytes).await.unwrap();
                                socket.flush().await.unwrap();
                                tokio::task::yield_now().await;
                            }
                            None => continue 'connections,
                        }
                    }
                    match responses.next() {
                        Some(next) => response = next,
                        None => break 'connections,
                    }
                }
            }
            connections
        });
        (endpoint, task)
    }

    /// Reads one request (head and content-length body).
    async fn read_request(socket: &mut TcpStream) -> Vec<u8> {
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
                    return bytes;
                }
            }
            let read = socket.read(&mut chunk).await.unwrap();
            assert!(read > 0, "the client closed mid-request");
            bytes.extend_from_slice(&chunk[..read]);
        }
    }

    async fn body_of(response: &mut Response) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        while let Some(piece) = response.body.next().await {
            bytes.extend_from_slice(&piece?);
        }
        Ok(bytes)
    }

    #[tokio::test]
    async fn a_chunked_body_split_anywhere_is_decoded_and_the_connection_reused() {
        let chunked: &[&[u8]] = &[
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
            b"lo\r\n",
            b"6;ext=1\r",
            b"\n world\r\n0\r\ntrailer: x\r\n",
            b"\r\n",
        ];
        let length: &[&[u8]] = &[b"HTTP/1.1 429 Too Many\r\nContent-Length: 2\r\nRetry-After: 3\r\n\r\n{}"];
        let (endpoint, server) = server(vec![
            chunked.iter().map(|piece| Some(*piece)).collect(),
            length.iter().map(|piece| Some(*piece)).collect(),
        ])
        .await;
        let mut response = endpoint.post(&[], &Bytes::from_static(b"{}")).await.unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(body_of(&mut response).await.unwrap(), b"hello world");
        let mut response = endpoint.post(&[("traceparent", "00-a-b-01")], &Bytes::from_static(b"{}")).await.unwrap();
        assert_eq!((response.status, response.retry_after.as_deref()), (429, Some("3")));
        assert_eq!(body_of(&mut response).await.unwrap(), b"{}");
        assert_eq!(server.await.unwrap(), 1, "both requests went over one connection");
    }

    #[tokio::test]
    async fn a_kept_connection_the_server_closed_is_replaced_and_a_cut_body_is_an_error() {
        let (endpoint, server) = server(vec![
            vec![Some(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"), None],
            vec![Some(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\ncut"), None],
        ])
        .await;
        let mut response = endpoint.post(&[], &Bytes::from_static(b"{}")).await.unwrap();
        assert_eq!(body_of(&mut response).await.unwrap(), b"ok");
        // The server closed the kept connection; the request goes on a new one.
        let mut response = endpoint.post(&[], &Bytes::from_static(b"{}")).await.unwrap();
        let error = body_of(&mut response).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(server.await.unwrap(), 2);
        assert!(endpoint.take_idle().is_none(), "a failed body's connection is not kept");
    }

    #[tokio::test]
    async fn a_body_until_close_and_invalid_heads_are_read_as_such() {
        let (endpoint, server) = server(vec![
            vec![Some(b"HTTP/1.0 200 OK\r\n\r\nall of it"), None],
            vec![Some(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"), None],
            vec![Some(b"not http at all\r\n\r\n"), None],
        ])
        .await;
        let mut response = endpoint.post(&[], &Bytes::from_static(b"{}")).await.unwrap();
        assert_eq!(body_of(&mut response).await.unwrap(), b"all of it");
        let mut response = endpoint.post(&[], &Bytes::from_static(b"{}")).await.unwrap();
        let error = body_of(&mut response).await.unwrap_err();
        assert!(error.to_string().contains("invalid chunk size"), "{error}");
        let error = endpoint.post(&[], &Bytes::from_static(b"{}")).await.err().unwrap();
        assert!(error.to_string().contains("invalid response head"), "{error}");
        assert_eq!(server.await.unwrap(), 3);
    }

    #[test]
    fn invalid_headers_are_refused_when_the_endpoint_is_made() {
        let url = Url::parse("http://127.0.0.1:9/v1/chat/completions").unwrap();
        for (name, value) in [("bad name", "v"), ("x-ok", "line\r\nbreak")] {
            let error = Endpoint::new(&url, &[(name, value)], Duration::from_secs(1), 1).err().unwrap();
            assert!(error.contains(name), "{error}");
        }
    }
}
