//! Handles: what C holds for the objects several threads share (environments, option sets,
//! sessions), so that freeing one while another thread uses it can never free memory under
//! that thread.
//!
//! A handle is not an address. It names a slot of a process-wide table ([`Handles`]) and the
//! generation of that slot, and says which kind of object it is. Every call looks its handle up
//! and works on its own reference (`Arc`) to the object, so:
//!
//! - `*_free` only takes the handle out of the table (releasing the caller's reference); a run
//!   in flight finishes on its own reference, and the object is dropped by whoever lets go last;
//! - a call made with a handle after its `*_free` finds the slot empty or of a newer generation
//!   and fails with "the session is closed", instead of reading freed memory;
//! - a handle of another kind (an environment passed as a session) or a number that was never
//!   a handle is refused by name.
//!
//! The bits of a handle, from the top: 8 for the kind, 24 for the generation, 32 for the slot
//! (plus one, so a handle is never NULL). A slot is reused after a free with its generation
//! incremented; a stale handle could only be mistaken for a new object after 2^24 reuses of the
//! same slot while it was kept.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use crate::error::{Res, invalid};

#[cfg(not(target_pointer_width = "64"))]
compile_error!("libepx's handles need 64-bit pointers");

const SLOT_BITS: u32 = 32;
const GENERATION_BITS: u32 = 24;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;

struct Slot<T> {
    generation: u32,
    object: Option<Arc<T>>,
}

struct Table<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
}

/// The live objects of one kind. `H` is the opaque type C sees (`EpxSession`, ...).
pub(crate) struct Handles<T, H> {
    kind: u8,
    /// What C calls the object, for messages ("session").
    noun: &'static str,
    /// The function that frees it, for messages ("epx_session_free").
    free_fn: &'static str,
    table: Mutex<Table<T>>,
    _handle: PhantomData<fn() -> H>,
}

/// The noun of each kind, for a handle of the wrong kind.
fn noun_of_kind(kind: u64) -> &'static str {
    match kind {
        1 => "an environment",
        2 => "an option set",
        3 => "a session",
        4 => "a run option set",
        _ => "no object of this library",
    }
}

impl<T, H> Handles<T, H> {
    /// An empty table of kind `kind` (1 environments, 2 option sets, 3 sessions, 4 run option sets).
    pub(crate) const fn new(kind: u8, noun: &'static str, free_fn: &'static str) -> Self {
        Handles {
            kind,
            noun,
            free_fn,
            table: Mutex::new(Table {
                slots: Vec::new(),
                free: Vec::new(),
            }),
            _handle: PhantomData,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table<T>> {
        // A panic while holding the lock leaves the table consistent (every change is one
        // assignment), so a poisoned lock is used as it is.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn encode(&self, slot: usize, generation: u32) -> *mut H {
        let value = (u64::from(self.kind) << (SLOT_BITS + GENERATION_BITS))
            | ((u64::from(generation) & GENERATION_MASK) << SLOT_BITS)
            | (slot as u64 + 1);
        value as usize as *mut H
    }

    /// The slot and generation `h` names, when it is a handle of this kind.
    fn decode(&self, h: *const H, what: &str) -> Res<(usize, u32)> {
        let value = h as usize as u64;
        if value == 0 {
            return Err(invalid(format!("`{what}` is NULL")));
        }
        let kind = value >> (SLOT_BITS + GENERATION_BITS);
        if kind != u64::from(self.kind) {
            return Err(invalid(format!(
                "`{what}` is not {} handle: it is {}",
                article(self.noun),
                noun_of_kind(kind)
            )));
        }
        let slot = (value & ((1 << SLOT_BITS) - 1)) as usize;
        let generation = ((value >> SLOT_BITS) & GENERATION_MASK) as u32;
        Ok((slot - 1, generation))
    }

    /// Stores `object` and returns its handle.
    pub(crate) fn insert(&self, object: T) -> *mut H {
        let object = Some(Arc::new(object));
        let mut table = self.lock();
        let slot = match table.free.pop() {
            Some(i) => {
                let s = &mut table.slots[i as usize];
                s.object = object;
                i as usize
            }
            None => {
                table.slots.push(Slot {
                    generation: 0,
                    object,
                });
                table.slots.len() - 1
            }
        };
        let generation = table.slots[slot].generation;
        self.encode(slot, generation)
    }

    /// The object `h` names, as a reference of the caller's own: an error naming `what` when
    /// `h` is NULL, of another kind, or freed.
    pub(crate) fn get(&self, h: *const H, what: &str) -> Res<Arc<T>> {
        let (slot, generation) = self.decode(h, what)?;
        let table = self.lock();
        match table.slots.get(slot) {
            Some(s) if s.generation == generation => s.object.clone().ok_or_else(|| self.closed()),
            Some(_) => Err(self.closed()),
            None => Err(invalid(format!(
                "`{what}` is not {} handle of this process",
                article(self.noun)
            ))),
        }
    }

    fn closed(&self) -> Box<crate::error::EpxError> {
        invalid(format!(
            "the {} is closed: {} was called on it",
            self.noun, self.free_fn
        ))
    }

    /// Takes `h` out of the table: the caller's reference, dropped by the caller outside the
    /// lock (the object itself lives on while a call holds its own). `None` for NULL, a stale
    /// handle (freed twice) or one of another kind.
    pub(crate) fn remove(&self, h: *const H) -> Option<Arc<T>> {
        let (slot, generation) = self.decode(h, "handle").ok()?;
        let mut table = self.lock();
        let s = table.slots.get_mut(slot)?;
        if s.generation != generation || s.object.is_none() {
            return None;
        }
        let object = s.object.take();
        s.generation = (s.generation + 1) & GENERATION_MASK as u32;
        table.free.push(slot as u32);
        object
    }

    /// The number of live objects (for tests).
    #[cfg(test)]
    pub(crate) fn live(&self) -> usize {
        self.lock()
            .slots
            .iter()
            .filter(|s| s.object.is_some())
            .count()
    }
}

fn article(noun: &str) -> String {
    match noun.chars().next() {
        Some('a' | 'e' | 'i' | 'o' | 'u') => format!("an {noun}"),
        _ => format!("a {noun}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Marker;

    #[test]
    fn a_freed_handle_is_refused_and_its_slot_reused_under_a_new_generation() {
        let table: Handles<String, Marker> = Handles::new(3, "session", "epx_session_free");
        let a = table.insert("a".into());
        assert_eq!(*table.get(a, "session").unwrap(), "a");
        let held = table.get(a, "session").unwrap();
        let taken = table.remove(a).expect("removed");
        drop(taken);
        assert_eq!(*held, "a", "a reference taken before the free stays valid");
        let e = table.get(a, "session").unwrap_err();
        assert_eq!(
            e.message.to_str().unwrap(),
            "the session is closed: epx_session_free was called on it"
        );
        assert!(table.remove(a).is_none(), "a second free is harmless");
        let b = table.insert("b".into());
        assert_ne!(a, b, "the slot is reused under another generation");
        assert!(table.get(a, "session").is_err());
        assert_eq!(*table.get(b, "session").unwrap(), "b");
        assert_eq!(table.live(), 1);
    }

    #[test]
    fn null_foreign_and_other_kinds_of_handle_are_refused_by_name() {
        let sessions: Handles<u8, Marker> = Handles::new(3, "session", "epx_session_free");
        let envs: Handles<u8, Marker> = Handles::new(1, "environment", "epx_env_free");
        let env = envs.insert(1);
        let msg = |e: Box<crate::error::EpxError>| e.message.to_str().unwrap().to_string();
        assert_eq!(
            msg(sessions.get(std::ptr::null(), "session").unwrap_err()),
            "`session` is NULL"
        );
        assert!(
            msg(sessions.get(env.cast(), "session").unwrap_err())
                .contains("is not a session handle: it is an environment")
        );
        let bogus = 0xdead_beef_usize as *const Marker;
        assert!(msg(sessions.get(bogus, "session").unwrap_err()).contains("is not a session"));
        let unknown_slot = sessions.encode(1000, 0);
        assert!(
            msg(sessions.get(unknown_slot, "session").unwrap_err())
                .contains("not a session handle of this process")
        );
        assert!(sessions.remove(env.cast()).is_none());
        assert_eq!(envs.live(), 1);
    }
}
