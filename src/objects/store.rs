//! [`Objects`]: named immutable objects under a prefix of one bucket or directory.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, PutPayload, RetryConfig};

use super::url::ObjectUrl;
use crate::bridge::Bridge;

/// How long one request may take, and one connection to open: a store server whose object
/// store is gone says so within seconds rather than holding its callers.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Transient failures are retried this often within this long (object_store's default
/// retries for three minutes, which a caller waiting on a block takes for a hang). Not fewer:
/// after many requests at once (a large put's parts) the client pools as many connections,
/// and where the server has closed them while they idled, each retry may take another of
/// them and fail the same way (seen once: a HEAD failing "error sending request" three times
/// within 0.45 s); the time, not the count, bounds a store that is really gone.
const RETRIES: usize = 10;
const RETRY_WITHIN: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("object store {url}: {source}")]
    Store {
        url: String,
        #[source]
        source: object_store::Error,
    },
    #[error("object store {url}: {why}")]
    Other { url: String, why: String },
}

/// Named objects under the prefix of one bucket or directory.
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    /// Prepended to every name, with its `/`; empty for none.
    prefix: String,
    /// Where a `file://` store keeps its objects, synced after each write.
    dir: Option<PathBuf>,
    url: String,
    bridge: Bridge,
}

impl Objects {
    /// Opens the store `url` names and checks that it answers (a listing of the prefix), so a
    /// server whose object store cannot be reached says so at its start.
    pub fn open(url: &ObjectUrl) -> Result<Self, ObjectError> {
        let shown = url.to_string();
        let other = |why: String| ObjectError::Other {
            url: shown.clone(),
            why,
        };
        let bridge = Bridge::new("kt-objects").map_err(|e| other(e.to_string()))?;
        let (store, prefix, dir) = build(url).map_err(|source| ObjectError::Store {
            url: shown.clone(),
            source,
        })?;
        let objects = Objects {
            store,
            prefix,
            dir,
            url: shown,
            bridge,
        };
        objects.check()?;
        Ok(objects)
    }

    /// One listing of the prefix's first level (a page at most, however many objects it
    /// holds): the store answers, and takes the credentials.
    pub fn check(&self) -> Result<(), ObjectError> {
        let store = self.store.clone();
        let top = Path::from(self.prefix.clone());
        self.run(async move { store.list_with_delimiter(Some(&top)).await.map(|_| ()) })
    }

    fn path(&self, name: &str) -> Path {
        Path::from(format!("{}{name}", self.prefix))
    }

    fn err(&self, source: object_store::Error) -> ObjectError {
        ObjectError::Store {
            url: self.url.clone(),
            source,
        }
    }

    fn run<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = Result<T, object_store::Error>> + Send + 'static,
    ) -> Result<T, ObjectError> {
        match self.bridge.run(fut) {
            Some(r) => r.map_err(|e| self.err(e)),
            None => Err(ObjectError::Other {
                url: self.url.clone(),
                why: "the object store's runtime stopped".into(),
            }),
        }
    }

    /// Writes object `name` whole (replacing one of that name, which for a name by content
    /// holds the same bytes); durable once it returns.
    pub fn put(&self, name: &str, data: Bytes) -> Result<(), ObjectError> {
        let (store, path) = (self.store.clone(), self.path(name));
        self.run(async move { store.put(&path, PutPayload::from(data)).await })?;
        if let Some(dir) = &self.dir {
            // The local store renames a written file into place without a sync.
            let file = dir.join(format!("{}{name}", self.prefix));
            let synced = std::fs::File::open(&file).and_then(|f| f.sync_all());
            let parent = file.parent().map(std::fs::File::open);
            let synced = synced.and_then(|()| match parent {
                Some(p) => p.and_then(|p| p.sync_all()),
                None => Ok(()),
            });
            synced.map_err(|e| ObjectError::Other {
                url: self.url.clone(),
                why: format!("syncing {}: {e}", file.display()),
            })?;
        }
        Ok(())
    }

    /// Object `name`'s bytes, or `None` if there is none.
    pub fn get(&self, name: &str) -> Result<Option<Bytes>, ObjectError> {
        let (store, path) = (self.store.clone(), self.path(name));
        self.run(async move {
            match store.get(&path).await {
                Ok(r) => r.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    /// `len` bytes of object `name` from `start` (one ranged GET), or `None` if there is no
    /// such object. A range past the object's end is an error of the object store's.
    pub fn get_range(
        &self,
        name: &str,
        start: u64,
        len: usize,
    ) -> Result<Option<Bytes>, ObjectError> {
        let (store, path) = (self.store.clone(), self.path(name));
        let range = start..start.saturating_add(len as u64);
        self.run(async move {
            match store.get_range(&path, range).await {
                Ok(b) => Ok(Some(b)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    /// Object `name`'s length, or `None` if there is none.
    pub fn len(&self, name: &str) -> Result<Option<u64>, ObjectError> {
        let (store, path) = (self.store.clone(), self.path(name));
        self.run(async move {
            match store.head(&path).await {
                Ok(m) => Ok(Some(m.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    /// Deletes object `name`; one already gone is no error.
    pub fn delete(&self, name: &str) -> Result<(), ObjectError> {
        let (store, path) = (self.store.clone(), self.path(name));
        self.run(async move {
            match store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    /// Calls `f` with the name of every object under `dir` (`dir` itself left off), in pages
    /// as the store answers them, in no promised order; an error of `f` stops the listing.
    pub fn list(
        &self,
        dir: &str,
        mut f: impl FnMut(&str) -> Result<(), ObjectError>,
    ) -> Result<(), ObjectError> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<String>, object_store::Error>>(2);
        let store = self.store.clone();
        let under = format!("{}{dir}", self.prefix);
        let listing = Path::from(under.clone());
        let skip = if under.is_empty() {
            0
        } else {
            under.trim_end_matches('/').len() + 1
        };
        // The listing streams on the runtime while `f` runs here, a page at a time.
        let started = self.bridge.spawn(async move {
            let mut stream = store.list(Some(&listing)).chunks(1000);
            while let Some(page) = stream.next().await {
                let page: Result<Vec<String>, _> = page
                    .into_iter()
                    .map(|m| m.map(|m| m.location.as_ref().to_string()))
                    .collect();
                let failed = page.is_err();
                if tx.send(page).is_err() || failed {
                    return;
                }
            }
        });
        if !started {
            return Err(ObjectError::Other {
                url: self.url.clone(),
                why: "the object store's runtime stopped".into(),
            });
        }
        for page in rx {
            for name in page.map_err(|e| self.err(e))? {
                if let Some(rest) = name.get(skip..) {
                    f(rest)?;
                }
            }
        }
        Ok(())
    }
}

/// The client `url` names, the prefix of its names, and a `file://` store's directory.
type Built = (Arc<dyn ObjectStore>, String, Option<PathBuf>);

fn build(url: &ObjectUrl) -> Result<Built, object_store::Error> {
    let with_slash = |p: &str| match p {
        "" => String::new(),
        p => format!("{p}/"),
    };
    let client = ClientOptions::new()
        .with_timeout(REQUEST_TIMEOUT)
        .with_connect_timeout(CONNECT_TIMEOUT);
    let retry = RetryConfig {
        max_retries: RETRIES,
        retry_timeout: RETRY_WITHIN,
        ..RetryConfig::default()
    };
    let generic = |why: String| object_store::Error::Generic {
        store: "address",
        source: why.into(),
    };
    match url {
        ObjectUrl::Dir(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| generic(format!("{}: {e}", dir.display())))?;
            let store = object_store::local::LocalFileSystem::new_with_prefix(dir)?;
            Ok((Arc::new(store), String::new(), Some(dir.clone())))
        }
        ObjectUrl::Cloud {
            scheme,
            bucket,
            prefix,
            options,
        } => {
            let store: Arc<dyn ObjectStore> = match scheme.as_str() {
                "s3" => {
                    let mut b = object_store::aws::AmazonS3Builder::from_env()
                        .with_bucket_name(bucket)
                        .with_client_options(client)
                        .with_retry(retry);
                    for (k, v) in options {
                        // An endpoint of plain HTTP (a test server, an in-cluster gateway)
                        // is asked for by its address alone.
                        if k == "endpoint" && v.starts_with("http://") {
                            b = b.with_allow_http(true);
                        }
                        b = b.with_config(k.parse()?, v);
                    }
                    Arc::new(b.build()?)
                }
                "gs" => {
                    let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                        .with_bucket_name(bucket)
                        .with_client_options(client)
                        .with_retry(retry);
                    for (k, v) in options {
                        b = b.with_config(k.parse()?, v);
                    }
                    Arc::new(b.build()?)
                }
                "az" => {
                    let mut b = object_store::azure::MicrosoftAzureBuilder::from_env()
                        .with_container_name(bucket)
                        .with_client_options(client)
                        .with_retry(retry);
                    for (k, v) in options {
                        b = b.with_config(k.parse()?, v);
                    }
                    Arc::new(b.build()?)
                }
                s => return Err(generic(format!("no object store for {s}://"))),
            };
            Ok((store, with_slash(prefix), None))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_store_writes_reads_lists_and_deletes_under_its_names() {
        let dir = tempfile::tempdir().unwrap();
        let o = Objects::open(&ObjectUrl::Dir(dir.path().join("objects"))).unwrap();
        assert_eq!(o.get("blocks/a").unwrap(), None);
        assert_eq!(o.len("blocks/a").unwrap(), None);
        o.put("blocks/a", Bytes::from_static(b"hello")).unwrap();
        o.put("blocks/b", Bytes::from_static(b"")).unwrap();
        o.put("manifests/m", Bytes::from_static(b"m")).unwrap();
        assert_eq!(o.get("blocks/a").unwrap().as_deref(), Some(&b"hello"[..]));
        assert_eq!(o.len("blocks/a").unwrap(), Some(5));
        let mut names = Vec::new();
        o.list("blocks/", |n| {
            names.push(n.to_string());
            Ok(())
        })
        .unwrap();
        names.sort();
        assert_eq!(names, ["a", "b"]);
        o.delete("blocks/a").unwrap();
        o.delete("blocks/a").unwrap();
        assert_eq!(o.get("blocks/a").unwrap(), None);
        // An error of the caller's stops the listing and comes back.
        let stopped = o.list("", |_| {
            Err(ObjectError::Other {
                url: "x".into(),
                why: "stop".into(),
            })
        });
        assert!(matches!(stopped, Err(ObjectError::Other { .. })));
        drop(o);
        // Another client of the same directory sees the same objects.
        let again = Objects::open(&ObjectUrl::Dir(dir.path().join("objects"))).unwrap();
        assert_eq!(
            again.get("manifests/m").unwrap().as_deref(),
            Some(&b"m"[..])
        );
    }

    #[test]
    fn an_s3_store_that_cannot_be_reached_is_an_error_at_open_not_a_hang() {
        // Unsigned: no credentials looked for (nor asked of a metadata service).
        let url: ObjectUrl = "s3://b/p?endpoint=http://127.0.0.1:1&region=r&skip_signature=true"
            .parse()
            .unwrap();
        let start = std::time::Instant::now();
        let e = Objects::open(&url).err().expect("opened");
        assert!(e.to_string().contains("object store s3://b/p"), "{e}");
        assert!(start.elapsed() < RETRY_WITHIN + CONNECT_TIMEOUT);
    }
}
