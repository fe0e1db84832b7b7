//! Results: one [`Table`] per workload with a row per system and driver, the ratio of gangway to
//! each peer and of a gangway cluster to the single node, printed with comfy-table and written
//! as JSON with the machine and versions.

use std::collections::BTreeMap;

use comfy_table::{Cell, CellAlignment, Table as Grid, presets::UTF8_FULL_CONDENSED};
use serde::Serialize;

use crate::stats::Machine;
use crate::system::{CpuUse, System};

/// One workload's results.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    /// The workload's name (`register`, `query`, ...).
    pub workload: String,
    /// A one-line description of what was measured.
    pub title: String,
    /// Column names with units, one per value of a row.
    pub columns: Vec<String>,
    /// The column the ratio is computed on.
    pub key: usize,
    /// Whether a larger key value is better (throughput) or worse (latency, memory).
    pub higher_is_better: bool,
    /// The rows, gangway's first.
    pub rows: Vec<Row>,
    /// Remarks printed under the table.
    pub notes: Vec<String>,
}

/// One system and driver (and, for some workloads, one size).
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Which system.
    pub system: System,
    /// How it was driven (`native-grpc`, `nacos-http`, `lease+put`, ...).
    pub driver: String,
    /// Rows are only compared within a group (e.g. the same subscriber count); "" for none.
    pub group: String,
    /// One value per column; `None` when not measured.
    pub values: Vec<Option<f64>>,
    /// CPU of client and server during the measured phase.
    pub cpu: Option<CpuUse>,
    /// Errors, skips and caveats.
    pub note: String,
    /// `gangway-cluster` rows: the row's key value over the single gangway node's (same group
    /// and driver), not inverted: the cost of cluster mode (see [`Table::cluster_ratio`]).
    /// Filled by [`Table::fill_cluster_ratios`]; absent from the JSON when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_vs_single: Option<f64>,
}

impl Row {
    /// A measured row of no group.
    pub fn measured(
        system: System,
        driver: &str,
        values: Vec<Option<f64>>,
        cpu: CpuUse,
        note: impl Into<String>,
    ) -> Row {
        Row {
            system,
            driver: driver.into(),
            group: String::new(),
            values,
            cpu: Some(cpu),
            note: note.into(),
            cluster_vs_single: None,
        }
    }

    /// A row that could not be measured: the reason goes in the note.
    pub fn failed(
        system: System,
        driver: &str,
        group: &str,
        columns: usize,
        why: impl std::fmt::Display,
    ) -> Row {
        Row {
            system,
            driver: driver.into(),
            group: group.into(),
            values: vec![None; columns],
            cpu: None,
            note: why.to_string(),
            cluster_vs_single: None,
        }
    }
}

impl Table {
    /// A table with no rows yet: the ratio column compares column `key`, where a larger value is
    /// better when `higher_is_better`.
    pub fn new(
        workload: &str,
        title: String,
        columns: Vec<String>,
        key: usize,
        higher_is_better: bool,
        notes: Vec<String>,
    ) -> Table {
        Table {
            workload: workload.into(),
            title,
            columns,
            key,
            higher_is_better,
            rows: Vec::new(),
            notes,
        }
    }

    /// The ratio for `row`: gangway's key value over the peer's (inverted for lower-is-better),
    /// so above 1 means gangway is better. Compared with gangway's row of the same group and
    /// driver, else its first row of the group. Returns the ratio and the gangway driver used.
    pub fn ratio(&self, row: &Row) -> Option<(f64, String)> {
        if row.system.is_gangway() {
            return None;
        }
        let theirs = row.values.get(self.key).copied().flatten()?;
        let candidates: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.system == System::Gangway && r.group == row.group)
            .filter(|r| r.values.get(self.key).copied().flatten().is_some())
            .collect();
        let ours = candidates
            .iter()
            .find(|r| r.driver == row.driver)
            .or_else(|| candidates.first())?;
        let mine = ours.values[self.key]?;
        let ratio = if self.higher_is_better {
            mine / theirs
        } else {
            theirs / mine
        };
        ratio.is_finite().then(|| (ratio, ours.driver.clone()))
    }

    /// The cost of cluster mode for a `gangway-cluster` row: its key value over that of the
    /// single gangway node's row of the same group and driver, as is (registrations/s: below 1
    /// is slower; latencies: above 1 is slower). `None` for other rows, or without such a
    /// single-node row or value.
    pub fn cluster_ratio(&self, row: &Row) -> Option<f64> {
        if row.system != System::GangwayCluster {
            return None;
        }
        let cluster = row.values.get(self.key).copied().flatten()?;
        let single = self
            .rows
            .iter()
            .find(|r| {
                r.system == System::Gangway && r.group == row.group && r.driver == row.driver
            })?
            .values
            .get(self.key)
            .copied()
            .flatten()?;
        let ratio = cluster / single;
        ratio.is_finite().then_some(ratio)
    }

    /// Stores [`Table::cluster_ratio`] in every row (for the JSON report).
    pub fn fill_cluster_ratios(&mut self) {
        let ratios: Vec<Option<f64>> = self.rows.iter().map(|r| self.cluster_ratio(r)).collect();
        for (row, ratio) in self.rows.iter_mut().zip(ratios) {
            row.cluster_vs_single = ratio;
        }
    }

    /// Whether a `gangway-cluster` row is in the table (which then prints the column
    /// `cluster ÷ single`).
    fn has_cluster(&self) -> bool {
        self.rows.iter().any(|r| r.system == System::GangwayCluster)
    }

    /// The table as printed.
    pub fn render(&self) -> String {
        let mut grid = Grid::new();
        grid.load_preset(UTF8_FULL_CONDENSED);
        let mut header = vec!["system".to_owned(), "driver".to_owned()];
        header.extend(self.columns.iter().cloned());
        header.extend(["CPU s client/server".into(), "gangway ×".into()]);
        let cluster = self.has_cluster();
        if cluster {
            header.push("cluster ÷ single".into());
        }
        header.push("note".into());
        grid.set_header(header);
        for row in &self.rows {
            let mut cells = vec![Cell::new(row.system.name()), Cell::new(&row.driver)];
            for v in &row.values {
                cells.push(
                    Cell::new(v.map_or("-".into(), format_number))
                        .set_alignment(CellAlignment::Right),
                );
            }
            cells.push(Cell::new(row.cpu.map_or("-".into(), |c| {
                format!("{:.1}/{:.1} in {:.1}", c.client_s, c.server_s, c.wall_s)
            })));
            cells.push(Cell::new(match self.ratio(row) {
                Some((r, driver)) if driver == row.driver => format!("{r:.2}"),
                Some((r, driver)) => format!("{r:.2} (vs {driver})"),
                None => String::new(),
            }));
            if cluster {
                cells.push(
                    Cell::new(
                        self.cluster_ratio(row)
                            .map_or(String::new(), |r| format!("{r:.2}")),
                    )
                    .set_alignment(CellAlignment::Right),
                );
            }
            cells.push(Cell::new(&row.note));
            grid.add_row(cells);
        }
        let mut out = format!("== {}: {}\n{grid}\n", self.workload, self.title);
        for n in &self.notes {
            out.push_str(&format!("   {n}\n"));
        }
        out.push_str(&format!(
            "   gangway × = gangway's {} over the peer's{}; above 1: gangway is better.\n",
            self.columns[self.key],
            if self.higher_is_better {
                ""
            } else {
                " (inverted: lower is better)"
            }
        ));
        if cluster {
            out.push_str(&format!(
                "   cluster ÷ single = gangway-cluster's {} over the single node's (not inverted: the cost of cluster mode); server CPU: all {} gangway nodes and etcd members.\n",
                self.columns[self.key],
                crate::system::CLUSTER_NODES
            ));
        }
        out
    }
}

/// Formats a figure: thousands without decimals, small numbers with two significant decimals.
pub fn format_number(v: f64) -> String {
    if v.abs() >= 1000.0 {
        let s = format!("{:.0}", v);
        let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        format!("{sign}{out}")
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Everything one `gangway bench` run measured, as written by `--json`.
#[derive(Debug, Serialize)]
pub struct Report {
    /// UTC date and time of the run (RFC 3339).
    pub date: String,
    /// Whether this was the `--quick` run.
    pub quick: bool,
    /// The machine.
    pub machine: Machine,
    /// Version of each system.
    pub versions: BTreeMap<String, String>,
    /// One table per workload.
    pub tables: Vec<Table>,
}

impl Report {
    /// `workload/system/driver: note` for every row that could not be measured (no value at
    /// all), except systems that are not installed.
    pub fn failures(&self) -> Vec<String> {
        self.tables
            .iter()
            .flat_map(|t| t.rows.iter().map(move |r| (t, r)))
            .filter(|(_, r)| {
                (r.note.starts_with("failed") || r.values.iter().all(Option::is_none))
                    && !r.note.contains("not installed")
            })
            .map(|(t, r)| format!("{}/{}/{}: {}", t.workload, r.system, r.driver, r.note))
            .collect()
    }
}

/// Now, as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_utc(secs)
}

fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: System, driver: &str, v: f64) -> Row {
        Row {
            system,
            driver: driver.into(),
            group: String::new(),
            values: vec![Some(v)],
            cpu: None,
            note: String::new(),
            cluster_vs_single: None,
        }
    }

    #[test]
    fn ratios_pick_the_same_driver_then_the_first() {
        let mut t = Table {
            workload: "register".into(),
            title: "t".into(),
            columns: vec!["regs/s".into()],
            key: 0,
            higher_is_better: true,
            rows: vec![
                row(System::Gangway, "native-grpc", 100.0),
                row(System::Gangway, "nacos-http", 60.0),
                row(System::Rnacos, "nacos-http", 30.0),
                row(System::Etcd, "lease+put", 10.0),
            ],
            notes: vec![],
        };
        assert_eq!(
            t.ratio(&t.rows[2].clone()),
            Some((2.0, "nacos-http".into()))
        );
        assert_eq!(
            t.ratio(&t.rows[3].clone()),
            Some((10.0, "native-grpc".into()))
        );
        assert_eq!(t.ratio(&t.rows[0].clone()), None);
        t.higher_is_better = false;
        assert_eq!(
            t.ratio(&t.rows[2].clone()),
            Some((0.5, "nacos-http".into()))
        );
        let out = t.render();
        assert!(out.contains("0.10 (vs native-grpc)"), "{out}");
        // A failed peer row has no ratio.
        t.rows.push(Row::failed(
            System::Rnacos,
            "nacos-grpc",
            "",
            1,
            "not installed",
        ));
        assert_eq!(t.ratio(&t.rows[4].clone()), None);
    }

    #[test]
    fn cluster_rows_get_cluster_over_single_and_no_gangway_ratio() {
        let mut t = Table::new(
            "register",
            "t".into(),
            vec!["regs/s".into()],
            0,
            true,
            vec![],
        );
        t.rows = vec![
            row(System::Gangway, "native-grpc", 100.0),
            row(System::Gangway, "nacos-http", 50.0),
            row(System::Etcd, "lease+put", 25.0),
            row(System::GangwayCluster, "native-grpc", 64.0),
            row(System::GangwayCluster, "nacos-grpc", 10.0),
        ];
        // Not inverted, and only against the single node's row of the same driver.
        assert_eq!(t.cluster_ratio(&t.rows[3].clone()), Some(0.64));
        assert_eq!(t.cluster_ratio(&t.rows[4].clone()), None);
        assert_eq!(t.cluster_ratio(&t.rows[2].clone()), None);
        // A peer is still compared with the single node, never with the cluster.
        assert_eq!(
            t.ratio(&t.rows[2].clone()),
            Some((4.0, "native-grpc".into()))
        );
        assert_eq!(t.ratio(&t.rows[3].clone()), None);
        t.higher_is_better = false;
        assert_eq!(t.cluster_ratio(&t.rows[3].clone()), Some(0.64));
        t.fill_cluster_ratios();
        let ratios: Vec<Option<f64>> = t.rows.iter().map(|r| r.cluster_vs_single).collect();
        assert_eq!(ratios, vec![None, None, None, Some(0.64), None]);
        let json = serde_json::to_value(&t).unwrap();
        assert_eq!(json["rows"][3]["cluster_vs_single"], 0.64);
        assert!(json["rows"][0].get("cluster_vs_single").is_none());
        let out = t.render();
        assert!(out.contains("cluster ÷ single"), "{out}");
        assert!(out.contains("0.64"), "{out}");
        // Without a cluster row the column is not printed.
        t.rows.truncate(3);
        assert!(!t.render().contains("cluster ÷ single"));
    }

    #[test]
    fn numbers_and_dates() {
        assert_eq!(format_number(1234567.8), "1,234,568");
        assert_eq!(format_number(-1234.0), "-1,234");
        assert_eq!(format_number(123.4), "123");
        assert_eq!(format_number(12.34), "12.3");
        assert_eq!(format_number(0.1234), "0.12");
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(1_796_040_502), "2026-11-30T12:08:22Z");
    }
}
