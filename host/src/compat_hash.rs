// The compatibility key of precompiled policy artifacts, shared by
// host/build.rs and the policy compiler via `include!` (plain Rust, no `use`).
//
// An artifact is named `<sha256 of the .wasm>-<key>.cwasm`, the key being
// this hash of `Engine::precompile_compatibility_hash()`: artifacts whose
// engines hash alike load into each other's engines. That hash is only
// available with a compiler (Cranelift), which the plugin has not, so
// build.rs computes the plugin's key at build time and the compiler computes
// it again when it writes an artifact: both must hash the same way forever,
// hence FNV-1a with its fixed offset basis instead of std's `DefaultHasher`
// (SipHash, whose algorithm and keys Rust does not promise to keep).

/// 64-bit FNV-1a (http://www.isthe.com/chongo/tech/comp/fnv/).
pub struct CompatHasher(u64);

impl CompatHasher {
    pub fn new() -> Self {
        CompatHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl Default for CompatHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl std::hash::Hasher for CompatHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The key of artifacts `engine` precompiles: 16 lowercase hex digits.
pub fn compat_key(engine: &wasmtime::Engine) -> String {
    let mut hasher = CompatHasher::new();
    std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
    format!("{:016x}", std::hash::Hasher::finish(&hasher))
}
