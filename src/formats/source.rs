//! Where a reader's bytes come from: a local path (memory-mapped, as before) or an object
//! in a store named by URL — `s3://bucket/key`, `gs://bucket/key`, `az://container/key`,
//! `http(s)://host/path` — through the `object_store` crate (feature `remote`).
//!
//! A URL travels through the library as a [`Path`] holding its text (`Path::join` and
//! `file_name` work on it as on a local path), so every error names the URL the user typed.
//! Only three seams look at it: [`crate::formats::open_input`] (the bytes of one file),
//! [`crate::producers::layout::DumpTree::discover`] (listing a prefix as a folder), and the
//! `.pt` reader's choice between a map and a buffer.
//!
//! Credentials and endpoints come from the environment, as each store's own tools read
//! them: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`
//! (an `http://` endpoint is allowed without `AWS_ALLOW_HTTP`), `GOOGLE_*`, `AZURE_*`.
//! Transient failures (5xx, timeouts, refused connections) are retried with exponential
//! backoff ([`RETRIES`] times, 100 ms doubling, at most [`RETRY_BUDGET`] in all).
//! Every byte of object data fetched is counted ([`stats`]) so that the ranged reads can
//! be checked (`dumpdiff --stats`).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Times a transient failure of one request is retried before it is reported.
pub const RETRIES: usize = 4;

/// Longest time, in seconds, spent retrying one request.
pub const RETRY_BUDGET: u64 = 20;

/// Bytes of whole objects kept in memory for a second read ([`read_cached`]): 256 MiB.
pub const CACHE_BYTES: usize = 256 << 20;

/// The URL schemes read through object storage.
const SCHEMES: [&str; 9] = [
    "s3", "s3a", "gs", "az", "abfs", "abfss", "azure", "http", "https",
];

static BYTES: AtomicU64 = AtomicU64::new(0);
static REQUESTS: AtomicU64 = AtomicU64::new(0);

/// What has been fetched from object storage by this process so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FetchStats {
    /// Bytes of object data received (ranged GETs and whole GETs; listings not counted).
    pub bytes: u64,
    /// Requests made: GETs, HEADs and LISTs.
    pub requests: u64,
}

/// The process-wide counters (they only grow; take a difference around one run).
pub fn stats() -> FetchStats {
    FetchStats {
        bytes: BYTES.load(Ordering::Relaxed),
        requests: REQUESTS.load(Ordering::Relaxed),
    }
}

/// Whether `path` names an object in a store (`scheme://…` with a scheme of [`SCHEMES`])
/// rather than a local file. Known regardless of the `remote` feature, so that a build
/// without it refuses a URL by name instead of looking for a local file called `s3:`.
pub fn is_remote(path: &Path) -> bool {
    let Some(s) = path.to_str() else {
        return false;
    };
    s.split_once("://")
        .is_some_and(|(scheme, _)| SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()))
}

/// One level of a prefix listed as a folder: the names (not paths) of the "sub-folders"
/// (common prefixes) and of the objects with their sizes, each sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// Names of the common prefixes one level below (`forward_data`, …).
    pub dirs: Vec<String>,
    /// Names and sizes of the objects directly under the prefix.
    pub files: Vec<(String, u64)>,
}

impl Listing {
    /// Nothing at all under the prefix: in a store, a folder that does not exist.
    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty() && self.files.is_empty()
    }
}

#[cfg(feature = "remote")]
pub use imp::{
    head_size, list_dir, read_all, read_cached, read_head, read_range, read_ranges, read_tail,
    write_object,
};

/// `path.is_dir()` that also answers for a URL: a prefix with something under it (object
/// stores have no empty folders). An unreachable store answers `false`; the read that
/// follows reports why.
pub fn is_dir(path: &Path) -> bool {
    if is_remote(path) {
        list_dir(path).is_ok_and(|l| !l.is_empty())
    } else {
        path.is_dir()
    }
}

/// The size in bytes of the file or object `path`.
pub fn size(path: &Path) -> Result<u64> {
    if is_remote(path) {
        head_size(path)?
            .ok_or_else(|| Error::input(path, "no such object (not found in the store)"))
    } else {
        std::fs::metadata(path)
            .map(|m| m.len())
            .map_err(|e| Error::io(path, e))
    }
}

#[cfg(not(feature = "remote"))]
mod imp_off {
    use super::*;

    fn off(path: &Path) -> Error {
        Error::input(
            path,
            "this build reads local paths only: rebuild with the `remote` cargo feature (on by \
             default) to read object storage",
        )
    }

    /// See the `remote` build: here every URL is refused.
    pub fn list_dir(path: &Path) -> Result<Listing> {
        Err(off(path))
    }

    /// See the `remote` build: here every URL is refused.
    pub fn head_size(path: &Path) -> Result<Option<u64>> {
        Err(off(path))
    }

    /// See the `remote` build: here every URL is refused.
    pub fn read_all(path: &Path) -> Result<Vec<u8>> {
        Err(off(path))
    }

    /// See the `remote` build: here every URL is refused.
    pub fn read_cached(path: &Path) -> Result<std::sync::Arc<Vec<u8>>> {
        Err(off(path))
    }

    /// See the `remote` build: here every URL is refused.
    pub fn read_range(path: &Path, _range: std::ops::Range<u64>) -> Result<Vec<u8>> {
        Err(off(path))
    }

    /// See the `remote` build: here every URL is refused.
    pub fn read_ranges(path: &Path, _ranges: &[std::ops::Range<u64>]) -> Result<Vec<Vec<u8>>> {
        Err(off(path))
    }

    /// See the `remote` build: here every URL is refused.
    pub fn read_head(path: &Path, _len: u64) -> Result<(Vec<u8>, u64)> {
        Err(off(path))
    }

    /// See the `remote` build: here every URL is refused.
    pub fn read_tail(path: &Path, _len: u64) -> Result<(Vec<u8>, u64)> {
        Err(off(path))
    }

    /// See the `remote` build: here every URL is refused.
    pub fn write_object(path: &Path, _bytes: Vec<u8>) -> Result<()> {
        Err(off(path))
    }
}

#[cfg(not(feature = "remote"))]
pub use imp_off::{
    head_size, list_dir, read_all, read_cached, read_head, read_range, read_ranges, read_tail,
    write_object,
};

#[cfg(feature = "remote")]
mod imp {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    use std::time::Duration;

    use object_store::path::Path as ObjPath;
    use object_store::{ObjectStore, ObjectStoreExt as _};

    use super::*;

    /// The runtime every blocking call runs its request on: two worker threads (the I/O
    /// driver and the timers), built on first use. Callers block on it from any thread,
    /// rayon's included (never from inside an async task: the library has none).
    fn runtime() -> Result<&'static tokio::runtime::Runtime> {
        static RT: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> = OnceLock::new();
        RT.get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("rlforensics-io")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Error::internal(format!("cannot start the I/O runtime: {e}")))
    }

    /// A store per `scheme://authority`, built once from the environment.
    type Stores = Mutex<HashMap<String, Arc<dyn ObjectStore>>>;

    fn stores() -> &'static Stores {
        static S: OnceLock<Stores> = OnceLock::new();
        S.get_or_init(Default::default)
    }

    fn retry() -> object_store::RetryConfig {
        object_store::RetryConfig {
            backoff: object_store::BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: RETRIES,
            retry_timeout: Duration::from_secs(RETRY_BUDGET),
        }
    }

    fn bad_url(path: &Path, why: impl std::fmt::Display) -> Error {
        Error::input(path, format!("not a usable object-store URL: {why}"))
    }

    /// The store holding `path` and the object key within it.
    fn resolve(path: &Path) -> Result<(Arc<dyn ObjectStore>, ObjPath)> {
        let text = path.to_str().ok_or_else(|| bad_url(path, "not UTF-8"))?;
        let url = url::Url::parse(text).map_err(|e| bad_url(path, e))?;
        let host = url.host_str().unwrap_or("");
        if host.is_empty() {
            return Err(bad_url(path, "no bucket or host after `://`"));
        }
        let scheme = url.scheme().to_ascii_lowercase();
        let base = match url.port() {
            Some(p) => format!("{scheme}://{host}:{p}"),
            None => format!("{scheme}://{host}"),
        };
        let key = ObjPath::from_url_path(url.path()).map_err(|e| bad_url(path, e))?;
        // A store is built from the environment (endpoint, credentials, region): one built
        // under other settings (another endpoint in the same process) is not reused.
        let mut env: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| {
                ["AWS_", "GOOGLE_", "AZURE_"]
                    .iter()
                    .any(|p| k.starts_with(p))
            })
            .collect();
        env.sort();
        let cache_key = format!("{base}\n{env:?}");
        let mut map = stores().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = map.get(&cache_key) {
            return Ok((s.clone(), key));
        }
        let store: Arc<dyn ObjectStore> = match scheme.as_str() {
            "s3" | "s3a" => {
                let mut b = object_store::aws::AmazonS3Builder::from_env()
                    .with_url(base.as_str())
                    .with_retry(retry());
                let endpoint = std::env::var("AWS_ENDPOINT_URL_S3")
                    .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
                    .unwrap_or_default();
                if endpoint.starts_with("http://") {
                    b = b.with_allow_http(true);
                }
                if std::env::var_os("AWS_REGION").is_none()
                    && std::env::var_os("AWS_DEFAULT_REGION").is_none()
                {
                    b = b.with_region("us-east-1");
                }
                Arc::new(b.build().map_err(|e| bad_url(path, e))?)
            }
            "gs" => Arc::new(
                object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_url(base.as_str())
                    .with_retry(retry())
                    .build()
                    .map_err(|e| bad_url(path, e))?,
            ),
            "az" | "abfs" | "abfss" | "azure" => Arc::new(
                object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(base.as_str())
                    .with_retry(retry())
                    .build()
                    .map_err(|e| bad_url(path, e))?,
            ),
            "http" | "https" => Arc::new(
                object_store::http::HttpBuilder::new()
                    .with_url(base.as_str())
                    .with_retry(retry())
                    .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
                    .build()
                    .map_err(|e| bad_url(path, e))?,
            ),
            other => return Err(bad_url(path, format!("unknown scheme `{other}`"))),
        };
        map.insert(cache_key, store.clone());
        Ok((store, key))
    }

    /// A store's error as the library's, naming `path`: a missing object or prefix, refused
    /// credentials, anything else (after the retries) with the store's own words.
    fn failed(path: &Path, e: object_store::Error) -> Error {
        use object_store::Error as E;
        match e {
            E::NotFound { .. } => Error::input(path, "no such object (not found in the store)"),
            E::PermissionDenied { source, .. } | E::Unauthenticated { source, .. } => Error::input(
                path,
                format!(
                    "access denied: check the credentials in the environment \
                         (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, GOOGLE_*, AZURE_*): \
                         {source}"
                ),
            ),
            other => {
                let text = other.to_string();
                // S3's answer carries its reason as <Code>…</Code>: say that, not the XML.
                let code = text
                    .split_once("<Code>")
                    .and_then(|(_, rest)| rest.split_once("</Code>"))
                    .map(|(c, _)| c.to_string());
                match code.as_deref() {
                    Some("NoSuchBucket") => Error::input(path, "no such bucket in the store"),
                    Some("NoSuchKey") => {
                        Error::input(path, "no such object (not found in the store)")
                    }
                    Some(
                        c @ ("InvalidAccessKeyId"
                        | "SignatureDoesNotMatch"
                        | "AccessDenied"
                        | "ExpiredToken"
                        | "InvalidToken"),
                    ) => Error::input(
                        path,
                        format!(
                            "access denied ({c}): check the credentials in the environment \
                             (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN)"
                        ),
                    ),
                    Some(c) => Error::input(path, format!("object storage answered {c}")),
                    None => Error::input(path, format!("object storage: {text}")),
                }
            }
        }
    }

    fn count(bytes: usize) {
        REQUESTS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// One level of the prefix `path` (a "folder"): its common prefixes and objects. A
    /// prefix with nothing under it lists empty (object stores have no empty folders).
    pub fn list_dir(path: &Path) -> Result<Listing> {
        let (store, key) = resolve(path)?;
        let rt = runtime()?;
        let prefix = (!key.as_ref().is_empty()).then_some(&key);
        let res = rt
            .block_on(store.list_with_delimiter(prefix))
            .map_err(|e| failed(path, e))?;
        count(0);
        let name = |p: &ObjPath| p.filename().unwrap_or_default().to_string();
        let mut out = Listing {
            dirs: res.common_prefixes.iter().map(name).collect(),
            files: res
                .objects
                .iter()
                .map(|o| (name(&o.location), o.size))
                .collect(),
        };
        out.dirs.sort();
        out.files.sort();
        Ok(out)
    }

    /// The size of the object `path`, `None` when there is none.
    pub fn head_size(path: &Path) -> Result<Option<u64>> {
        let (store, key) = resolve(path)?;
        let rt = runtime()?;
        count(0);
        match rt.block_on(store.head(&key)) {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(failed(path, e)),
        }
    }

    /// Objects fetched whole and kept for a second read (a tool may read a whole-batch
    /// file twice: locally the page cache answers, here this does), most recent last.
    struct Cache {
        items: std::collections::VecDeque<(std::path::PathBuf, Arc<Vec<u8>>)>,
        bytes: usize,
    }

    fn cache() -> &'static Mutex<Cache> {
        static C: OnceLock<Mutex<Cache>> = OnceLock::new();
        C.get_or_init(|| {
            Mutex::new(Cache {
                items: Default::default(),
                bytes: 0,
            })
        })
    }

    /// The whole object `path`, from [`cache`] when it was fetched before; objects of at
    /// most [`CACHE_BYTES`] in all are kept (least recently used dropped first).
    pub fn read_cached(path: &Path) -> Result<Arc<Vec<u8>>> {
        {
            let mut c = cache().lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = c.items.iter().position(|(p, _)| p == path) {
                let item = c.items.remove(i).expect("found above");
                let bytes = item.1.clone();
                c.items.push_back(item);
                return Ok(bytes);
            }
        }
        let bytes = Arc::new(read_all(path)?);
        if bytes.len() <= CACHE_BYTES {
            let mut c = cache().lock().unwrap_or_else(|p| p.into_inner());
            c.bytes += bytes.len();
            c.items.push_back((path.to_path_buf(), bytes.clone()));
            while c.bytes > CACHE_BYTES {
                let Some((_, old)) = c.items.pop_front() else {
                    break;
                };
                c.bytes -= old.len();
            }
        }
        Ok(bytes)
    }

    /// The whole object `path` in one GET.
    pub fn read_all(path: &Path) -> Result<Vec<u8>> {
        let (store, key) = resolve(path)?;
        let rt = runtime()?;
        let bytes = rt
            .block_on(async { store.get(&key).await?.bytes().await })
            .map_err(|e| failed(path, e))?;
        count(bytes.len());
        Ok(bytes.to_vec())
    }

    /// Bytes `range` of the object `path` (one ranged GET).
    pub fn read_range(path: &Path, range: std::ops::Range<u64>) -> Result<Vec<u8>> {
        let (store, key) = resolve(path)?;
        let rt = runtime()?;
        let bytes = rt
            .block_on(store.get_range(&key, range))
            .map_err(|e| failed(path, e))?;
        count(bytes.len());
        Ok(bytes.to_vec())
    }

    /// Bytes `ranges` of the object `path`, one ranged GET each, in the order given. The
    /// caller coalesces adjacent ranges (object_store's `get_ranges` would also merge ranges
    /// up to 1 MiB apart, fetching the gap: more than the ranged reads promise).
    pub fn read_ranges(path: &Path, ranges: &[std::ops::Range<u64>]) -> Result<Vec<Vec<u8>>> {
        let (store, key) = resolve(path)?;
        let rt = runtime()?;
        let mut out = Vec::with_capacity(ranges.len());
        for r in ranges {
            let bytes = rt
                .block_on(store.get_range(&key, r.clone()))
                .map_err(|e| failed(path, e))?;
            count(bytes.len());
            out.push(bytes.to_vec());
        }
        Ok(out)
    }

    /// The last `len` bytes of the object `path` (all of it when it is shorter) and the
    /// object's size, in one GET with a suffix range (no HEAD first).
    pub fn read_tail(path: &Path, len: u64) -> Result<(Vec<u8>, u64)> {
        read_with(path, object_store::GetRange::Suffix(len))
    }

    /// The first `len` bytes of the object `path` (all of it when it is shorter) and the
    /// object's size, in one ranged GET (no HEAD first).
    pub fn read_head(path: &Path, len: u64) -> Result<(Vec<u8>, u64)> {
        read_with(path, object_store::GetRange::Bounded(0..len))
    }

    /// Write `bytes` as the object `path` (one PUT, replacing an object of that name
    /// whole: a store never holds half an object). Counted as a request, not as bytes
    /// fetched.
    pub fn write_object(path: &Path, bytes: Vec<u8>) -> Result<()> {
        let (store, key) = resolve(path)?;
        let rt = runtime()?;
        rt.block_on(store.put(&key, object_store::PutPayload::from(bytes)))
            .map_err(|e| match e {
                // A PUT finds no object to miss: its 404 is the bucket's.
                object_store::Error::NotFound { .. } => {
                    Error::input(path, "no such bucket in the store")
                }
                e => failed(path, e),
            })?;
        count(0);
        Ok(())
    }

    fn read_with(path: &Path, range: object_store::GetRange) -> Result<(Vec<u8>, u64)> {
        let (store, key) = resolve(path)?;
        let rt = runtime()?;
        let opts = object_store::GetOptions {
            range: Some(range),
            ..Default::default()
        };
        let (bytes, size) = rt
            .block_on(async {
                let r = store.get_opts(&key, opts).await?;
                let size = r.meta.size;
                Ok::<_, object_store::Error>((r.bytes().await?, size))
            })
            .map_err(|e| failed(path, e))?;
        count(bytes.len());
        Ok((bytes.to_vec(), size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_told_from_local_paths_by_scheme() {
        for url in [
            "s3://b/run",
            "S3://b/run",
            "gs://b/x.pt",
            "az://c/x",
            "https://h:9000/x",
            "http://127.0.0.1:5000/b",
        ] {
            assert!(is_remote(Path::new(url)), "{url}");
        }
        for local in [
            "fixtures/dumps",
            "/abs/s3://x",
            "s3:/one-slash",
            "file://x",
            "ftp://h/x",
            "-",
        ] {
            assert!(!is_remote(Path::new(local)), "{local}");
        }
        // Joining keeps the URL a URL (the tree walkers join kind folders onto a root).
        let j = Path::new("s3://b/run").join("forward_data");
        assert_eq!(j.to_str(), Some("s3://b/run/forward_data"));
        assert!(is_remote(&j));
    }
}
