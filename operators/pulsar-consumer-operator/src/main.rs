//! The pulsar-consumer-operator binary (placeholder until its issue lands).

fn main() -> anyhow::Result<()> {
    anyhow::bail!("pulsar-consumer-operator is not implemented yet")
}
