//! What the operator families share, one kind of helper a file: element arithmetic ([`num`]),
//! broadcasting ([`broadcast`]), argument access ([`args`]), window geometry attributes
//! ([`spatial`]) and index walking ([`indexing`]). Names no family.

pub mod args;
pub mod broadcast;
pub mod indexing;
pub mod num;
pub mod spatial;
