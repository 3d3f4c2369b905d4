//! Why a reconcile failed ([`Error`]), and the label each failure is counted under in
//! `controller_runtime_reconcile_errors_total`.

use kube::runtime::finalizer;

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    /// A helper of the common crate failed.
    #[error(transparent)]
    Shared(#[from] shared::Error),
    /// The finalizer could not be added or removed, or the step it wraps failed.
    #[error(transparent)]
    Finalizer(Box<finalizer::Error<Error>>),
    /// The Deployment or Service cannot be written (refused by the API server, or the name
    /// is taken by someone else's object); recorded as `Degraded` and retried with backoff.
    #[error("{0}")]
    Children(String),
}

impl shared::ReconcileError for Error {
    fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Shared(e) => e.metric_label(),
            Error::Finalizer(e) => match e.as_ref() {
                finalizer::Error::ApplyFailed(inner) | finalizer::Error::CleanupFailed(inner) => {
                    inner.metric_label()
                }
                _ => "finalizer",
            },
            Error::Children(_) => "children",
        }
    }
}
