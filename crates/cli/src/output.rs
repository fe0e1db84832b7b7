//! Rendering answers for people (tables and one-line summaries) and writing them out.
//!
//! Renderers are pure: they take the typed answer and return the text, so tests can check it.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use comfy_table::{CellAlignment, ContentArrangement, Table, presets};
use gangway_wire::rest::{DrainReport, Instance, InstanceChange, ServiceList, Subscribers, View};

/// Writes `text` (plus a newline unless it has one) to stdout and flushes it.
///
/// A closed pipe (`gangway list x | head -1`) is `ErrorKind::BrokenPipe`; callers end quietly.
pub fn emit(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    if !text.ends_with('\n') {
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// Writes a raw JSON answer on one line: the body as received, surrounding whitespace trimmed.
pub fn emit_json(body: &str) -> io::Result<()> {
    emit(body.trim())
}

/// A borderless, left-aligned table (`kubectl get` style), never wrapped.
fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().map(|h| h.to_uppercase()));
    for col in t.column_iter_mut() {
        col.set_padding((0, 2));
    }
    t
}

/// Table text with trailing spaces removed from each line.
fn finish(t: &Table) -> String {
    t.lines()
        .map(|l| l.trim_end().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn metadata(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn weight(w: f64) -> String {
    // 1, 0.5, 2.25 rather than 1.0 / 0.50
    format!("{w}")
}

/// The instances table. The LIVENESS column is there only when the answer tells it (views and
/// snapshots do; the answers of register, offline and online do not).
fn instance_table(instances: &[Instance]) -> Table {
    let with_liveness = instances.iter().any(|i| i.liveness.is_some());
    let mut header = vec![
        "address",
        "cluster",
        "weight",
        "healthy",
        "enabled",
        "ephemeral",
    ];
    if with_liveness {
        header.push("liveness");
    }
    header.push("metadata");
    let mut t = table(&header);
    for i in instances {
        let mut row = vec![
            i.addr(),
            i.cluster.clone(),
            weight(i.weight),
            yes_no(i.healthy).to_owned(),
            yes_no(i.enabled).to_owned(),
            yes_no(i.ephemeral).to_owned(),
        ];
        if with_liveness {
            row.push(i.liveness.clone().unwrap_or_else(|| "-".to_owned()));
        }
        row.push(metadata(&i.metadata));
        t.add_row(row);
    }
    if let Some(col) = t.column_mut(2) {
        col.set_cell_alignment(CellAlignment::Right);
    }
    t
}

/// `gangway list`: a header line (service, revision, protection) and one row per instance.
pub fn view(v: &View, all: bool) -> String {
    let mut head = format!(
        "{}/{}/{}  revision {}  {} instance{}{}  protection {}",
        v.namespace,
        v.group,
        v.service,
        v.revision,
        v.instances.len(),
        if v.instances.len() == 1 { "" } else { "s" },
        if all { " (all)" } else { " (serving view)" },
        if v.protection_triggered {
            "TRIGGERED"
        } else {
            "not triggered"
        },
    );
    if v.warming_up {
        head.push_str("  (registry warming up)");
    }
    if v.instances.is_empty() {
        return format!("{head}\nno instances");
    }
    let t = instance_table(&v.instances);
    format!("{head}\n{}", finish(&t))
}

/// register / offline / online: what happened, at which revision, and the instance's row.
pub fn instance_change(what: &str, service: &str, c: &InstanceChange) -> String {
    let t = instance_table(std::slice::from_ref(&c.instance));
    format!(
        "{what} {} in {service} (revision {})\n{}",
        c.instance.addr(),
        c.revision,
        finish(&t)
    )
}

/// The nodes of a cluster (`gangway services` in cluster mode): one row per node, the
/// answering one marked `*`.
pub fn nodes(view: &gangway_wire::rest::ClusterView) -> String {
    let mut t = table(&["node", "http", "grpc", "lease", "sessions", "subscribers"]);
    for n in &view.nodes {
        t.add_row(vec![
            if n.this {
                format!("{} *", n.name)
            } else {
                n.name.clone()
            },
            n.http.clone(),
            n.grpc.clone(),
            n.lease.clone(),
            n.sessions.to_string(),
            n.subscribers.to_string(),
        ]);
    }
    finish(&t)
}

/// `gangway services`.
pub fn services(list: &ServiceList) -> String {
    if list.services.is_empty() {
        return "no services".to_owned();
    }
    let mut t = table(&[
        "namespace",
        "group",
        "service",
        "kind",
        "revision",
        "instances",
        "serving",
        "subscribers",
        "protect",
    ]);
    for s in &list.services {
        t.add_row(vec![
            s.namespace.clone(),
            s.group.clone(),
            s.service.clone(),
            s.kind.map_or("-", |k| k.as_str()).to_owned(),
            s.revision.to_string(),
            s.instances.to_string(),
            s.serving.to_string(),
            s.subscribers.to_string(),
            format!("{}", s.protect_threshold),
        ]);
    }
    finish(&t)
}

/// `gangway watch`: one line per snapshot.
pub fn snapshot_line(at: SystemTime, v: &View) -> String {
    let addrs: Vec<String> = v
        .instances
        .iter()
        .map(|i| {
            let mut a = i.addr();
            if !i.healthy {
                a.push_str("(unhealthy)");
            }
            a
        })
        .collect();
    format!(
        "{}  revision {}  {} instance{}{}{}{}",
        rfc3339_ms(unix_ms(at)),
        v.revision,
        v.instances.len(),
        if v.instances.len() == 1 { "" } else { "s" },
        if v.protection_triggered {
            "  PROTECTION"
        } else {
            ""
        },
        if addrs.is_empty() { "" } else { "  " },
        addrs.join(" "),
    )
}

/// `gangway drain` / `offline --wait`: summary, subscribers table (acked and lagging), notes.
pub fn drain(addr: &str, service: &str, r: &DrainReport) -> String {
    ack_report("drain", addr, service, r)
}

/// `gangway online --wait`: the same layout as [`drain`], for the revision that holds the
/// instance.
pub fn ready(addr: &str, service: &str, r: &DrainReport) -> String {
    ack_report("readiness", addr, service, r)
}

/// `{what} of ADDR in SERVICE complete|TIMED OUT: ...`, the subscribers table, the notes.
fn ack_report(what: &str, addr: &str, service: &str, r: &DrainReport) -> String {
    let verdict = if r.complete { "complete" } else { "TIMED OUT" };
    let mut out = format!(
        "{what} of {addr} in {service} {verdict}: waited {} ms for revision {}; {} acked, {} lagging",
        r.waited_ms,
        r.revision,
        r.acked.len(),
        r.laggards.len()
    );
    if !r.acked.is_empty() || !r.laggards.is_empty() {
        // Cluster mode names the node holding each subscriber.
        let nodes = r
            .acked
            .iter()
            .chain(&r.laggards)
            .any(|s| !s.node.is_empty());
        let mut t = if nodes {
            table(&["subscriber", "node", "address", "acked revision", "status"])
        } else {
            table(&["subscriber", "address", "acked revision", "status"])
        };
        for (s, status) in r
            .laggards
            .iter()
            .map(|s| (s, "LAGGING"))
            .chain(r.acked.iter().map(|s| (s, "acked")))
        {
            let mut row = vec![s.id.clone()];
            if nodes {
                row.push(s.node.clone());
            }
            row.extend([
                s.address.clone(),
                s.acked_revision.to_string(),
                status.to_owned(),
            ]);
            t.add_row(row);
        }
        out.push('\n');
        out.push_str(&finish(&t));
    }
    for note in &r.notes {
        out.push_str("\nnote: ");
        out.push_str(note);
    }
    out
}

/// `gangway subscribers`.
pub fn subscribers(service: &str, s: &Subscribers) -> String {
    let head = format!(
        "{service}  revision {}  {} subscriber{}",
        s.revision,
        s.subscribers.len(),
        if s.subscribers.len() == 1 { "" } else { "s" }
    );
    if s.subscribers.is_empty() {
        return format!("{head}\nno subscribers");
    }
    let mut t = table(&[
        "id",
        "address",
        "kind",
        "client",
        "acked revision",
        "acked at",
        "pushed revision",
        "status",
    ]);
    for sub in &s.subscribers {
        t.add_row(vec![
            sub.id.clone(),
            sub.address.clone(),
            sub.kind.clone(),
            sub.client_name
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "-".to_owned()),
            sub.acked_revision.to_string(),
            sub.acked_at_ms
                .map(rfc3339_ms)
                .unwrap_or_else(|| "-".to_owned()),
            sub.pushed_revision
                .map(|r| r.to_string())
                .unwrap_or_else(|| "-".to_owned()),
            if sub.acked_revision >= s.revision {
                "up to date"
            } else {
                "behind"
            }
            .to_owned(),
        ]);
    }
    format!("{head}\n{}", finish(&t))
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Unix milliseconds as UTC `2024-05-01T12:00:00.123Z`.
pub fn rfc3339_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        ms % 1000
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests;
