//! Reports: the suite tables (text), all raw results (JSON), per-scenario timelines (SVG).

use std::path::Path;

use anyhow::Context as _;
use comfy_table::Table as TextTable;
use plotters::prelude::*;
use serde::Serialize;

use crate::scenario::{Params, Scenario, ScenarioResult};
use crate::suite::Table;

/// Results of a run, as the suite returns them.
pub type Results = [(Scenario, Result<ScenarioResult, String>)];

fn find<'a>(results: &'a Results, s: &Scenario) -> Option<&'a Result<ScenarioResult, String>> {
    results.iter().find(|(k, _)| k == s).map(|(_, r)| r)
}

/// Header of every suite table.
pub const COLUMNS: [&str; 8] = [
    "scenario",
    "failed / total",
    "failures at (s)",
    "cache drop (s after action)",
    "attempts / req",
    "in flight at signal",
    "drain wait (ms)",
    "reference",
];

/// One row of cells for a result.
pub fn cells(r: &ScenarioResult, reference: &str) -> Vec<String> {
    vec![
        r.label.clone(),
        format!("{} / {}", r.failed, r.total),
        r.failures_ms.map_or("-".to_owned(), |(a, b)| {
            format!("{:.2}-{:.2}", a / 1000.0, b / 1000.0)
        }),
        r.cache_drop_ms.map_or("never".to_owned(), |c| {
            format!("{:.2}", (c - r.action_ms) / 1000.0)
        }),
        format!("{:.3}", r.attempts_per_request),
        r.in_flight_at_signal.to_string(),
        r.drain_wait_ms.map_or("-".to_owned(), |w| w.to_string()),
        reference.to_owned(),
    ]
}

/// Renders one suite table.
pub fn render_table(table: &Table, results: &Results) -> String {
    let mut t = TextTable::new();
    t.load_preset(comfy_table::presets::ASCII_MARKDOWN);
    t.set_header(COLUMNS);
    for row in &table.rows {
        match find(results, &row.scenario) {
            Some(Ok(r)) => {
                t.add_row(cells(r, &row.reference));
            }
            Some(Err(e)) => {
                let mut c = vec![row.scenario.label(), format!("error: {e}")];
                c.resize(COLUMNS.len() - 1, String::new());
                c.push(row.reference.clone());
                t.add_row(c);
            }
            None => {}
        }
    }
    format!("{}\n{t}", table.title)
}

/// A single scenario's table.
pub fn render_one(r: &ScenarioResult) -> String {
    let mut t = TextTable::new();
    t.load_preset(comfy_table::presets::ASCII_MARKDOWN);
    t.set_header(COLUMNS);
    t.add_row(cells(r, "-"));
    t.to_string()
}

#[derive(Serialize)]
struct JsonRun<'a> {
    params: &'a Params,
    tables: Vec<JsonTable<'a>>,
    scenarios: Vec<JsonScenario<'a>>,
}

#[derive(Serialize)]
struct JsonTable<'a> {
    title: &'a str,
    /// Labels of the scenarios (keys into `scenarios`) with their reference values.
    rows: Vec<JsonRow<'a>>,
}

#[derive(Serialize)]
struct JsonRow<'a> {
    label: String,
    reference: &'a str,
}

#[derive(Serialize)]
struct JsonScenario<'a> {
    scenario: &'a Scenario,
    label: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a ScenarioResult>,
}

/// Writes every scenario's raw results to `path` as JSON: `{"params": {..}, "tables": [{"title",
/// "rows": [{"label", "reference"}]}], "scenarios": [{
/// "scenario", "label", "result": {.., "load": {"requests": [one record per request],
/// "view_changes": [..]}}}]}`. Times are ms after the first send.
///
/// # Errors
/// The file cannot be written.
pub fn write_json(
    path: &Path,
    params: &Params,
    tables: &[Table],
    results: &Results,
) -> anyhow::Result<()> {
    let run = JsonRun {
        params,
        tables: tables
            .iter()
            .map(|t| JsonTable {
                title: &t.title,
                rows: t
                    .rows
                    .iter()
                    .map(|r| JsonRow {
                        label: r.scenario.label(),
                        reference: &r.reference,
                    })
                    .collect(),
            })
            .collect(),
        scenarios: results
            .iter()
            .map(|(s, r)| JsonScenario {
                scenario: s,
                label: s.label(),
                error: r.as_ref().err().map(String::as_str),
                result: r.as_ref().ok(),
            })
            .collect(),
    };
    let file = std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
    serde_json::to_writer(std::io::BufWriter::new(file), &run)
        .with_context(|| format!("write {}", path.display()))
}

/// Draws, per scenario, a timeline of requests over send time (y: latency in ms; green ok,
/// orange ok after a retry, red failed), a vertical line at the leave action (black) and at the
/// moment the consumer's cache dropped the instance (blue), and writes it to `path` as SVG.
///
/// # Errors
/// The file cannot be written or drawn.
pub fn write_svg(path: &Path, params: &Params, results: &Results) -> anyhow::Result<()> {
    let ok: Vec<&ScenarioResult> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .collect();
    anyhow::ensure!(!ok.is_empty(), "no scenario to draw");
    let height = 220 * ok.len() as u32;
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let panels = root.split_evenly((ok.len(), 1));
    let y_max = (params.timeout.as_secs_f64() * 1000.0 * 2.2).max(500.0);
    for (panel, r) in panels.iter().zip(ok) {
        let caption = format!(
            "{}: {} of {} failed, {} retried",
            r.label, r.failed, r.total, r.retried
        );
        // Wide enough for a cache drop after the last send (a frozen instance, a long TTL).
        let x_max = params
            .duration
            .as_secs_f64()
            .max(r.cache_drop_ms.unwrap_or(0.0) / 1000.0)
            + 0.2;
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc("send time (s)")
            .y_desc("latency (ms)")
            .light_line_style(WHITE)
            .draw()
            .map_err(draw_err)?;
        let green = RGBColor(40, 160, 60);
        let orange = RGBColor(240, 150, 0);
        for (color, pick, name) in [
            (green, 0u8, "ok"),
            (orange, 1, "ok after a retry"),
            (RED, 2, "failed"),
        ] {
            let points = r.load.requests.iter().filter(move |q| {
                let class = if !q.ok {
                    2
                } else if q.attempts > 1 {
                    1
                } else {
                    0
                };
                class == pick
            });
            chart
                .draw_series(points.map(|q| {
                    Circle::new(
                        (q.sent_ms / 1000.0, q.latency_ms.min(y_max)),
                        2,
                        color.filled(),
                    )
                }))
                .map_err(draw_err)?
                .label(name)
                .legend(move |(x, y)| Circle::new((x + 7, y), 3, color.filled()));
        }
        let vline = |x: f64| vec![(x, 0.0), (x, y_max)];
        chart
            .draw_series(LineSeries::new(
                vline(r.action_ms / 1000.0),
                BLACK.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label("leave action")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], BLACK));
        if let Some(drop) = r.cache_drop_ms {
            chart
                .draw_series(LineSeries::new(vline(drop / 1000.0), BLUE.stroke_width(2)))
                .map_err(draw_err)?
                .label("consumer cache dropped it")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], BLUE));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(draw_err)?;
    }
    root.present().map_err(draw_err)?;
    Ok(())
}

fn draw_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing the SVG: {e:?}")
}
