//! What the etcd datastore reads back from etcd: a pool key's value (the pool
//! document) and a reservation key's value. Whatever a value holds (written
//! by an older version, by hand, or corrupt), it decodes or is refused, and
//! what decodes encodes back to the same thing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use thereabouts::datastore::etcd::layout::ReservationValue;
use thereabouts::datastore::pool_document::PoolDocument;

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = ReservationValue::decode(data) {
        assert_eq!(ReservationValue::decode(&value.encode()).as_ref(), Ok(&value));
        let claim = value.claim();
        assert_eq!(claim.is_some(), !value.ipamclaimref.is_empty() || !value.resourceclaimref.is_empty());
    }
    if let Ok(pool) = PoolDocument::decode(data) {
        let mut offsets = pool.entries.iter().map(|a| a.offset);
        let sorted = offsets.clone().zip(offsets.by_ref().skip(1)).all(|(a, b)| a < b);
        assert!(sorted, "entries in ascending offset order, one per offset");
    }
});
