//! What is holding my memory? A live view of what this user's processes share on the machine:
//! each exporter and its exports, who imports them, which frees wait for whom, each channel's
//! producer, consumers and items in flight, and the names in `/dev/shm` a sweep would remove.
//!
//! When GPU memory is not freed, `nvidia-smi` tells how much each process holds, not why. The
//! crate already records the why — checksummed, owner-checked tables in `/dev/shm` — and
//! [`snapshot`] reads them:
//!
//! ```no_run
//! let snap = cuda_ipc::inspect::snapshot()?;
//! print!("{snap}"); // the tree below; `snap.to_json()` for programs
//! for table in snap.exporters.iter().flat_map(|e| &e.tables) {
//!     for export in table.exports.iter().filter(|x| x.is_deferred()) {
//!         println!("block {} of {} waits for slots {:?}", export.block, table.token, export.holders);
//!     }
//! }
//! # Ok::<(), cuda_ipc::Error>(())
//! ```
//!
//! or, from a shell, `cargo run --example doctor -- --live` (`--json`, `--watch`) and
//! `python -m cuda_ipc inspect`:
//!
//! ```text
//! cuda-ipc on this machine: 2 exporters, 1 channel, 1 other region
//! exporter pid 4021 (alive): trainer --shards 8
//!   arena of 64.0 MiB 9c3e…41d0: 3 exports, 2 importers
//!     export 0 (generation 1): arena on GPU-4a3b00ff, 1.0 MiB at 0, held by slot 0
//!     export 1 (generation 1): arena on GPU-4a3b00ff, 4.0 KiB at 1048576
//!     export 2 (generation 3, freed; the free waits for slot 1): arena on GPU-4a3b00ff, 2.0 MiB at 2097152
//!     importer slot 0: pid 4107 (alive): engine --rank 0
//!     importer slot 1: pid 4109 (DEAD: the exporter's next collect reaps it)
//! exporter pid 3990 (DEAD); the next export on this machine removes its tables
//!   export registry 77aa…0000: 1 export, 0 importers
//!     export 0 (generation 1): fd on GPU-4a3b00ff, 256.0 MiB, read-only
//! channel cuda-ipc-chan.5f1b02c4a9e7d310: 4 slots of 1024 elements (4 bytes each), 9 items sent, broadcast
//!   producer pid 4021 (alive): trainer --shards 8 — asleep until a consumer releases
//!   consumer entry 0: pid 4107 (alive): engine --rank 0: released 5, 4 in flight (the ring is full)
//! region my-app.3f9a (4.1 KiB): created by pid 3870 (DEAD): shm::reclaim_stale removes it
//! unlinked cuda-ipc-chan.0b77d1e2c3a49f10 (its name removed), mapped by:
//!   pid 4021 (alive): trainer --shards 8
//!   pid 4108 (alive): engine --rank 1
//! ```
//!
//! # What it reads, and what it does not touch
//!
//! Only this user's files in `/dev/shm`, opened **read-only** and copied out with `pread` (no
//! mapping a peer could shrink under us, no lock or word a peer waits on): a snapshot cannot
//! slow, block or change anything it looks at. Each file is read twice; if the two copies
//! differ (a peer wrote in between), again, up to four times, and a table still changing is
//! shown as last read with `changing` set. Every word in a copy is a peer's and is treated so:
//! a file with the crate's table names whose bytes do not decode (a bad header, a wrong size,
//! a count out of range) is listed in [`Snapshot::unreadable`] with the reason; files that
//! are not the crate's (no header of ours: the driver's `cuda.shm.*`, PyTorch's `torch_*`)
//! are left out.
//!
//! # What each table tells
//!
//! - An **export table** is a pair of files named after one random token: the block table
//!   (`cuda-ipc-arena.<token>`: per export a generation, odd while live, and a 64-bit mask of
//!   the importers holding it) and the lease table (`cuda-ipc-lease.<token>`: one slot per
//!   importing process, naming it). A process has one **export registry** for every
//!   [`IpcBuffer`](crate::IpcBuffer) and [`IpcSignal`](crate::IpcSignal) it exports (its token
//!   ends in four zero bytes; a pool's, whose exports say they are a pool's, one time in 2³²),
//!   and one table per [`IpcArena`](crate::arena::IpcArena) (it has
//!   a capacity) and per [`IpcPool`](crate::pool::IpcPool). Each export says its
//!   [kind](ExportKind) (legacy, fd, pool, arena, a channel's slots, a signal), the device
//!   that holds it, its size and whether importers may only read it. [`IpcEvent`](crate::IpcEvent)s
//!   are not listed: the driver's event handles carry no lifetime an exporter could book.
//! - An export whose generation is even was **freed** by its exporter; if importers' bits are
//!   still set, its free is **deferred** ([`Export::is_deferred`]) until they let go — or, for
//!   importers that died, until the exporter's next collect reaps them.
//! - A **channel** (`cuda-ipc-chan…`) tells its producer and consumer entries (each a process),
//!   the items sent and each consumer's items released — the difference is in flight — and
//!   whether a thread sleeps on either side: a producer asleep with a full ring waits for a
//!   consumer's release. Snapshots taken by a [`Watch`] (`--watch`) also say how long each
//!   channel's counts have stood still: items in flight that have not moved for long are a
//!   consumer stuck, none in flight an idle channel. A broadcast channel keeps its name for its
//!   whole life; a channel with one consumer is read by name until that consumer attaches,
//!   which removes the name (nobody else may attach): from then on it is listed under
//!   [`Snapshot::unlinked`] with the processes that map it (from `/proc/<pid>/maps`), and its
//!   contents are read through one of them (`/proc/<pid>/map_files`, which the kernel opens
//!   only for root or a process with `CAP_CHECKPOINT_RESTORE`: for anyone else the channel is
//!   only listed as unlinked).
//! - Any other region of the crate (a [`ProcessBarrier`](crate::barrier::ProcessBarrier), a
//!   user's [`ShmRegion`](crate::shm::ShmRegion)) tells its creator only.
//!
//! A process is named by pid and start time (so a reused pid is not mistaken for it), with its
//! command line and whether it is alive now.
//!
//! # Tracing: what happened, as it happens
//!
//! A snapshot tells who holds what now; the `tracing` feature tells how it came to be. With it,
//! the crate raises a [`tracing`](https://docs.rs/tracing) span or event at `DEBUG` level at
//! each point below, under the target of the module that raises it (all under `cuda_ipc`), so
//! any subscriber shows them — `tracing_subscriber::fmt().with_env_filter("cuda_ipc=debug")`,
//! say. Without the feature they compile to nothing; with it and no subscriber each costs one
//! check of the global level (BENCHMARKS.md measures both).
//!
//! | Span or event | Raised | Fields |
//! |---------------|--------|--------|
//! | `export published` / `export refused: the table is full` | a buffer's or signal's first handle, an arena or pool allocation | `kind`, `device`, `read_only`, `bytes`, `block`, `generation` |
//! | span `open`, and in it `import cache hit` or `import cache miss: imported`, or `open refused` | every open of a handle (buffer, signal, event, arena, pool, a raw legacy handle) | `kind`, `bytes`, `exporter` (pid), `generation`; the refusal's `error` |
//! | `import closed: its last view let go` | an importer's last view of an export dropped | `block`, `generation`, `unmapped` |
//! | `export retired` | an exported buffer, signal, arena buffer or pool allocation freed | `block`, `generation`, `bytes`, `held` (importers still hold it) |
//! | `free deferred: importers hold the buffer`, then `deferred free done` | a buffer dropped while mapped elsewhere, and the collect that frees it | `bytes`, `importers` (pids); `freed` |
//! | `quarantine over: the block's importers are gone` | a held export's last importer let go or was reaped | `block`, `generation`, `bytes` |
//! | `dead importer reaped` | a collect took the lease of an importer proven dead | `slot`, `pid` |
//! | `peer gone` | every [`Error::PeerGone`](crate::Error::PeerGone) this process makes | `pid`, `role` |
//! | span `wait`, closed by `wait ended` | every wait, blocking or awaited: a channel's acquire and receive, a barrier, a signal's or event's host wait, a socket's accept, connect and receive, a [`WaitSet`](crate::wait::WaitSet), NCCL work, a close waiting for importers | `what`; `waited_us`, `ended` (`done`, `timeout`, `peer_gone`, `closed`, `error`, or `cancelled`: a future dropped while pending) |

use std::collections::BTreeMap;
use std::fmt;

use crate::channel::ring::{RingCensus, RingState};
use crate::error::Result;
pub use crate::ledger::ExportKind;
use crate::ledger::{BlockCensus, BlockTable, BlockWords, Label, LeaseCensus, LeaseTable};
use crate::os;
use crate::owned_slot::OwnerState;
use crate::process::ProcessIdentity;

pub(crate) mod parse;
mod render;
mod watch;

pub use watch::Watch;

use parse::Parsed;

/// How many times a file is read before a table still changing is reported as read last.
const READS: usize = 4;
/// The longest command line a snapshot keeps, in characters.
const COMMAND_MAX: usize = 160;

/// What this user's processes share on the machine, read at one moment (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// Every process with an export table, by pid.
    pub exporters: Vec<Exporter>,
    /// Every channel, by name.
    pub channels: Vec<Channel>,
    /// The crate's other regions (barriers, users' regions), by name.
    pub regions: Vec<Region>,
    /// Files named as the crate's tables whose bytes do not decode, with the reason.
    pub unreadable: Vec<Unreadable>,
    /// The crate's regions whose names are gone from `/dev/shm` but which processes still map,
    /// by name.
    pub unlinked: Vec<Unlinked>,
}

/// A process, as a table names it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Process {
    /// Its pid.
    pub pid: u32,
    /// Its start time (clock ticks after boot): with the pid, which process this is.
    pub start_time: u64,
    /// Its command line (arguments joined by spaces, cut to 160 characters), if readable.
    pub command: Option<String>,
    /// Whether it is alive now (the same pid started at the same time).
    pub alive: bool,
}

/// A process that exports, and its export tables.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Exporter {
    /// The exporting process.
    pub process: Process,
    /// Its export tables (a registry, arenas, pools), by token.
    pub tables: Vec<ExportTable>,
}

/// What an export table belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum TableKind {
    /// A process's export registry: its [`IpcBuffer`](crate::IpcBuffer)s and
    /// [`IpcSignal`](crate::IpcSignal)s.
    Registry,
    /// An [`IpcArena`](crate::arena::IpcArena)'s buffers.
    Arena,
    /// An [`IpcPool`](crate::pool::IpcPool)'s buffers.
    Pool,
}

/// One export table: a block table and its lease table, named after one token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExportTable {
    /// The token in hex (the tables are `cuda-ipc-arena.<token>` and `cuda-ipc-lease.<token>`).
    pub token: String,
    /// What the table belongs to.
    pub kind: TableKind,
    /// An arena's size in bytes (0 for a registry or a pool).
    pub capacity: u64,
    /// The owner has closed the table: nothing more is exported through it.
    pub closing: bool,
    /// Every export published in the table, live or freed, by block.
    pub exports: Vec<Export>,
    /// Every importer holding (or claiming) a lease, by slot.
    pub importers: Vec<Importer>,
    /// Whether the block table and the lease table were found (`false`: that file is gone).
    pub files: (bool, bool),
    /// A peer wrote while the table was read, four times over: shown as last read.
    pub changing: bool,
}

/// One export in a table.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Export {
    /// Its block index (a handle names the table, the block and the generation).
    pub block: u32,
    /// The generation its handles carry (odd).
    pub generation: u64,
    /// Whether it is live (openable); `false`: its exporter freed it.
    pub live: bool,
    /// What it is; `None` where its block's label does not decode (a peer wrote it).
    pub kind: Option<ExportKind>,
    /// The device holding it, as `nvidia-smi -L` begins its UUID (`GPU-` and 8 hex digits);
    /// `None` with `kind`.
    pub device: Option<String>,
    /// Whether importers may only read it (as marked when it was published, or since).
    pub read_only: bool,
    /// An arena buffer's byte offset in the arena (0 otherwise).
    pub offset: u64,
    /// Its size in bytes (an arena buffer's rounded up to the arena's alignment).
    pub bytes: u64,
    /// The lease slots of the importers holding it ([`ExportTable::importers`]).
    pub holders: Vec<u32>,
}

impl Export {
    /// Whether its exporter freed it while importers still hold it: the memory stays until
    /// they let go, or until the exporter reaps those that died.
    #[must_use]
    pub fn is_deferred(&self) -> bool {
        !self.live && !self.holders.is_empty()
    }
}

/// An importing process's lease on an export table.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Importer {
    /// Its slot: its bit in every export's holders.
    pub slot: u32,
    /// The importing process.
    pub process: Process,
    /// Still claiming (between taking the slot and holding it).
    pub claiming: bool,
}

/// A channel's ring.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Channel {
    /// The region's name.
    pub name: String,
    /// The process that created it.
    pub creator: Process,
    /// Slots in the ring.
    pub slots: u64,
    /// Elements a slot holds.
    pub capacity: u64,
    /// Bytes an element takes.
    pub elem_size: u64,
    /// Whether consumers attach and leave (a broadcast channel).
    pub broadcast: bool,
    /// The producer, if one holds the channel.
    pub producer: Option<Process>,
    /// Items sent so far.
    pub sent: u64,
    /// Consumer threads asleep waiting for an item.
    pub consumers_waiting: u32,
    /// Every consumer entry in use, by entry.
    pub consumers: Vec<Consumer>,
    /// A peer wrote while the ring was read, four times over: shown as last read.
    pub changing: bool,
    /// Under a [`Watch`]: how long its counts have stood still (since the watch first saw it
    /// at most); `None` in a single [`snapshot`].
    pub unchanged_for: Option<std::time::Duration>,
    /// Its name is gone (a one-consumer channel whose consumer attached): read through a
    /// process that maps it (`/proc/<pid>/map_files`, which the kernel opens only for root or
    /// `CAP_CHECKPOINT_RESTORE`; without it the channel is only in [`Snapshot::unlinked`]).
    pub unlinked: bool,
}

/// A consumer's entry in a channel.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Consumer {
    /// The entry's index.
    pub entry: u32,
    /// The consuming process.
    pub process: Process,
    /// It left (a broadcast consumer that detached; the entry still names it).
    pub left: bool,
    /// Items it has released.
    pub released: u64,
    /// Items sent and not yet released by it.
    pub in_flight: u64,
    /// Producer threads asleep waiting for this consumer's release.
    pub producer_waiting: u32,
}

/// Another region of the crate: a barrier, a user's region.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Region {
    /// Its name in `/dev/shm`.
    pub name: String,
    /// The process that created it.
    pub creator: Process,
    /// Its size in bytes.
    pub bytes: u64,
}

/// A region of the crate whose name was removed while processes still map it: a channel with
/// one consumer once that consumer attached (the consumer removes the name, so nobody else
/// attaches), or the tables of an exporter whose last importer removed them. Its bytes cannot
/// be read by name any more; `/proc/<pid>/maps` tells who maps it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unlinked {
    /// Its former name in `/dev/shm`.
    pub name: String,
    /// This user's processes that map it, by pid.
    pub mapped_by: Vec<Process>,
}

/// A file named as one of the crate's tables whose bytes do not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unreadable {
    /// Its name in `/dev/shm`.
    pub name: String,
    /// Why it does not decode.
    pub reason: String,
}

/// Read what this user's processes share on the machine (see the module docs): every region
/// of the crate in `/dev/shm`, copied read-only, decoded, and joined by token and process; and
/// the crate's regions whose names are gone, from this user's processes' `/proc/<pid>/maps`.
///
/// # Errors
///
/// [`Error::Os`](crate::Error::Os) if `/dev/shm` cannot be listed. A file that cannot be
/// read or does not decode is not an error: it is listed in [`Snapshot::unreadable`] (or, if
/// it is not the crate's, left out).
///
/// # Examples
///
/// ```no_run
/// let snap = cuda_ipc::inspect::snapshot()?;
/// let deferred = snap
///     .exporters
///     .iter()
///     .flat_map(|e| &e.tables)
///     .flat_map(|t| &t.exports)
///     .filter(|x| x.is_deferred())
///     .count();
/// println!("{deferred} frees wait for importers");
/// # Ok::<(), cuda_ipc::Error>(())
/// ```
pub fn snapshot() -> Result<Snapshot> {
    let mut names = os::shm_names()?;
    names.sort();
    let mut people = People::default();
    let mut snap = Snapshot::default();
    // Export tables by token: (block table, lease table), each with its creator.
    let mut tables: BTreeMap<String, Pair> = BTreeMap::new();
    for name in names {
        let Some((copy, changing, size)) = read_named(&name) else {
            continue;
        };
        let Some((creator, parsed)) = parse::parse(&name, &copy) else {
            continue;
        };
        match parsed {
            Parsed::Foreign(reason) => snap.unreadable.push(Unreadable { name, reason }),
            Parsed::Blocks(blocks) => {
                let token = token_of(&name, crate::shm::BLOCK_TABLES);
                let pair = tables.entry(token).or_default();
                pair.blocks = Some((creator, blocks));
                pair.changing |= changing;
            }
            Parsed::Leases(leases) => {
                let token = token_of(&name, crate::shm::LEASE_TABLES);
                let pair = tables.entry(token).or_default();
                pair.leases = Some((creator, leases));
                pair.changing |= changing;
            }
            Parsed::Ring(ring) => {
                snap.channels
                    .push(channel(name, &creator, &ring, changing, &mut people))
            }
            Parsed::Other => snap.regions.push(Region {
                name,
                creator: people.get(&creator),
                bytes: size,
            }),
        }
    }
    let mut exporters: BTreeMap<(u32, u64), Exporter> = BTreeMap::new();
    for (token, pair) in tables {
        let (owner, table) = export_table(token, pair, &mut people);
        exporters
            .entry((owner.pid(), owner.start_time()))
            .or_insert_with(|| Exporter {
                process: people.get(&owner),
                tables: Vec::new(),
            })
            .tables
            .push(table);
    }
    snap.exporters = exporters.into_values().collect();
    let (unlinked, channels) = unlinked(&mut people);
    snap.unlinked = unlinked;
    snap.channels.extend(channels);
    Ok(snap)
}

impl Snapshot {
    /// The snapshot as one JSON object: `exporters`, `channels`, `regions`, `unreadable`,
    /// `unlinked`, each an array of objects with the fields of the types here (`kind` in lower
    /// case).
    #[must_use]
    pub fn to_json(&self) -> String {
        render::json(self)
    }
}

impl fmt::Display for Snapshot {
    /// The snapshot as a tree, one line per process, table, export, importer, channel end and
    /// region (the module docs show one).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        render::tree(self, f)
    }
}

/// A block table and a lease table of one token, as found.
#[derive(Default)]
struct Pair {
    blocks: Option<(ProcessIdentity, BlockCensus)>,
    leases: Option<(ProcessIdentity, LeaseCensus)>,
    changing: bool,
}

/// The table of one token and the process that owns it (the block table's creator, else the
/// exporter the lease table names).
fn export_table(token: String, pair: Pair, people: &mut People) -> (ProcessIdentity, ExportTable) {
    let owner = match (&pair.blocks, &pair.leases) {
        (Some((creator, _)), _) => *creator,
        (None, Some((_, leases))) => leases.exporter,
        (None, None) => ProcessIdentity::from_parts(0, 0),
    };
    let (capacity, closing, exports) = match &pair.blocks {
        Some((_, b)) => (
            b.capacity,
            b.closing,
            b.blocks.iter().map(|(i, w)| export(*i, w)).collect(),
        ),
        None => (0, false, Vec::new()),
    };
    let importers = pair.leases.as_ref().map_or_else(Vec::new, |(_, leases)| {
        leases
            .slots
            .iter()
            .map(|&(slot, state, id)| Importer {
                slot,
                process: people.get(&id),
                claiming: state == OwnerState::Claiming,
            })
            .collect()
    });
    // An arena has a capacity; a pool's exports say so (where it has any); a registry's token
    // ends in four zero bytes (a pool's does one time in 2^32).
    let pooled = exports
        .iter()
        .any(|x: &Export| x.kind == Some(ExportKind::Pool));
    let kind = if capacity > 0 {
        TableKind::Arena
    } else if pooled || !token.ends_with("00000000") {
        TableKind::Pool
    } else {
        TableKind::Registry
    };
    let table = ExportTable {
        token,
        kind,
        capacity,
        closing: closing || pair.leases.as_ref().is_some_and(|(_, l)| l.closing),
        exports,
        importers,
        files: (pair.blocks.is_some(), pair.leases.is_some()),
        changing: pair.changing,
    };
    (owner, table)
}

/// Block `block`'s words as an export.
fn export(block: u32, w: &BlockWords) -> Export {
    let live = crate::ledger::names_a_live_export(w.state);
    let label = Label::of_word(w.label);
    Export {
        block,
        generation: if live {
            w.state
        } else {
            w.state.saturating_sub(1)
        },
        live,
        kind: label.map(|l| l.kind),
        device: label.map(|l| l.device_name()),
        read_only: label.is_some_and(|l| l.read_only),
        offset: w.offset,
        bytes: w.bytes,
        holders: (0..64u32).filter(|bit| w.holders >> bit & 1 == 1).collect(),
    }
}

fn channel(
    name: String,
    creator: &ProcessIdentity,
    ring: &RingCensus,
    changing: bool,
    people: &mut People,
) -> Channel {
    Channel {
        name,
        creator: people.get(creator),
        slots: ring.slots,
        capacity: ring.capacity,
        elem_size: ring.elem_size,
        broadcast: ring.entries > 1,
        producer: ring.producer.map(|(_, id)| people.get(&id)),
        sent: ring.sent,
        consumers_waiting: ring.sent_sleepers,
        consumers: ring
            .consumers
            .iter()
            .map(|c| Consumer {
                entry: c.entry,
                process: people.get(&c.owner),
                left: c.state == OwnerState::Left,
                released: c.released,
                in_flight: ring.sent.saturating_sub(c.released),
                producer_waiting: c.sleepers,
            })
            .collect(),
        changing,
        unchanged_for: None,
        unlinked: false,
    }
}

/// The crate's regions this user's processes map with their names removed, from
/// `/proc/<pid>/maps` (a process whose maps cannot be read is left out); and the channels
/// among them, read through the first process found mapping each, where the kernel lets us.
fn unlinked(people: &mut People) -> (Vec<Unlinked>, Vec<Channel>) {
    let mut by_name: BTreeMap<String, Vec<Process>> = BTreeMap::new();
    let mut channels = Vec::new();
    let mut pids = os::own_pids();
    pids.sort_unstable();
    for pid in pids {
        let names: Vec<(String, String)> = os::unlinked_shm_mappings(pid)
            .into_iter()
            .filter(|(name, _)| name.starts_with(CRATE_PREFIX))
            .collect();
        if names.is_empty() {
            continue;
        }
        let process = people.get(&ProcessIdentity::of_pid(pid));
        for (name, range) in names {
            let mapped_by = by_name.entry(name.clone()).or_default();
            if mapped_by.is_empty()
                && let Some(c) = unlinked_channel(pid, &range, &name, people)
            {
                channels.push(c);
            }
            mapped_by.push(process.clone());
        }
    }
    let unlinked = by_name
        .into_iter()
        .map(|(name, mapped_by)| Unlinked { name, mapped_by })
        .collect();
    (unlinked, channels)
}

/// The channel process `pid` maps at `range` under the removed name `name`, if its file can
/// be opened through `/proc` and decodes as a ring.
fn unlinked_channel(pid: u32, range: &str, name: &str, people: &mut People) -> Option<Channel> {
    let (file, info) = os::open_mapped_file(pid, range).ok()?;
    let (copy, changing, _) = read(&file, &info, name)?;
    match parse::parse(name, &copy)? {
        (creator, Parsed::Ring(ring)) => {
            let mut c = channel(name.to_owned(), &creator, &ring, changing, people);
            c.unlinked = true;
            Some(c)
        }
        _ => None,
    }
}

/// What the names of the crate's own regions start with (tables, channels).
const CRATE_PREFIX: &str = "cuda-ipc-";

/// The token part of a table's name.
fn token_of(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_owned()
}

/// A copy of file `name` (this user's regular files only), read until two reads agree or
/// [`READS`] times: the bytes, whether they were still changing, and the file's size. `None`
/// for a file that is not this user's, not a regular file, or gone.
fn read_named(name: &str) -> Option<(Vec<u8>, bool, u64)> {
    let (file, info) = os::shm_open_read_only(name).ok()?;
    read(&file, &info, name)
}

/// [`read_named`] of a file opened already.
fn read(file: &std::fs::File, info: &os::FileInfo, name: &str) -> Option<(Vec<u8>, bool, u64)> {
    if !info.is_regular() || info.uid != os::euid() {
        return None;
    }
    // A file without the crate's header (the driver's, PyTorch's) is left after 128 bytes;
    // of the crate's, never more than the largest table (a block table) and its header.
    parse::our_header(&os::read_copy(file, crate::shm::HEADER_LEN, name).ok()?)?;
    let len = usize::try_from(info.size).ok()?.min(READ_MAX);
    let mut last = os::read_copy(file, len, name).ok()?;
    for _ in 1..READS {
        let again = os::read_copy(file, len, name).ok()?;
        if again == last {
            return Some((last, false, info.size));
        }
        last = again;
    }
    Some((last, true, info.size))
}

/// The most bytes read of one file: the largest of the crate's tables, with its header and
/// alignment.
const READ_MAX: usize = 4096
    + max(
        std::mem::size_of::<BlockTable>(),
        max(
            std::mem::size_of::<LeaseTable>(),
            std::mem::size_of::<RingState>(),
        ),
    );

const fn max(a: usize, b: usize) -> usize {
    if a > b { a } else { b }
}

/// The processes named so far, each looked up once per snapshot.
#[derive(Default)]
struct People(BTreeMap<(u32, u64, u64), Process>);

impl People {
    fn get(&mut self, id: &ProcessIdentity) -> Process {
        self.0
            .entry((id.pid(), id.start_time(), id.pidfs_ino()))
            .or_insert_with(|| {
                let alive = id.pid() != 0 && id.is_alive();
                Process {
                    pid: id.pid(),
                    start_time: id.start_time(),
                    // Only a live process's: a dead one's pid may name another process now.
                    command: os::command_line(id.pid(), COMMAND_MAX).filter(|_| alive),
                    alive,
                }
            })
            .clone()
    }
}

#[cfg(test)]
mod tests;
