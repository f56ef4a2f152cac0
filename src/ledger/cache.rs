//! The process-wide cache of imports: one import per key per process, shared by every view.
//!
//! Buffers (one driver mapping per export and context), arenas (one mapping and importer slot
//! per arena, context and access), pools (one driver import per pool) and exporters' ledgers
//! (one lease per exporter) are each imported once per process and shared; each kind keeps one
//! [`ImportCache`] of [`Weak`] entries, so the cache never keeps an import alive. The rules,
//! written once here:
//!
//! - **Hits take no creation lock**: a lookup under the entries' lock, then the kind's `reuse`
//!   check (is the export closing, is its exporter alive, does the handle describe the same
//!   memory) outside it.
//! - **Two threads importing one key make one import**: a miss takes the creation lock, looks
//!   again, and only then creates and registers. A drop never takes the creation lock.
//! - **An import being dropped** (its last holder gone, its teardown running) is either waited
//!   for — [`Dying::WaitForIt`], where the driver has one import per process and a second would
//!   be torn down by the first one's teardown (legacy mappings, pool imports) — or left to finish
//!   beside a new one — [`Dying::Coexist`], where each import maps memory of its own (arenas,
//!   ledgers). An import's `Drop` calls [`ImportCache::forget`] after its teardown.
//! - Nothing is dropped under the entries' lock (an import's `Drop` takes it).
//!
//! Beside the imports, one [`TableCache`] per kind of shared table (lease tables, block
//! tables) keeps the tables of exports this process imported from after their last import
//! ends, so that importing again skips the table's `open`, `fstat` and `mmap`.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::error::Result;
use crate::shared::ShmSafe;
use crate::shm::ShmRegion;

/// What a lookup does with an import whose last holder is dropping it (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Dying {
    /// Wait until its teardown forgot it: the new import must not overlap the old one's.
    WaitForIt,
    /// Import anew beside it.
    Coexist,
}

/// One kind's imports of this process, by key (see the module docs).
pub(crate) struct ImportCache<K, V> {
    entries: Mutex<BTreeMap<K, Vec<Weak<V>>>>,
    creating: Mutex<()>,
    dying: Dying,
}

/// What a key's entries hold now.
enum Found<V> {
    Live(Arc<V>),
    /// Only imports being dropped.
    Dying,
    Absent,
}

impl<K: Ord + Clone, V> ImportCache<K, V> {
    /// An empty cache whose dying imports are handled as `dying` says.
    pub(crate) const fn new(dying: Dying) -> Self {
        Self {
            entries: parking_lot::const_mutex(BTreeMap::new()),
            creating: parking_lot::const_mutex(()),
            dying,
        }
    }

    /// The live import of `key` that `reuse` accepts, else a new one made by `create` and
    /// registered. `reuse` runs on every hit: `Ok(true)` shares the import, `Ok(false)` makes a
    /// new one beside it (an arena import whose arena is closing), an error fails the lookup
    /// (the import's exporter is gone). `create` runs under the creation lock, so that threads
    /// importing one key at once make one import.
    ///
    /// # Errors
    ///
    /// What `reuse` or `create` returns.
    pub(crate) fn get_or_create(
        &self,
        key: &K,
        reuse: impl Fn(&Arc<V>) -> Result<bool>,
        create: impl FnOnce() -> Result<Arc<V>>,
    ) -> Result<Arc<V>> {
        if let Some(hit) = self.find(key, &reuse)? {
            return Ok(hit);
        }
        let _creating = self.creating.lock();
        if let Some(hit) = self.find(key, &reuse)? {
            return Ok(hit);
        }
        let import = create()?;
        self.entries
            .lock()
            .entry(key.clone())
            .or_default()
            .push(Arc::downgrade(&import));
        Ok(import)
    }

    /// Forget the entries of `key` whose import is gone (called by an import's `Drop`, after
    /// its teardown: from then on the key imports anew).
    pub(crate) fn forget(&self, key: &K) {
        let mut entries = self.entries.lock();
        if let Some(list) = entries.get_mut(key) {
            list.retain(|w| w.strong_count() > 0);
            if list.is_empty() {
                entries.remove(key);
            }
        }
    }

    /// A live import `reuse` accepts; `None` when there is none (after waiting out a dying one
    /// under [`Dying::WaitForIt`]) or `reuse` refused it.
    fn find(&self, key: &K, reuse: &impl Fn(&Arc<V>) -> Result<bool>) -> Result<Option<Arc<V>>> {
        loop {
            match self.lookup(key) {
                Found::Live(import) => return Ok(reuse(&import)?.then_some(import)),
                Found::Dying if self.dying == Dying::WaitForIt => std::thread::yield_now(),
                Found::Dying | Found::Absent => return Ok(None),
            }
        }
    }

    fn lookup(&self, key: &K) -> Found<V> {
        let entries = self.entries.lock();
        match entries.get(key) {
            None => Found::Absent,
            // The upgraded import leaves with the return value; the guard drops first.
            Some(list) => list
                .iter()
                .find_map(Weak::upgrade)
                .map_or(Found::Dying, Found::Live),
        }
    }

    /// How many keys have entries (for tests).
    #[cfg(all(test, not(loom)))]
    fn keys(&self) -> usize {
        self.entries.lock().len()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// An import that forgets itself when dropped, as the real ones do.
    struct Import {
        key: u32,
        cache: &'static ImportCache<u32, Import>,
    }

    impl Drop for Import {
        fn drop(&mut self) {
            self.cache.forget(&self.key);
        }
    }

    fn leak(dying: Dying) -> &'static ImportCache<u32, Import> {
        Box::leak(Box::new(ImportCache::new(dying)))
    }

    #[test]
    fn a_second_import_of_a_key_shares_the_first_and_the_last_drop_forgets_it() {
        let cache = leak(Dying::WaitForIt);
        let made = AtomicUsize::new(0);
        let make = || {
            made.fetch_add(1, Ordering::Relaxed);
            Ok(Arc::new(Import { key: 7, cache }))
        };
        let a = cache.get_or_create(&7, |_| Ok(true), make).unwrap();
        let b = cache.get_or_create(&7, |_| Ok(true), make).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(made.load(Ordering::Relaxed), 1);
        drop(a);
        assert_eq!(cache.keys(), 1);
        drop(b);
        assert_eq!(cache.keys(), 0, "the last drop forgot the key");
        let _c = cache.get_or_create(&7, |_| Ok(true), make).unwrap();
        assert_eq!(made.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_refused_hit_makes_a_new_import_beside_it_and_an_error_fails_the_lookup() {
        let cache = leak(Dying::Coexist);
        let a = cache
            .get_or_create(&1, |_| Ok(true), || Ok(Arc::new(Import { key: 1, cache })))
            .unwrap();
        let b = cache
            .get_or_create(&1, |_| Ok(false), || Ok(Arc::new(Import { key: 1, cache })))
            .unwrap();
        assert!(!Arc::ptr_eq(&a, &b));
        drop(a);
        // The refused one's drop forgot only itself: the new one is still found.
        let c = cache
            .get_or_create(&1, |_| Ok(true), || unreachable!("b is live"))
            .unwrap();
        assert!(Arc::ptr_eq(&b, &c));
        let refused = cache.get_or_create(
            &1,
            |_| Err(crate::Error::StaleHandle { generation: 3 }),
            || unreachable!("the error ends the lookup"),
        );
        assert!(matches!(
            refused,
            Err(crate::Error::StaleHandle { generation: 3 })
        ));
    }

    #[test]
    fn a_failed_create_registers_nothing() {
        let cache = leak(Dying::WaitForIt);
        let failed = cache.get_or_create(
            &2,
            |_| Ok(true),
            || Err(crate::Error::StaleHandle { generation: 1 }),
        );
        assert!(failed.is_err());
        assert_eq!(cache.keys(), 0);
    }

    #[test]
    fn threads_importing_one_key_at_once_make_one_import() {
        let cache = leak(Dying::WaitForIt);
        let made: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        let imports: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(move || {
                    cache
                        .get_or_create(
                            &9,
                            |_| Ok(true),
                            || {
                                made.fetch_add(1, Ordering::Relaxed);
                                std::thread::sleep(std::time::Duration::from_millis(20));
                                Ok(Arc::new(Import { key: 9, cache }))
                            },
                        )
                        .unwrap()
                })
            })
            .map(|t| t.join().unwrap())
            .collect();
        assert_eq!(made.load(Ordering::Relaxed), 1);
        assert!(imports.iter().all(|i| Arc::ptr_eq(i, &imports[0])));
    }

    /// Under `WaitForIt`, a lookup that finds only an import being torn down waits until its
    /// `Drop` forgot it, then imports anew: never a second import overlapping the first's
    /// teardown.
    #[test]
    fn a_dying_import_is_waited_for_and_never_overlapped() {
        struct Slow {
            key: u32,
            cache: &'static ImportCache<u32, Slow>,
            live: &'static AtomicUsize,
        }
        static TEARING_DOWN: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(false);
        impl Drop for Slow {
            fn drop(&mut self) {
                TEARING_DOWN.store(true, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(50));
                assert_eq!(self.live.fetch_sub(1, Ordering::SeqCst), 1, "overlapped");
                self.cache.forget(&self.key);
            }
        }
        let cache: &'static ImportCache<u32, Slow> =
            Box::leak(Box::new(ImportCache::new(Dying::WaitForIt)));
        let live: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        let make = || {
            assert_eq!(live.fetch_add(1, Ordering::SeqCst), 0, "overlapped");
            Ok(Arc::new(Slow {
                key: 5,
                cache,
                live,
            }))
        };
        let first = cache.get_or_create(&5, |_| Ok(true), make).unwrap();
        let dropper = std::thread::spawn(move || drop(first));
        while !TEARING_DOWN.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let second = cache.get_or_create(&5, |_| Ok(true), make).unwrap();
        dropper.join().unwrap();
        assert_eq!(live.load(Ordering::SeqCst), 1);
        drop(second);
    }
}

/// Shared tables this process mapped, by export token, kept after their last user is gone so
/// that opening the same export again skips the table's `open`, `fstat` and `mmap` (tens of
/// µs, a cold open's worth of overhead). Tokens are random and never reused, so a cached table
/// is always the right one; one whose owner has begun closing it is dropped when next looked
/// at. Bounded: past [`MAX_CACHED_TABLES`], the oldest go first. (A table's mapping is all
/// its drop undoes: importers never own the name.)
pub(crate) struct TableCache<T: ShmSafe> {
    tables: Mutex<Vec<CachedTable<T>>>,
    /// Whether a table's owner has begun closing it.
    closing: fn(&T) -> bool,
}

/// A cached table and the token that names it.
type CachedTable<T> = ([u8; 16], Arc<ShmRegion<T>>);

/// How many tables each [`TableCache`] keeps.
const MAX_CACHED_TABLES: usize = 64;

impl<T: ShmSafe> TableCache<T> {
    /// An empty cache; `closing` says whether a table's owner has begun closing it.
    pub(crate) const fn new(closing: fn(&T) -> bool) -> Self {
        Self {
            tables: parking_lot::const_mutex(Vec::new()),
            closing,
        }
    }

    /// The table of `token`: the cached one, unless its owner is closing it, else one `open`ed
    /// now (outside the lock) and cached (tables whose owners are closing them dropped then, so
    /// a hit looks at its own entry only).
    ///
    /// # Errors
    ///
    /// What `open` returns.
    pub(crate) fn get_or_open(
        &self,
        token: &[u8; 16],
        open: impl FnOnce() -> Result<ShmRegion<T>>,
    ) -> Result<Arc<ShmRegion<T>>> {
        {
            let mut tables = self.tables.lock();
            if let Some(i) = tables.iter().position(|(t, _)| t == token) {
                if !(self.closing)(&tables[i].1) {
                    return Ok(tables[i].1.clone());
                }
                tables.remove(i);
            }
        }
        let table = Arc::new(open()?);
        let mut tables = self.tables.lock();
        if let Some((_, t)) = tables.iter().find(|(t, _)| t == token) {
            return Ok(t.clone()); // another thread opened it meanwhile: keep one mapping
        }
        tables.retain(|(_, t)| !(self.closing)(t));
        if tables.len() >= MAX_CACHED_TABLES {
            tables.remove(0);
        }
        tables.push((*token, table.clone()));
        Ok(table)
    }

    /// Stop caching the table of `token`.
    pub(crate) fn forget(&self, token: &[u8; 16]) {
        self.tables.lock().retain(|(t, _)| t != token);
    }
}
