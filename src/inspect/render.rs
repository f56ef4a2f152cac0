//! A [`Snapshot`] as a tree for a person and as JSON for a program.

use std::fmt::{self, Write as _};

use super::{Channel, ExportTable, Exporter, Process, Snapshot, TableKind};
use crate::probe::json_string;

pub(super) fn tree(s: &Snapshot, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    writeln!(
        f,
        "cuda-ipc on this machine: {}, {}, {}",
        count(s.exporters.len(), "exporter"),
        count(s.channels.len(), "channel"),
        count(s.regions.len(), "other region"),
    )?;
    for e in &s.exporters {
        exporter(e, f)?;
    }
    for c in &s.channels {
        channel(c, f)?;
    }
    for r in &s.regions {
        write!(f, "region {} ({}): created by ", r.name, size(r.bytes))?;
        process(&r.creator, f)?;
        if r.creator.alive {
            writeln!(f)?;
        } else {
            writeln!(f, ": shm::reclaim_stale removes it")?;
        }
    }
    for u in &s.unreadable {
        writeln!(f, "unreadable {}: {}", u.name, u.reason)?;
    }
    for u in &s.unlinked {
        writeln!(f, "unlinked {} (its name removed), mapped by:", u.name)?;
        for p in &u.mapped_by {
            write!(f, "  ")?;
            process(p, f)?;
            writeln!(f)?;
        }
    }
    Ok(())
}

fn exporter(e: &Exporter, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(f, "exporter ")?;
    process(&e.process, f)?;
    if e.process.alive {
        writeln!(f)?;
    } else {
        writeln!(f, "; the next export on this machine removes its tables")?;
    }
    for t in &e.tables {
        table(t, f)?;
    }
    Ok(())
}

fn table(t: &ExportTable, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let kind = match t.kind {
        TableKind::Registry => "export registry".to_owned(),
        TableKind::Arena => format!("arena of {}", size(t.capacity)),
        TableKind::Pool => "pool".to_owned(),
    };
    write!(
        f,
        "  {kind} {}: {}, {}",
        short(&t.token),
        count(t.exports.len(), "export"),
        count(t.importers.len(), "importer")
    )?;
    if t.closing {
        write!(f, ", closing")?;
    }
    match t.files {
        (true, true) => {}
        (false, _) => write!(f, " (its block table is gone)")?,
        (_, false) => write!(f, " (its lease table is gone)")?,
    }
    if t.changing {
        write!(f, " (changing while read)")?;
    }
    writeln!(f)?;
    for x in &t.exports {
        write!(f, "    export {} (generation {}", x.block, x.generation)?;
        if !x.live && x.holders.is_empty() {
            write!(f, ", freed")?;
        } else if !x.live {
            write!(f, ", freed; the free waits for {}", slots(&x.holders))?;
        }
        write!(f, "): ")?;
        match (x.kind, &x.device) {
            (Some(kind), Some(device)) => write!(f, "{kind} on {device}, ")?,
            _ => write!(f, "unlabelled, ")?,
        }
        write!(f, "{}", size(x.bytes))?;
        if t.kind == TableKind::Arena {
            write!(f, " at {}", x.offset)?;
        }
        if x.read_only {
            write!(f, ", read-only")?;
        }
        if x.live && !x.holders.is_empty() {
            write!(f, ", held by {}", slots(&x.holders))?;
        }
        writeln!(f)?;
    }
    for i in &t.importers {
        write!(f, "    importer slot {}: ", i.slot)?;
        if i.process.alive {
            process(&i.process, f)?;
        } else {
            write!(
                f,
                "pid {} (DEAD: the exporter's next collect reaps it)",
                i.process.pid
            )?;
        }
        writeln!(f, "{}", if i.claiming { " (claiming)" } else { "" })?;
    }
    Ok(())
}

fn channel(c: &Channel, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(
        f,
        "channel {}: {} of {} elements",
        c.name,
        count(c.slots as usize, "slot"),
        c.capacity
    )?;
    if c.elem_size > 0 {
        write!(f, " ({} bytes each)", c.elem_size)?;
    }
    write!(f, ", {} sent", count(c.sent as usize, "item"))?;
    if c.broadcast {
        write!(f, ", broadcast")?;
    }
    if c.unlinked {
        write!(f, ", its name removed (its consumer attached)")?;
    }
    if let Some(still) = c.unchanged_for.filter(|d| d.as_secs() >= 1) {
        write!(f, ", no progress for {} s", still.as_secs())?;
    }
    if c.changing {
        write!(f, " (changing while read)")?;
    }
    writeln!(f)?;
    write!(f, "  producer ")?;
    match &c.producer {
        Some(p) => process(p, f)?,
        None => write!(f, "none")?,
    }
    if c.consumers.iter().any(|x| x.producer_waiting > 0) {
        write!(f, " — asleep until a consumer releases")?;
    }
    writeln!(f)?;
    for x in &c.consumers {
        write!(f, "  consumer entry {}: ", x.entry)?;
        process(&x.process, f)?;
        write!(f, ": released {}, {} in flight", x.released, x.in_flight)?;
        if x.in_flight >= c.slots {
            write!(f, " (the ring is full)")?;
        }
        if x.left {
            write!(f, " (detached)")?;
        }
        writeln!(f)?;
    }
    if c.consumers_waiting > 0 {
        writeln!(
            f,
            "  {} waiting for an item",
            count(c.consumers_waiting as usize, "consumer thread")
        )?;
    }
    Ok(())
}

fn process(p: &Process, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(
        f,
        "pid {} ({})",
        p.pid,
        if p.alive { "alive" } else { "DEAD" }
    )?;
    if let Some(command) = &p.command {
        write!(f, ": {command}")?;
    }
    Ok(())
}

fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn slots(holders: &[u32]) -> String {
    let list: Vec<String> = holders.iter().map(u32::to_string).collect();
    format!(
        "slot{} {}",
        if holders.len() == 1 { "" } else { "s" },
        list.join(", ")
    )
}

/// A token cut to its first and last four hex digits.
fn short(token: &str) -> String {
    match (token.get(..4), token.get(token.len().saturating_sub(4)..)) {
        (Some(head), Some(tail)) if token.len() > 8 => format!("{head}…{tail}"),
        _ => token.to_owned(),
    }
}

fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["bytes", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

pub(super) fn json(s: &Snapshot) -> String {
    let snapshot = Json::Obj(vec![
        ("exporters", list(&s.exporters, exporter_json)),
        ("channels", list(&s.channels, channel_json)),
        (
            "regions",
            list(&s.regions, |r| {
                Json::Obj(vec![
                    ("name", r.name.as_str().into()),
                    ("creator", process_json(&r.creator)),
                    ("bytes", r.bytes.into()),
                ])
            }),
        ),
        (
            "unreadable",
            list(&s.unreadable, |u| {
                Json::Obj(vec![
                    ("name", u.name.as_str().into()),
                    ("reason", u.reason.as_str().into()),
                ])
            }),
        ),
        (
            "unlinked",
            list(&s.unlinked, |u| {
                Json::Obj(vec![
                    ("name", u.name.as_str().into()),
                    ("mapped_by", list(&u.mapped_by, process_json)),
                ])
            }),
        ),
    ]);
    let mut o = String::new();
    snapshot.write(&mut o);
    o
}

fn exporter_json(e: &Exporter) -> Json {
    Json::Obj(vec![
        ("process", process_json(&e.process)),
        ("tables", list(&e.tables, table_json)),
    ])
}

fn table_json(t: &ExportTable) -> Json {
    let kind = match t.kind {
        TableKind::Registry => "registry",
        TableKind::Arena => "arena",
        TableKind::Pool => "pool",
    };
    Json::Obj(vec![
        ("token", t.token.as_str().into()),
        ("kind", kind.into()),
        ("capacity", t.capacity.into()),
        ("closing", t.closing.into()),
        ("block_table", t.files.0.into()),
        ("lease_table", t.files.1.into()),
        ("changing", t.changing.into()),
        (
            "exports",
            list(&t.exports, |x| {
                Json::Obj(vec![
                    ("block", x.block.into()),
                    ("generation", x.generation.into()),
                    ("live", x.live.into()),
                    ("deferred", x.is_deferred().into()),
                    ("kind", x.kind.map(|k| k.name()).into()),
                    ("device", x.device.as_deref().into()),
                    ("read_only", x.read_only.into()),
                    ("offset", x.offset.into()),
                    ("bytes", x.bytes.into()),
                    ("holders", list(&x.holders, |&h| h.into())),
                ])
            }),
        ),
        (
            "importers",
            list(&t.importers, |m| {
                Json::Obj(vec![
                    ("slot", m.slot.into()),
                    ("process", process_json(&m.process)),
                    ("claiming", m.claiming.into()),
                ])
            }),
        ),
    ])
}

fn channel_json(c: &Channel) -> Json {
    let unchanged_for = c
        .unchanged_for
        .map(|d| Json::Raw(format!("{:.1}", d.as_secs_f64())));
    Json::Obj(vec![
        ("name", c.name.as_str().into()),
        ("creator", process_json(&c.creator)),
        ("slots", c.slots.into()),
        ("capacity", c.capacity.into()),
        ("elem_size", c.elem_size.into()),
        ("broadcast", c.broadcast.into()),
        ("producer", c.producer.as_ref().map(process_json).into()),
        ("sent", c.sent.into()),
        ("consumers_waiting", c.consumers_waiting.into()),
        ("changing", c.changing.into()),
        ("unchanged_for_s", unchanged_for.into()),
        ("unlinked", c.unlinked.into()),
        (
            "consumers",
            list(&c.consumers, |x| {
                Json::Obj(vec![
                    ("entry", x.entry.into()),
                    ("process", process_json(&x.process)),
                    ("left", x.left.into()),
                    ("released", x.released.into()),
                    ("in_flight", x.in_flight.into()),
                    ("producer_waiting", x.producer_waiting.into()),
                ])
            }),
        ),
    ])
}

fn process_json(p: &Process) -> Json {
    Json::Obj(vec![
        ("pid", p.pid.into()),
        ("start_time", p.start_time.into()),
        ("alive", p.alive.into()),
        ("command", p.command.as_deref().into()),
    ])
}

/// A JSON value, built from the snapshot's types and written once.
enum Json {
    Null,
    /// A number or `true`/`false`, as written.
    Raw(String),
    Str(String),
    List(Vec<Json>),
    /// Fields in the order given.
    Obj(Vec<(&'static str, Json)>),
}

impl Json {
    fn write(&self, o: &mut String) {
        match self {
            Json::Null => o.push_str("null"),
            Json::Raw(text) => o.push_str(text),
            Json::Str(text) => o.push_str(&json_string(text)),
            Json::List(items) => {
                o.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        o.push(',');
                    }
                    item.write(o);
                }
                o.push(']');
            }
            Json::Obj(fields) => {
                o.push('{');
                for (i, (key, value)) in fields.iter().enumerate() {
                    if i > 0 {
                        o.push(',');
                    }
                    let _ = write!(o, "\"{key}\":");
                    value.write(o);
                }
                o.push('}');
            }
        }
    }
}

fn list<T>(items: &[T], each: impl Fn(&T) -> Json) -> Json {
    Json::List(items.iter().map(each).collect())
}

macro_rules! json_raw {
    ($($t:ty),*) => {
        $(impl From<$t> for Json {
            fn from(v: $t) -> Self {
                Json::Raw(v.to_string())
            }
        })*
    };
}
json_raw!(bool, u32, u64);

impl From<&str> for Json {
    fn from(s: &str) -> Self {
        Json::Str(s.to_owned())
    }
}

impl<T: Into<Json>> From<Option<T>> for Json {
    fn from(v: Option<T>) -> Self {
        v.map_or(Json::Null, Into::into)
    }
}
