//! The build script: the ledger's migrations are compiled into the binary
//! (`sqlx::migrate!`), so a migration added or changed must rebuild it.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
