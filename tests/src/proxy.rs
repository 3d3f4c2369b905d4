//! A TCP proxy on 127.0.0.1 that a test can stop and resume, to take a server away from
//! one client without touching the server (the broker's admin API, the API server).

use crate::{TIMEOUT, poll};
use anyhow::Result;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// Forwards connections on `127.0.0.1:<port>` to `127.0.0.1:<upstream>`.
pub struct TcpProxy {
    /// The port clients connect to.
    pub port: u16,
    upstream: u16,
    task: Option<JoinHandle<()>>,
}

impl TcpProxy {
    /// Starts forwarding from a free port to `upstream`.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(upstream: u16) -> Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let mut proxy = TcpProxy {
            port,
            upstream,
            task: None,
        };
        proxy.serve(listener);
        Ok(proxy)
    }

    fn serve(&mut self, listener: TcpListener) {
        let upstream = self.upstream;
        self.task = Some(tokio::spawn(async move {
            // Dropping the set (when the task is aborted) aborts every connection.
            let mut connections = JoinSet::new();
            while let Ok((mut client, _)) = listener.accept().await {
                connections.spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        }));
    }

    /// Refuses connections from now on and cuts the open ones.
    pub fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Serves again on the same port.
    ///
    /// # Errors
    /// When the port does not become free again within [`TIMEOUT`].
    pub async fn resume(&mut self) -> Result<()> {
        let listener = poll("the proxy's port free again", TIMEOUT, || async {
            Ok(TcpListener::bind(("127.0.0.1", self.port)).await.ok())
        })
        .await?;
        self.serve(listener);
        Ok(())
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop();
    }
}
