//! The file datastore's pool files: a file of two checksummed slots, each
//! holding a pool document. The first byte chooses the input's form:
//! a whole file made of the input's document and version, then damaged at
//! the input's positions (a torn write, a flipped bit), or raw bytes read as
//! a file, or raw bytes read as a pool document. Whatever the bytes, a read
//! gives a slot whose checksum holds or nothing, and a document that decodes
//! encodes back to the same pool.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use thereabouts::datastore::pool_document::{Format, PoolDocument, encode};
use thereabouts::datastore::pool_file::{HEADER_LEN, new_file, newest_in, slot_size_for};

#[derive(Arbitrary, Debug)]
struct Damaged<'a> {
    version: u64,
    older: Option<&'a [u8]>,
    payload: &'a [u8],
    damage: Vec<(u16, u8)>,
    cut: Option<u16>,
}

fn round_trip(bytes: &[u8]) {
    let Ok(document) = PoolDocument::decode(bytes) else { return };
    let entries: BTreeMap<u128, _> = document.entries.iter().map(|a| (a.offset, a.clone())).collect();
    assert_eq!(entries.len(), document.entries.len(), "one entry per offset");
    for format in [Format::Compact, Format::Pretty] {
        let again =
            PoolDocument::decode(&encode(&document.range, &entries, &document.created_by, &document.unreserved, format)).expect("an encoded pool decodes");
        assert_eq!(again, document);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 3 {
        0 => {
            let Ok(input) = Damaged::arbitrary_take_rest(Unstructured::new(rest)) else { return };
            let slot = slot_size_for(input.payload.len().max(input.older.map_or(0, <[u8]>::len)));
            let mut file = new_file(slot, input.version, input.payload);
            if let Some(older) = input.older {
                // The other slot holds an older version, as after a commit.
                let second = new_file(slot, input.version.wrapping_sub(1), older);
                let half = file.len() / 2;
                file[half..].copy_from_slice(&second[..half]);
            }
            let regions = [(0, HEADER_LEN + input.payload.len()), (file.len() / 2, file.len() / 2 + HEADER_LEN + input.older.map_or(0, <[u8]>::len))];
            let mut touched = [false, input.older.is_none()];
            for (at, bits) in &input.damage {
                let at = usize::from(*at) % file.len();
                file[at] ^= bits;
                for (slot, &(from, to)) in regions.iter().enumerate() {
                    touched[slot] |= *bits != 0 && from <= at && at < to;
                }
            }
            if let Some(cut) = input.cut {
                let len = usize::from(cut) % (file.len() + 1);
                if len < file.len() {
                    file.truncate(len);
                    touched = [true, true];
                }
            }
            // The newest slot is read when intact; a damaged one falls back to the
            // other version if that is intact (a damaged slot whose checksum
            // still holds reads as written: the fuzzer may forge one).
            let newest = if input.older.is_some() && input.version == 0 { 1 } else { 0 };
            let read = newest_in(&file);
            if !touched[newest] {
                let read = read.as_ref().expect("an intact file reads").as_ref().expect("an intact newest slot is found");
                assert_eq!(read.index, newest as u64);
                assert_eq!(read.version, if newest == 0 { input.version } else { input.version.wrapping_sub(1) });
            } else if !touched[1 - newest] {
                assert!(matches!(read, Ok(Some(_))), "a torn slot did not fall back to the intact one");
            }
            if let Ok(Some(read)) = read {
                round_trip(&read.payload);
            }
        }
        1 => {
            if let Ok(Some(read)) = newest_in(rest) {
                round_trip(&read.payload);
            }
        }
        _ => round_trip(rest),
    }
});
