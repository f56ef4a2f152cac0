//! The process-wide cache of imports: one import per key per process, shared by every view.
//!
//! Buffers (one driver mapping per export and context), arenas (one mapping and importer slot
//! per arena, context and access), pools (one driver import per pool) and exporters' ledgers
//! (one lease per exporter) are each imported once per process and shared; each kind keeps one
//! [`ImportCache`] of [`Weak`] entries, so the cache never keeps an import alive. The rules,
//! written once here:
//!
//! - **Hits take no creation lock**: a lookup under the entries' lock; the kind checks the hit
//!   (is the export closing, is its exporter alive, does the handle describe the same memory)
//!   outside it. The cache never runs a caller's code: [`ImportCache::entry`] hands back a hit
//!   or a [`Vacancy`] — the creation lock — that the caller fills with the import it made.
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

use parking_lot::{Mutex, MutexGuard};

use crate::shm::ShmRegion;
use crate::shm_safe::ShmSafe;

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

/// What [`ImportCache::entry`] found for a key.
pub(crate) enum Entry<'a, K: Ord + Clone, V> {
    /// A live import, for the caller to check and share.
    Live(Arc<V>),
    /// None: the caller creates one and [`fill`](Vacancy::fill)s the vacancy.
    Vacant(Vacancy<'a, K, V>),
}

/// The right to create the import of one key: the cache's creation lock, held until the import
/// is registered ([`fill`](Self::fill)) or the vacancy dropped (a failed creation registers
/// nothing).
pub(crate) struct Vacancy<'a, K: Ord + Clone, V> {
    cache: &'a ImportCache<K, V>,
    key: K,
    _creating: MutexGuard<'a, ()>,
}

impl<K: Ord + Clone, V> Vacancy<'_, K, V> {
    /// Register `import` under the key; later lookups share it. Returns it.
    pub(crate) fn fill(self, import: Arc<V>) -> Arc<V> {
        crate::trace::event!("import cache miss: imported");
        self.cache
            .entries
            .lock()
            .entry(self.key)
            .or_default()
            .push(Arc::downgrade(&import));
        import
    }
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

    /// The live import of `key` for the caller to check, else the right to create one: a first
    /// look without the creation lock (a hit costs the entries' lock alone), then, on a miss,
    /// the creation lock and a second look, so that threads importing one key at once make one
    /// import. The caller checks a hit itself (is the export closing, does the handle describe
    /// the same memory) and either shares it, fails, or — where imports coexist — makes one
    /// beside it through [`vacancy`](Self::vacancy). Nothing here runs the caller's code.
    pub(crate) fn entry(&self, key: &K) -> Entry<'_, K, V> {
        if let Some(hit) = self.live(key) {
            crate::trace::event!("import cache hit");
            return Entry::Live(hit);
        }
        let creating = self.creating.lock();
        match self.live(key) {
            Some(hit) => {
                crate::trace::event!("import cache hit (made meanwhile by another thread)");
                Entry::Live(hit)
            }
            None => Entry::Vacant(Vacancy {
                cache: self,
                key: key.clone(),
                _creating: creating,
            }),
        }
    }

    /// The right to create an import of `key` beside a live one the caller refused (an arena
    /// import whose arena is closing; only under [`Dying::Coexist`]).
    pub(crate) fn vacancy(&self, key: &K) -> Vacancy<'_, K, V> {
        debug_assert_eq!(
            self.dying,
            Dying::Coexist,
            "one import per key: never beside"
        );
        Vacancy {
            cache: self,
            key: key.clone(),
            _creating: self.creating.lock(),
        }
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

    /// A live import of `key`; `None` when there is none (after waiting out a dying one under
    /// [`Dying::WaitForIt`]).
    fn live(&self, key: &K) -> Option<Arc<V>> {
        loop {
            match self.lookup(key) {
                Found::Live(import) => return Some(import),
                Found::Dying if self.dying == Dying::WaitForIt => std::thread::yield_now(),
                Found::Dying | Found::Absent => return None,
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
    #[cfg(all(test, not(cuda_ipc_loom)))]
    fn keys(&self) -> usize {
        self.entries.lock().len()
    }
}

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::error::Result;

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

    /// What every kind does with the cache: share a live import, else make one and fill the
    /// vacancy.
    fn open<V>(
        cache: &ImportCache<u32, V>,
        key: u32,
        make: impl FnOnce() -> Result<Arc<V>>,
    ) -> Result<Arc<V>> {
        match cache.entry(&key) {
            Entry::Live(hit) => Ok(hit),
            Entry::Vacant(vacancy) => Ok(vacancy.fill(make()?)),
        }
    }

    #[test]
    fn a_second_import_of_a_key_shares_the_first_and_the_last_drop_forgets_it() {
        let cache = leak(Dying::WaitForIt);
        let made = AtomicUsize::new(0);
        let make = || {
            made.fetch_add(1, Ordering::Relaxed);
            Ok(Arc::new(Import { key: 7, cache }))
        };
        let a = open(cache, 7, make).unwrap();
        let b = open(cache, 7, make).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(made.load(Ordering::Relaxed), 1);
        drop(a);
        assert_eq!(cache.keys(), 1);
        drop(b);
        assert_eq!(cache.keys(), 0, "the last drop forgot the key");
        let _c = open(cache, 7, make).unwrap();
        assert_eq!(made.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_refused_hit_gets_a_new_import_beside_it_which_later_lookups_find() {
        let cache = leak(Dying::Coexist);
        let a = open(cache, 1, || Ok(Arc::new(Import { key: 1, cache }))).unwrap();
        let Entry::Live(hit) = cache.entry(&1) else {
            panic!("a is live")
        };
        assert!(Arc::ptr_eq(&a, &hit));
        drop(hit);
        // The caller refuses the hit (its arena is closing) and makes one beside it.
        let b = cache.vacancy(&1).fill(Arc::new(Import { key: 1, cache }));
        assert!(!Arc::ptr_eq(&a, &b));
        drop(a);
        // The refused one's drop forgot only itself: the new one is still found.
        let c = open(cache, 1, || unreachable!("b is live")).unwrap();
        assert!(Arc::ptr_eq(&b, &c));
    }

    #[test]
    fn a_failed_create_registers_nothing_and_frees_the_vacancy() {
        let cache = leak(Dying::WaitForIt);
        let failed = open(cache, 2, || {
            Err(crate::Error::StaleHandle { generation: 1 })
        });
        assert!(failed.is_err());
        assert_eq!(cache.keys(), 0);
        // The creation lock went with the dropped vacancy: the next import is made.
        let made = open(cache, 2, || Ok(Arc::new(Import { key: 2, cache })));
        assert!(made.is_ok());
    }

    #[test]
    fn threads_importing_one_key_at_once_make_one_import() {
        let cache = leak(Dying::WaitForIt);
        let made: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        let imports: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(move || {
                    open(cache, 9, || {
                        made.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        Ok(Arc::new(Import { key: 9, cache }))
                    })
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
        let first = open(cache, 5, make).unwrap();
        let dropper = std::thread::spawn(move || drop(first));
        while !TEARING_DOWN.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let second = open(cache, 5, make).unwrap();
        dropper.join().unwrap();
        assert_eq!(live.load(Ordering::SeqCst), 1);
        drop(second);
    }
}

/// Shared tables this process mapped, by export token, kept after their last user is gone so
/// that opening the same export again skips the table's `open`, `fstat` and `mmap` (tens of
/// µs, a cold open's worth of overhead). Tokens are random and never reused, so a cached table
/// is always the right one; whether its owner has begun closing it is the caller's to look at
/// ([`cached`](Self::cached)), which then opens the table again or [`forget`](Self::forget)s
/// it. Bounded: past [`MAX_CACHED_TABLES`], the oldest go first. (A table's mapping is all its
/// drop undoes: importers never own the name.)
pub(crate) struct TableCache<T: ShmSafe> {
    tables: Mutex<Vec<CachedTable<T>>>,
}

/// A cached table and the token that names it.
type CachedTable<T> = ([u8; 16], Arc<ShmRegion<T>>);

/// How many tables each [`TableCache`] keeps.
const MAX_CACHED_TABLES: usize = 64;

impl<T: ShmSafe> TableCache<T> {
    /// An empty cache.
    pub(crate) const fn new() -> Self {
        Self {
            tables: parking_lot::const_mutex(Vec::new()),
        }
    }

    /// The cached table of `token`, if one is.
    pub(crate) fn cached(&self, token: &[u8; 16]) -> Option<Arc<ShmRegion<T>>> {
        let tables = self.tables.lock();
        tables
            .iter()
            .find(|(t, _)| t == token)
            .map(|(_, t)| t.clone())
    }

    /// Cache `table`, opened by the caller for `token` (outside any lock), in place of one
    /// cached before.
    pub(crate) fn keep(&self, token: &[u8; 16], table: ShmRegion<T>) -> Arc<ShmRegion<T>> {
        let table = Arc::new(table);
        let mut tables = self.tables.lock();
        tables.retain(|(t, _)| t != token);
        if tables.len() >= MAX_CACHED_TABLES {
            tables.remove(0);
        }
        tables.push((*token, table.clone()));
        table
    }

    /// Stop caching the table of `token`.
    pub(crate) fn forget(&self, token: &[u8; 16]) {
        self.tables.lock().retain(|(t, _)| t != token);
    }
}
