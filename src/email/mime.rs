//! Just enough RFC 5322 / MIME to read an mbox: headers (folded lines, RFC 2047
//! encoded words), multipart bodies (the first `text/plain` part, else the first
//! `text/html` part with its tags removed), quoted-printable and base64. Charsets
//! other than UTF-8 are read as UTF-8, lossily.

/// A parsed message: its headers in order and its raw body.
pub struct Message {
    headers: Vec<(String, String)>,
    body: String,
}

impl Message {
    /// The first header called `name` (any case), unfolded.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }

    /// The readable text of the body.
    pub fn text_body(&self) -> String {
        let content_type = self.header("content-type").unwrap_or("text/plain");
        let encoding = self.header("content-transfer-encoding").unwrap_or("7bit");
        if content_type.to_ascii_lowercase().starts_with("multipart/") {
            let Some(boundary) = parameter(content_type, "boundary") else { return self.body.clone() };
            let parts: Vec<Message> = split_multipart(&self.body, &boundary).into_iter().map(parse_message).collect();
            let pick = |kind: &str| {
                parts.iter().find(|part| {
                    part.header("content-type").unwrap_or("text/plain").to_ascii_lowercase().starts_with(kind)
                })
            };
            if let Some(part) = pick("text/plain").or_else(|| pick("multipart/")) {
                return part.text_body();
            }
            return pick("text/html").map(|part| strip_tags(&part.text_body())).unwrap_or_default();
        }
        let decoded = decode_transfer(&self.body, encoding);
        if content_type.to_ascii_lowercase().starts_with("text/html") { strip_tags(&decoded) } else { decoded }
    }
}

/// Splits a message into its headers and body.
pub fn parse_message(raw: &str) -> Message {
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut lines = raw.split_inclusive('\n');
    let mut consumed = 0;
    for line in lines.by_ref() {
        consumed += line.len();
        let trimmed = line.trim_end_matches(['\r', '\n']);
        if trimmed.is_empty() {
            break;
        }
        if trimmed.starts_with([' ', '\t']) {
            if let Some((_, value)) = headers.last_mut() {
                value.push(' ');
                value.push_str(trimmed.trim());
            }
        } else if let Some((name, value)) = trimmed.split_once(':') {
            headers.push((name.trim().to_owned(), value.trim().to_owned()));
        }
    }
    Message { headers, body: raw[consumed.min(raw.len())..].replace("\r\n", "\n") }
}

/// `<id@host>` → `id@host`.
pub fn strip_brackets(id: &str) -> &str {
    id.trim().trim_start_matches('<').trim_end_matches('>')
}

/// The Message-IDs of a `References` or `In-Reply-To` header, in order.
pub fn message_ids(value: &str) -> Vec<String> {
    value
        .split(|c: char| c.is_whitespace() || c == ',')
        .map(strip_brackets)
        .filter(|id| id.contains('@'))
        .map(str::to_owned)
        .collect()
}

/// A header value with its RFC 2047 encoded words (`=?UTF-8?B?…?=`) decoded.
pub fn decode_words(value: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    let mut after_word = false;
    while let Some(start) = rest.find("=?") {
        let word = &rest[start + 2..];
        let decoded = word.split_once('?').and_then(|(_charset, tail)| {
            let (kind, tail) = tail.split_once('?')?;
            let end = tail.find("?=")?;
            let text = &tail[..end];
            let bytes = match kind.to_ascii_uppercase().as_str() {
                "B" => base64(text),
                "Q" => quoted_printable(&text.replace('_', " ")),
                _ => return None,
            };
            Some((String::from_utf8_lossy(&bytes).into_owned(), start + 2 + (word.len() - tail.len()) + end + 2))
        });
        match decoded {
            Some((text, consumed)) => {
                // Whitespace between two encoded words is not part of the text.
                if !(after_word && rest[..start].trim().is_empty()) {
                    out.push_str(&rest[..start]);
                }
                out.push_str(&text);
                rest = &rest[consumed..];
                after_word = true;
            }
            None => {
                out.push_str(&rest[..start + 2]);
                rest = &rest[start + 2..];
                after_word = false;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The value of `name=` in a header such as `multipart/mixed; boundary="x"`.
fn parameter(header: &str, name: &str) -> Option<String> {
    header.split(';').skip(1).find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim().trim_matches('"').to_owned())
    })
}

/// The parts between `--boundary` lines, up to `--boundary--`.
fn split_multipart<'a>(body: &'a str, boundary: &str) -> Vec<&'a str> {
    let delimiter = format!("--{boundary}");
    let end = body.find(&format!("{delimiter}--")).unwrap_or(body.len());
    body[..end].split(delimiter.as_str()).skip(1).map(|part| part.strip_prefix('\n').unwrap_or(part)).collect()
}

fn decode_transfer(body: &str, encoding: &str) -> String {
    match encoding.trim().to_ascii_lowercase().as_str() {
        "quoted-printable" => String::from_utf8_lossy(&quoted_printable(body)).into_owned(),
        "base64" => String::from_utf8_lossy(&base64(body)).into_owned(),
        _ => body.to_owned(),
    }
}

fn quoted_printable(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'=' if bytes.get(index + 1) == Some(&b'\n') => index += 2,
            b'=' if bytes.get(index + 1..index + 3) == Some(b"\r\n") => index += 3,
            b'=' => match bytes
                .get(index + 1..index + 3)
                .and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok())
            {
                Some(byte) => {
                    out.push(byte);
                    index += 3;
                }
                None => {
                    out.push(b'=');
                    index += 1;
                }
            },
            byte => {
                out.push(byte);
                index += 1;
            }
        }
    }
    out
}

fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' | b'-' => Some(62),
        b'/' | b'_' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut buffer, mut bits) = (0u32, 0);
    for sextet in text.bytes().filter_map(value) {
        buffer = (buffer << 6) | u32::from(sextet);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
        }
    }
    out
}

/// HTML as plain text: tags dropped, `<br>`/`</p>` as line breaks, a few entities.
fn strip_tags(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut rest = html;
    while let Some(start) = rest.find('<') {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('>') else { break };
        let tag = rest[start + 1..start + end].to_ascii_lowercase();
        if tag.starts_with("br") || tag.starts_with("/p") || tag.starts_with("/div") || tag.starts_with("/tr") {
            out.push('\n');
        }
        rest = &rest[start + end + 1..];
    }
    if !rest.contains('<') {
        out.push_str(rest);
    }
    out.replace("&nbsp;", " ").replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_words_and_transfer_encodings_decode() {
        assert_eq!(decode_words("=?UTF-8?B?SMOpbGxv?= =?utf-8?q?w=C3=B6rld?= !"), "Héllowörld !");
        assert_eq!(decode_words("plain =?x"), "plain =?x");
        assert_eq!(String::from_utf8(quoted_printable("caf=C3=A9 soft=\nbreak")).unwrap(), "café softbreak");
        assert_eq!(base64("aGVsbG8gd29ybGQ="), b"hello world");
    }

    #[test]
    fn a_multipart_message_gives_its_plain_part_or_its_html_as_text() {
        let raw = "Content-Type: multipart/alternative;\n boundary=\"b1\"\nSubject: x\n\n--b1\n\
            Content-Type: text/html\n\n<p>Hi&nbsp;<b>there</b></p>\n--b1\nContent-Type: text/plain\n\
            Content-Transfer-Encoding: quoted-printable\n\nHi there =E2=9C=93\n--b1--\n";
        let message = parse_message(raw);
        assert_eq!(message.header("content-type"), Some("multipart/alternative; boundary=\"b1\""));
        assert_eq!(message.text_body().trim(), "Hi there ✓");
        let html_only = "Content-Type: multipart/alternative; boundary=b2\n\n--b2\nContent-Type: text/html\n\n\
            <p>Hi&nbsp;<b>there</b></p>\n--b2--\n";
        assert_eq!(parse_message(html_only).text_body().trim(), "Hi there");
    }
}
