//! Tells the compiler which target triple it was built for: policies are
//! precompiled for that triple (baseline CPU), as host/build.rs does for the
//! plugin, so that the two compute the same compatibility key.
fn main() {
    println!("cargo:rustc-env=THEREABOUTS_BUILD_TARGET={}", std::env::var("TARGET").expect("cargo sets TARGET"));
}
