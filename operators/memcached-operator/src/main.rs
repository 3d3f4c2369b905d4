//! The memcached-operator binary (placeholder until its issue lands).

fn main() -> anyhow::Result<()> {
    anyhow::bail!("memcached-operator is not implemented yet")
}
