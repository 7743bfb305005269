//! The migrations are embedded in the binary (`sqlx::migrate!`), which does
//! not tell cargo about them: without this, a changed or added migration
//! would not rebuild the crate.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
