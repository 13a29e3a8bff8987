//! `fake-openai`: the fake OpenAI-compatible server as a process, for benchmarks
//! and manual runs. Every request gets the same streamed text reply.
//!
//! `fake-openai [--port 8089] [--text "..."] [--reply-bytes N] [--pieces 4] [--delay-ms 0] [--script FILE]`
//!
//! `--reply-bytes` replaces the text by one of about `N` bytes (words of filler),
//! for replies too large for a command line; `--pieces` is the number of content
//! deltas the text is streamed in. `--script` serves the reply in a JSON file
//! instead (a `FakeReply`, e.g. `{"kind": "per_turn", "replies": [...]}` or
//! `{"kind": "hang"}`). `GET /stats` counts the requests received.

use std::net::SocketAddr;

use troupe::testing::fake_openai::{FakeOpenAi, FakeReply, text_stream};

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let mut port = 8089u16;
    let mut text = "This is the fake model's answer.".to_owned();
    let mut delay_ms = 0u64;
    let mut pieces = 4usize;
    let mut script = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().unwrap_or_default();
        match arg.as_str() {
            "--port" => port = value.parse().unwrap_or(port),
            "--text" => text = value,
            "--reply-bytes" => text = filler(value.parse().unwrap_or(0)),
            "--pieces" => pieces = value.parse().unwrap_or(pieces).max(1),
            "--delay-ms" => delay_ms = value.parse().unwrap_or(0),
            "--script" => script = Some(read_script(&value)),
            other => {
                eprintln!(
                    "fake-openai: unknown option {other}; options: --port, --text, --reply-bytes, --pieces, --delay-ms, --script"
                );
                std::process::exit(2);
            }
        }
    }
    let reply = match script {
        Some(reply) => reply,
        None => match text_stream(&text, pieces) {
            FakeReply::Stream { chunks, done, .. } => FakeReply::Stream { chunks, delay_ms, done },
            other => other,
        },
    };
    let server = FakeOpenAi::start_on(SocketAddr::from(([127, 0, 0, 1], port)), Vec::new(), Some(reply)).await?;
    println!("fake-openai serving {}", server.base_url());
    server.serve_forever().await;
    Ok(())
}

/// The reply in the JSON file at `path`; exits with a message if it is none.
fn read_script(path: &str) -> FakeReply {
    let parsed = std::fs::read_to_string(path)
        .map_err(|error| error.to_string())
        .and_then(|text| serde_json::from_str(&text).map_err(|error| error.to_string()));
    parsed.unwrap_or_else(|error| {
        eprintln!("fake-openai: --script {path}: {error}");
        std::process::exit(2);
    })
}

/// About `bytes` bytes of words, each followed by a space.
fn filler(bytes: usize) -> String {
    const WORDS: [&str; 8] = ["alpha ", "bravo ", "charlie ", "delta ", "echo ", "foxtrot ", "golf ", "hotel "];
    let mut text = String::with_capacity(bytes + 8);
    for word in WORDS.iter().cycle() {
        if text.len() >= bytes {
            break;
        }
        text.push_str(word);
    }
    text
}
