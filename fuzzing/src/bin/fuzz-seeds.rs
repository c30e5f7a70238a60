//! Writes the seed corpus (`agentmesh_fuzzing::seeds`) into
//! `proto/fuzz/corpus/<target>/`, replacing seeds of the same name and
//! leaving every other file (inputs kept from fuzzing) alone.
//!
//! `cargo run -p agentmesh-fuzzing --bin fuzz-seeds [CORPUS_DIR]`

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let root = std::env::args_os().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../proto/fuzz/corpus"),
        PathBuf::from,
    );
    let seeds = agentmesh_fuzzing::seeds::all();
    for s in &seeds {
        let dir = root.join(s.target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(s.name), &s.data)?;
    }
    println!("wrote {} seeds under {}", seeds.len(), root.display());
    Ok(())
}
