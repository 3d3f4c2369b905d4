//! Errors of the common crate, and the trait every operator's reconcile error implements.

/// What can go wrong in the common machinery (startup, leader election, apply helpers).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the Kubernetes API failed.
    #[error("kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),

    /// No cluster credentials could be found or used.
    #[error(
        "no usable Kubernetes credentials: {source}\n  looked at: $KUBECONFIG ({kubeconfig}), \
         ~/.kube/config, and the in-cluster service account \
         (/var/run/secrets/kubernetes.io/serviceaccount with KUBERNETES_SERVICE_HOST)"
    )]
    NoCredentials {
        /// What kube reported.
        source: kube::Error,
        /// The value of `$KUBECONFIG`, or `unset`.
        kubeconfig: String,
    },

    /// The custom resource definition is not installed in the cluster.
    #[error(
        "the CRD {crd} is not installed in the cluster; install it with\n  \
         kubectl apply -f deploy/{operator}/crd.yaml\nor\n  \
         cargo run -p {operator} -- crd | kubectl apply -f -"
    )]
    CrdNotInstalled {
        /// `<plural>.<group>`
        crd: String,
        /// The operator (and deploy folder) name.
        operator: String,
    },

    /// An object could not be serialized (a bug in a builder).
    #[error("cannot serialize {what}: {source}")]
    Serialize {
        /// What was serialized.
        what: String,
        /// The serde error.
        source: serde_json::Error,
    },

    /// An object lacks a field the helper needs (name, namespace, uid).
    #[error("object {0} lacks metadata.name, metadata.namespace or metadata.uid")]
    MissingMetadata(String),

    /// A metrics or health server could not start.
    #[error("cannot serve {what} on {addr}: {source}")]
    Serve {
        /// `metrics` or `health probes`.
        what: &'static str,
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },

    /// A flag's value is out of range (the message names the flag).
    #[error("invalid command line: {0}")]
    InvalidFlag(String),

    /// This replica lost the leader lease and stopped reconciling.
    #[error("leader election lost: {0}")]
    LeadershipLost(String),
}

impl Error {
    /// A short, stable label for metrics and logs.
    #[must_use]
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::NoCredentials { .. } => "no_credentials",
            Error::CrdNotInstalled { .. } => "crd_not_installed",
            Error::Serialize { .. } => "serialize",
            Error::MissingMetadata(_) => "missing_metadata",
            Error::Serve { .. } => "serve",
            Error::InvalidFlag(_) => "invalid_flag",
            Error::LeadershipLost(_) => "leadership_lost",
        }
    }
}

/// Implemented by the error type an operator's `reconcile` returns.
pub trait ReconcileError: std::error::Error + Send + Sync + 'static {
    /// A short, stable label naming the kind of failure (used in logs).
    fn metric_label(&self) -> &'static str;
}

impl ReconcileError for Error {
    fn metric_label(&self) -> &'static str {
        Error::metric_label(self)
    }
}
