//! The lolcow-operator binary (placeholder until its issue lands).

fn main() -> anyhow::Result<()> {
    anyhow::bail!("lolcow-operator is not implemented yet")
}
