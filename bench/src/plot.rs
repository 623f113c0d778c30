//! PNG plots: throughput against concurrency, and the lateness distribution.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::delivery::Precision;
use crate::load::Throughput;

type PlotResult = Result<PathBuf, String>;

pub fn write_plots(
    out: &Path,
    ingest: &[Throughput],
    ceiling: Option<f64>,
    precision: &[Precision],
) -> Vec<PlotResult> {
    let mut written = Vec::new();
    if !ingest.is_empty() {
        written.push(
            throughput(&out.join("throughput.png"), ingest, ceiling).map_err(|e| e.to_string()),
        );
    }
    // The backlog's two measurements get a plot of their own: the same
    // tasks on an empty and on a loaded broker.
    let (backlog, others): (Vec<Precision>, Vec<Precision>) = precision
        .iter()
        .cloned()
        .partition(|p| p.label.starts_with(BACKLOG_LABEL));
    // Issue 31's three chains, side by side: one plot per steady rate, one
    // for the spread with ingest beside it.
    let (hold, others): (Vec<Precision>, Vec<Precision>) = others
        .into_iter()
        .partition(|p| p.label.starts_with(HOLD_LABEL));
    let mut rates: Vec<String> = hold
        .iter()
        .filter_map(|p| {
            p.label
                .split_once("-steady-")
                .map(|(_, rate)| rate.to_owned())
        })
        .collect();
    rates.sort_by_key(|rate| rate.parse::<u64>().unwrap_or(0));
    rates.dedup();
    for rate in rates {
        let suffix = format!("-steady-{rate}");
        let set: Vec<Precision> = hold
            .iter()
            .filter(|p| p.label.ends_with(&suffix))
            .cloned()
            .collect();
        let title =
            format!("Steady {rate} tasks/s in and due: 100 ms unit, 1 s unit, 1 s + hold (CDF)");
        let path = out.join(format!("hold-steady-{rate}.png"));
        written.push(lateness(&path, &title, &set).map_err(|e| e.to_string()));
    }
    let spread: Vec<Precision> = hold
        .into_iter()
        .filter(|p| !p.label.contains("-steady-"))
        .collect();
    for (name, title, set) in [
        (
            "hold-lateness.png",
            "20,000 tasks due at 1,000/s while ingested: 100 ms, 1 s, 1 s + hold (CDF)",
            spread,
        ),
        (
            "lateness.png",
            "Delivery lateness after the requested time (CDF)",
            others,
        ),
        (
            "backlog-lateness.png",
            "Lateness with and without a backlog of long delays (CDF)",
            backlog,
        ),
    ] {
        if !set.is_empty() {
            written.push(lateness(&out.join(name), title, &set).map_err(|e| e.to_string()));
        }
    }
    written
}

/// Labels of the backlog phase's precision measurements start with this.
pub const BACKLOG_LABEL: &str = "backlog-";
/// Labels of the hold phase's precision measurements start with this.
pub const HOLD_LABEL: &str = "hold-";

pub fn throughput(
    path: &Path,
    ingest: &[Throughput],
    ceiling: Option<f64>,
) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    // The plain-queue reference is listed, not drawn: at 3x the ceiling it
    // would squash every curve against the axis.
    let max_rate = ingest
        .iter()
        .filter(|t| t.path.starts_with("http"))
        .map(|t| t.tasks_per_sec)
        .fold(ceiling.unwrap_or(0.0), f64::max)
        * 1.15;
    let max_conc = ingest.iter().map(|t| t.concurrency).max().unwrap_or(1) as f64 * 1.5;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Ingest: tasks/s against concurrent clients",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((0.8f64..max_conc).log_scale(), 0f64..max_rate)?;
    chart
        .configure_mesh()
        .x_desc("concurrent clients (requests in flight)")
        .y_desc("tasks per second")
        .draw()?;
    let mut series: Vec<(&str, &str)> = Vec::new();
    for t in ingest
        .iter()
        .filter(|t| t.path == "http single" || t.path == "http batch")
    {
        if !series.contains(&(t.path.as_str(), t.store.as_str())) {
            series.push((t.path.as_str(), t.store.as_str()));
        }
    }
    for (index, (path_name, store)) in series.into_iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let points: Vec<(f64, f64)> = ingest
            .iter()
            .filter(|t| t.path == path_name && t.store == store)
            .map(|t| (t.concurrency as f64, t.tasks_per_sec))
            .collect();
        let kind = if path_name == "http batch" {
            "HTTP batch of 100"
        } else {
            "HTTP single task"
        };
        let label = format!("{kind}, ledger {store}");
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    if let Some(ceiling) = ceiling {
        chart
            .draw_series(LineSeries::new(
                [(0.8, ceiling), (max_conc, ceiling)],
                RED.stroke_width(2),
            ))?
            .label("raw AMQP ceiling (best of 64, 256, 1024 in flight)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(path.to_owned())
}

fn lateness(
    path: &Path,
    title: &str,
    precision: &[Precision],
) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let max_late = precision
        .iter()
        .filter_map(|p| p.lateness_ms.last().copied())
        .fold(1.0f64, f64::max)
        * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..max_late, 0f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc("ms after the requested time (never negative: none early)")
        .y_desc("fraction of tasks delivered")
        .draw()?;
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    for (p, color) in precision.iter().zip(colors.iter().cycle()) {
        let n = p.lateness_ms.len().max(1) as f64;
        let points: Vec<(f64, f64)> = p
            .lateness_ms
            .iter()
            .enumerate()
            .map(|(i, late)| (*late, (i + 1) as f64 / n))
            .collect();
        let color = *color;
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(format!(
                "{}: unit {} ms, {:.0} due/s",
                p.label, p.unit_ms, p.due_per_sec
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(path.to_owned())
}
