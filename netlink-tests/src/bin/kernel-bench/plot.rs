//! The soak's samples drawn into one PNG, a panel per series (I/O: writes the file; built
//! with `--features plot`: plotters, and DejaVu Sans from Debian's fonts-dejavu-core).

use plotters::prelude::*;

use crate::soak::Sample;

/// Where the labels' font is read from.
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// One panel: its title and its value per sample (None: not measured then).
type Series<'a> = (&'static str, Box<dyn Fn(&Sample) -> Option<f64> + 'a>);

/// Draws every sampled series of `samples` against minutes into `path`.
pub fn draw(samples: &[Sample], path: &std::path::Path) -> Result<(), String> {
    let font: &'static [u8] = Box::leak(
        std::fs::read(FONT)
            .map_err(|e| format!("{FONT}: {e} (apt-get install fonts-dejavu-core)"))?
            .into_boxed_slice(),
    );
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| format!("{FONT}: not a font"))?;
    let series: Vec<Series> = vec![
        (
            "RSS floor (MiB)",
            Box::new(|s| Some(s.rss_kib as f64 / 1024.0)),
        ),
        (
            "RSS peak (MiB)",
            Box::new(|s| Some(s.rss_peak_kib as f64 / 1024.0)),
        ),
        ("heap in use (MiB)", Box::new(|s| s.heap_mib)),
        ("open file descriptors", Box::new(|s| Some(s.fds as f64))),
        ("threads", Box::new(|s| Some(s.threads as f64))),
        ("sync duration p99 (s)", Box::new(|s| s.sync_p99)),
        (
            "network programming latency p99 (s)",
            Box::new(|s| crate::side_by_side::quantile(&s.latencies, 0.99)),
        ),
        ("conntrack entries", Box::new(|s| Some(s.conntrack as f64))),
        (
            "netlink messages dropped",
            Box::new(|s| Some(s.netlink_drops as f64)),
        ),
    ];
    let root = BitMapBackend::new(path, (1600, 2000)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((5, 2));
    for ((title, value), area) in series.iter().zip(&panels) {
        let points: Vec<(f64, f64)> = samples
            .iter()
            .filter_map(|s| Some((s.at.as_secs_f64() / 60.0, value(s)?)))
            .collect();
        panel(area, title, &points).map_err(|e| format!("{title}: {e}"))?;
    }
    root.present().map_err(|e| e.to_string())
}

/// One series in `area`, from zero to a tenth above its largest value.
fn panel<'a>(
    area: &'a DrawingArea<BitMapBackend, plotters::coord::Shift>,
    title: &str,
    points: &[(f64, f64)],
) -> Result<(), Box<dyn std::error::Error + 'a>> {
    let end = points.last().map_or(1.0, |p| p.0).max(1.0);
    let top = points.iter().map(|p| p.1).fold(0.0f64, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..end, 0.0..top.max(1e-3))?;
    chart
        .configure_mesh()
        .x_desc("minutes")
        .label_style(("sans-serif", 16))
        .draw()?;
    chart.draw_series(LineSeries::new(points.iter().copied(), &BLUE))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_is_drawn_into_a_png() {
        let samples: Vec<Sample> = (1..=3)
            .map(|k| Sample {
                at: std::time::Duration::from_secs(60 * k),
                rss_kib: 50_000 + k * 100,
                heap_mib: Some(40.0),
                fds: 20,
                threads: 8,
                latencies: vec![0.5],
                conntrack: 200_000,
                ..Sample::default()
            })
            .collect();
        let path = std::env::temp_dir().join(format!("kbench-plot-{}.png", std::process::id()));
        draw(&samples, &path).unwrap();
        let png = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
        assert!(png.len() > 10_000, "drawn, not blank: {} bytes", png.len());
    }
}
