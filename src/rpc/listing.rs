//! Listings as their callers want them: the store server answers a listing in pages (an answer
//! stays within its message limit whatever the size of the directory), and these read the
//! pages one after another.

use super::error::ClientError;
use super::status::{Fault, RemoteError};
use super::store::Store;
use crate::proto::{ListEntry, ListRequest, ListResponse};

impl Store {
    /// Every page of the listing `req` asks for, as one answer: the first page's existence,
    /// directory and listings ahead, with the entries of every page.
    pub async fn list_all(&self, req: ListRequest) -> Result<ListResponse, ClientError> {
        let mut entries = Vec::new();
        let mut first = self
            .list_each(req, |page| {
                entries.extend(page);
                Ok::<_, ClientError>(())
            })
            .await?;
        first.entries = entries;
        Ok(first)
    }

    /// Calls `f` with the entries of each page of the listing `req` asks for, in order, and
    /// returns the first page without its entries: a caller that prints them holds one page
    /// at a time.
    pub async fn list_each<E: From<ClientError>>(
        &self,
        mut req: ListRequest,
        mut f: impl FnMut(Vec<ListEntry>) -> Result<(), E>,
    ) -> Result<ListResponse, E> {
        let mut first = self.list(req.clone()).await?;
        f(std::mem::take(&mut first.entries))?;
        let mut next = std::mem::take(&mut first.next);
        // Listings ahead come with a whole first page alone.
        req.ahead = 0;
        while !next.is_empty() {
            req.after = next;
            let mut page = self.list(req.clone()).await?;
            if !page.exists {
                // Removed while it was read: what was read of it stands, as a listing read a
                // moment earlier would have.
                break;
            }
            // Pages go forward, or the server would have its caller ask forever.
            if !page.next.is_empty() && page.next <= req.after {
                return Err(ClientError::Remote(RemoteError::new(
                    Fault::Internal,
                    format!(
                        "the store server's listing of {:?} does not go past {:?}",
                        req.prefix, req.after
                    ),
                ))
                .into());
            }
            next = std::mem::take(&mut page.next);
            f(page.entries)?;
        }
        Ok(first)
    }
}
