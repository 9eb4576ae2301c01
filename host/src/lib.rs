//! The `thereabouts` host: everything that does I/O around the engine component.

pub mod component;
