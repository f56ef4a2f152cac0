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
    let mut o = String::from("{\"exporters\":[");
    for (i, e) in s.exporters.iter().enumerate() {
        sep(&mut o, i);
        let _ = write!(o, "{{\"process\":{},\"tables\":[", process_json(&e.process));
        for (j, t) in e.tables.iter().enumerate() {
            sep(&mut o, j);
            table_json(&mut o, t);
        }
        o.push_str("]}");
    }
    o.push_str("],\"channels\":[");
    for (i, c) in s.channels.iter().enumerate() {
        sep(&mut o, i);
        let _ = write!(
            o,
            "{{\"name\":{},\"creator\":{},\"slots\":{},\"capacity\":{},\"elem_size\":{},\"broadcast\":{},\"producer\":{},\"sent\":{},\"consumers_waiting\":{},\"changing\":{},\"unchanged_for_s\":{},\"unlinked\":{},\"consumers\":[",
            json_string(&c.name),
            process_json(&c.creator),
            c.slots,
            c.capacity,
            c.elem_size,
            c.broadcast,
            c.producer
                .as_ref()
                .map_or_else(|| "null".to_owned(), process_json),
            c.sent,
            c.consumers_waiting,
            c.changing,
            c.unchanged_for
                .map_or_else(|| "null".to_owned(), |d| format!("{:.1}", d.as_secs_f64())),
            c.unlinked
        );
        for (j, x) in c.consumers.iter().enumerate() {
            sep(&mut o, j);
            let _ = write!(
                o,
                "{{\"entry\":{},\"process\":{},\"left\":{},\"released\":{},\"in_flight\":{},\"producer_waiting\":{}}}",
                x.entry,
                process_json(&x.process),
                x.left,
                x.released,
                x.in_flight,
                x.producer_waiting
            );
        }
        o.push_str("]}");
    }
    o.push_str("],\"regions\":[");
    for (i, r) in s.regions.iter().enumerate() {
        sep(&mut o, i);
        let _ = write!(
            o,
            "{{\"name\":{},\"creator\":{},\"bytes\":{}}}",
            json_string(&r.name),
            process_json(&r.creator),
            r.bytes
        );
    }
    o.push_str("],\"unreadable\":[");
    for (i, u) in s.unreadable.iter().enumerate() {
        sep(&mut o, i);
        let _ = write!(
            o,
            "{{\"name\":{},\"reason\":{}}}",
            json_string(&u.name),
            json_string(&u.reason)
        );
    }
    o.push_str("],\"unlinked\":[");
    for (i, u) in s.unlinked.iter().enumerate() {
        sep(&mut o, i);
        let mapped: Vec<String> = u.mapped_by.iter().map(process_json).collect();
        let _ = write!(
            o,
            "{{\"name\":{},\"mapped_by\":[{}]}}",
            json_string(&u.name),
            mapped.join(",")
        );
    }
    o.push_str("]}");
    o
}

fn table_json(o: &mut String, t: &ExportTable) {
    let kind = match t.kind {
        TableKind::Registry => "registry",
        TableKind::Arena => "arena",
        TableKind::Pool => "pool",
    };
    let _ = write!(
        o,
        "{{\"token\":{},\"kind\":\"{kind}\",\"capacity\":{},\"closing\":{},\"block_table\":{},\"lease_table\":{},\"changing\":{},\"exports\":[",
        json_string(&t.token),
        t.capacity,
        t.closing,
        t.files.0,
        t.files.1,
        t.changing
    );
    for (i, x) in t.exports.iter().enumerate() {
        sep(o, i);
        let holders: Vec<String> = x.holders.iter().map(u32::to_string).collect();
        let _ = write!(
            o,
            "{{\"block\":{},\"generation\":{},\"live\":{},\"deferred\":{},\"kind\":{},\"device\":{},\"read_only\":{},\"offset\":{},\"bytes\":{},\"holders\":[{}]}}",
            x.block,
            x.generation,
            x.live,
            x.is_deferred(),
            x.kind
                .map_or_else(|| "null".to_owned(), |k| json_string(k.name())),
            x.device
                .as_deref()
                .map_or_else(|| "null".to_owned(), json_string),
            x.read_only,
            x.offset,
            x.bytes,
            holders.join(",")
        );
    }
    o.push_str("],\"importers\":[");
    for (i, m) in t.importers.iter().enumerate() {
        sep(o, i);
        let _ = write!(
            o,
            "{{\"slot\":{},\"process\":{},\"claiming\":{}}}",
            m.slot,
            process_json(&m.process),
            m.claiming
        );
    }
    o.push_str("]}");
}

fn process_json(p: &Process) -> String {
    format!(
        "{{\"pid\":{},\"start_time\":{},\"alive\":{},\"command\":{}}}",
        p.pid,
        p.start_time,
        p.alive,
        p.command
            .as_deref()
            .map_or_else(|| "null".to_owned(), json_string)
    )
}

fn sep(o: &mut String, i: usize) {
    if i > 0 {
        o.push(',');
    }
}
