//! The one table kernel-bench prints and the goals its rows are judged by (pure: numbers in,
//! Markdown text out). A goal holds its measurement and its bound together, so the text in
//! the target column and the yes/no in the met column come from the same numbers.

use std::fmt::Write as _;
use std::time::Duration;

/// A time as the table shows it: two decimals below 10 ms, whole milliseconds below a
/// second, seconds with two decimals above.
pub fn render_time(d: Duration) -> String {
    if d < Duration::from_millis(10) {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    } else if d < Duration::from_secs(1) {
        format!("{:.0} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

/// `baseline / ours` with `digits` decimals, as "5.5×": how many times ours is faster (or
/// smaller) than the baseline.
pub fn render_ratio(baseline: f64, ours: f64, digits: usize) -> String {
    format!("{:.digits$}×", baseline / ours)
}

/// [`render_ratio`] of two times.
pub fn render_time_ratio(baseline: Duration, ours: Duration, digits: usize) -> String {
    render_ratio(baseline.as_secs_f64(), ours.as_secs_f64(), digits)
}

/// Which side of its bound a measurement must stay on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// At or below the bound ("≤").
    AtMost,
    /// At or above the bound ("≥").
    AtLeast,
}

/// What a goal's numbers count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Seconds, shown as "2 s", "1.5 s" or, below a second, "10 ms".
    Seconds,
    /// Mebibytes of memory, shown as "64 MiB".
    MiB,
    /// A ratio, shown as "1.5×".
    Times,
    /// A percentage (of a core), shown as "15%".
    Percent,
    /// A count of things, shown as the number.
    Count,
}

impl Unit {
    fn render(self, value: f64) -> String {
        match self {
            Unit::Seconds if value >= 1.0 => format!("{value} s"),
            // Rounded to the microsecond, so that 0.01 s shows as "10 ms".
            Unit::Seconds => format!("{} ms", (value * 1e6).round() / 1e3),
            Unit::MiB => format!("{value} MiB"),
            Unit::Times => format!("{value}×"),
            Unit::Percent => format!("{value}%"),
            Unit::Count => format!("{value}"),
        }
    }
}

/// One goal of a row: a measurement and what it must stay within. [`Goal::render`] is the
/// target column's text, [`Goal::met`] the verdict.
#[derive(Clone, Debug, PartialEq)]
pub enum Goal {
    /// `measured` on `side` of `bound`: "≤ 2 s", "≥ 50×"; with a name, "CPU ≤ 15%".
    Bound {
        name: &'static str,
        measured: f64,
        side: Side,
        bound: f64,
        unit: Unit,
    },
    /// `measured` at most `percent` % above `reference`: "p50 within 10% of 1 service" (with
    /// `of`, what the reference is), or "RSS flat (≤ +10%)" (without: the reference is the
    /// same quantity earlier).
    Within {
        name: &'static str,
        of: Option<&'static str>,
        measured: f64,
        reference: f64,
        percent: f64,
    },
    /// Ours faster than `baseline`: `ratio`, the baseline's time over ours, above 1.
    FasterThan { baseline: &'static str, ratio: f64 },
}

impl Goal {
    /// `measured ≤ bound`.
    pub fn at_most(measured: f64, bound: f64, unit: Unit) -> Goal {
        Goal::Bound {
            name: "",
            measured,
            side: Side::AtMost,
            bound,
            unit,
        }
    }

    /// `measured ≥ bound`.
    pub fn at_least(measured: f64, bound: f64, unit: Unit) -> Goal {
        Goal::Bound {
            name: "",
            measured,
            side: Side::AtLeast,
            bound,
            unit,
        }
    }

    /// A time at most `bound`.
    pub fn time_at_most(measured: Duration, bound: Duration) -> Goal {
        Goal::at_most(measured.as_secs_f64(), bound.as_secs_f64(), Unit::Seconds)
    }

    /// The same bound, said of `name` ("peak ≤ 1.5×").
    pub fn named(self, name: &'static str) -> Goal {
        match self {
            Goal::Bound {
                measured,
                side,
                bound,
                unit,
                ..
            } => Goal::Bound {
                name,
                measured,
                side,
                bound,
                unit,
            },
            other => other,
        }
    }

    /// The goal as the target column says it.
    pub fn render(&self) -> String {
        match self {
            Goal::Bound {
                name,
                side,
                bound,
                unit,
                ..
            } => {
                let sign = match side {
                    Side::AtMost => "≤",
                    Side::AtLeast => "≥",
                };
                let bound = unit.render(*bound);
                if name.is_empty() {
                    format!("{sign} {bound}")
                } else {
                    format!("{name} {sign} {bound}")
                }
            }
            Goal::Within {
                name,
                of: Some(of),
                percent,
                ..
            } => format!("{name} within {percent}% of {of}"),
            Goal::Within {
                name,
                of: None,
                percent,
                ..
            } => format!("{name} flat (≤ +{percent}%)"),
            Goal::FasterThan { baseline, .. } => format!("faster than {baseline}"),
        }
    }

    /// Whether the measurement meets the goal.
    pub fn met(&self) -> bool {
        match *self {
            Goal::Bound {
                measured,
                side: Side::AtMost,
                bound,
                ..
            } => measured <= bound,
            Goal::Bound {
                measured,
                side: Side::AtLeast,
                bound,
                ..
            } => measured >= bound,
            Goal::Within {
                measured,
                reference,
                percent,
                ..
            } => measured <= reference * (1.0 + percent / 100.0),
            Goal::FasterThan { ratio, .. } => ratio > 1.0,
        }
    }

    /// Whether the text names what it bounds (a bare bound reads as part of the one before).
    fn is_named(&self) -> bool {
        !matches!(self, Goal::Bound { name: "", .. })
    }
}

/// A row's target and met columns.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// No goal: a note ("(comparison)", "(issue #18)", or nothing); met is "n/a".
    Note(&'static str),
    /// Goals the run is held to; met when all are.
    Goals(Vec<Goal>),
    /// A goal the run is held to at another size, shown in parentheses, judged all the same.
    Soft(Goal),
}

impl Target {
    /// One goal.
    pub fn goal(goal: Goal) -> Target {
        Target::Goals(vec![goal])
    }

    /// The target column: goals joined by ", ", or by " and " before a bare bound
    /// ("≤ 2 s and ≥ 1.5×", "≤ 64 MiB, peak ≤ 1.5×").
    pub fn render(&self) -> String {
        match self {
            Target::Note(note) => (*note).to_string(),
            Target::Goals(goals) => {
                let mut text = String::new();
                for (k, goal) in goals.iter().enumerate() {
                    if k > 0 {
                        text.push_str(if goal.is_named() { ", " } else { " and " });
                    }
                    text.push_str(&goal.render());
                }
                text
            }
            Target::Soft(goal) => format!("({})", goal.render()),
        }
    }

    /// The met column's verdict: None without a goal.
    pub fn met(&self) -> Option<bool> {
        match self {
            Target::Note(_) => None,
            Target::Goals(goals) => Some(goals.iter().all(Goal::met)),
            Target::Soft(goal) => Some(goal.met()),
        }
    }
}

/// One row: what was measured, ours, the baseline measured in the same run, their ratio,
/// and the target.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    what: String,
    ours: String,
    baseline: String,
    ratio: String,
    target: Target,
}

impl Row {
    /// Whether its goals were met (None: a note, no goal).
    pub fn met(&self) -> Option<bool> {
        self.target.met()
    }

    /// A row of `ours` alone: no baseline, no ratio, no target.
    pub fn new(what: impl Into<String>, ours: impl Into<String>) -> Row {
        Row {
            what: what.into(),
            ours: ours.into(),
            baseline: String::new(),
            ratio: String::new(),
            target: Target::Note(""),
        }
    }

    /// With the baseline measured in the same run.
    pub fn baseline(mut self, baseline: impl Into<String>) -> Row {
        self.baseline = baseline.into();
        self
    }

    /// With the ratio column (see [`render_ratio`]).
    pub fn ratio(mut self, ratio: impl Into<String>) -> Row {
        self.ratio = ratio.into();
        self
    }

    /// With a target.
    pub fn target(mut self, target: Target) -> Row {
        self.target = target;
        self
    }

    fn render(&self) -> String {
        let met = match self.target.met() {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "n/a",
        };
        format!(
            "| {} | {} | {} | {} | {} | {met} |",
            self.what,
            self.ours,
            self.baseline,
            self.ratio,
            self.target.render()
        )
    }
}

/// How far apart `values` are: the largest over the smallest (the spread goals of CPU per
/// change across sizes).
pub fn spread(values: &[f64]) -> f64 {
    let (lo, hi) = values.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| {
        (lo.min(v), hi.max(v))
    });
    hi / lo
}

/// The rows of one run, in the order measured.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Row>,
}

impl Table {
    /// Adds `row` after the rows measured before it.
    pub fn push(&mut self, row: Row) {
        self.rows.push(row);
    }

    /// Whether no row missed its goal.
    pub fn all_met(&self) -> bool {
        self.rows.iter().all(|r| r.met() != Some(false))
    }

    /// Adds the rows of `other`, measured after these.
    pub fn extend(&mut self, other: Table) {
        self.rows.extend(other.rows);
    }

    /// The Markdown table BENCHMARKS.md holds.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("| measurement | ours | baseline (same run) | ratio | target | met |\n");
        out.push_str("| --- | --- | --- | --- | --- | --- |\n");
        for row in &self.rows {
            // Writing to a String cannot fail.
            let _ = writeln!(out, "{}", row.render());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_the_largest_over_the_smallest() {
        assert_eq!(spread(&[1.5, 3.0, 2.0]), 2.0);
        assert_eq!(spread(&[0.04]), 1.0);
    }

    #[test]
    fn times_show_two_decimals_below_ten_ms_and_above_a_second() {
        assert_eq!(render_time(Duration::from_micros(1420)), "1.42 ms");
        assert_eq!(render_time(Duration::from_millis(435)), "435 ms");
        assert_eq!(render_time(Duration::from_millis(2370)), "2.37 s");
        assert_eq!(render_time(Duration::from_secs(600)), "600.00 s");
    }

    #[test]
    fn a_ratio_is_the_baseline_over_ours_with_the_digits_asked() {
        assert_eq!(render_ratio(2.37, 0.435, 1), "5.4×");
        assert_eq!(render_ratio(77.94, 0.435, 0), "179×");
        assert_eq!(
            render_time_ratio(Duration::from_micros(28), Duration::from_micros(13), 2),
            "2.15×"
        );
    }

    #[test]
    fn a_time_bound_shows_whole_units() {
        let goal = |bound| Goal::time_at_most(Duration::ZERO, bound).render();
        assert_eq!(goal(Duration::from_secs(2)), "≤ 2 s");
        assert_eq!(goal(Duration::from_secs(15)), "≤ 15 s");
        assert_eq!(goal(Duration::from_millis(10)), "≤ 10 ms");
        assert_eq!(goal(Duration::from_millis(5)), "≤ 5 ms");
        assert_eq!(
            Goal::at_most(0.0, 1.5, Unit::Seconds).named("p99").render(),
            "p99 ≤ 1.5 s"
        );
    }

    #[test]
    fn a_bound_is_met_on_its_side_and_at_the_bound() {
        assert!(Goal::time_at_most(Duration::from_secs(2), Duration::from_secs(2)).met());
        assert!(!Goal::time_at_most(Duration::from_millis(2001), Duration::from_secs(2)).met());
        assert!(Goal::at_least(1.5, 1.5, Unit::Times).met());
        assert!(!Goal::at_least(1.4, 1.5, Unit::Times).met());
    }

    #[test]
    fn goals_join_with_and_before_a_bare_bound_and_commas_before_a_named_one() {
        let full_sync = Target::Goals(vec![
            Goal::time_at_most(Duration::from_millis(435), Duration::from_secs(2)),
            Goal::at_least(5.5, 1.5, Unit::Times),
        ]);
        assert_eq!(full_sync.render(), "≤ 2 s and ≥ 1.5×");
        assert_eq!(full_sync.met(), Some(true));
        let churn = Target::Goals(vec![
            Goal::at_most(7.2, 15.0, Unit::Percent).named("CPU"),
            Goal::at_most(1.06, 1.5, Unit::Seconds).named("p99"),
            Goal::Within {
                name: "RSS",
                of: None,
                measured: 70.0,
                reference: 56.0,
                percent: 10.0,
            },
        ]);
        assert_eq!(churn.render(), "CPU ≤ 15%, p99 ≤ 1.5 s, RSS flat (≤ +10%)");
        assert_eq!(churn.met(), Some(false), "RSS grew by 25%");
        let api_rss = Target::Goals(vec![
            Goal::at_most(56.0, 64.0, Unit::MiB),
            Goal::at_most(1.2, 1.5, Unit::Times).named("peak"),
        ]);
        assert_eq!(api_rss.render(), "≤ 64 MiB, peak ≤ 1.5×");
    }

    #[test]
    fn worded_goals_render_their_words() {
        let within = Goal::Within {
            name: "p50",
            of: Some("1 service"),
            measured: 14.0,
            reference: 13.0,
            percent: 10.0,
        };
        assert_eq!(within.render(), "p50 within 10% of 1 service");
        assert!(within.met());
        let faster = Goal::FasterThan {
            baseline: "ipvsadm -R",
            ratio: 5.9,
        };
        assert_eq!(faster.render(), "faster than ipvsadm -R");
        assert!(faster.met());
        assert_eq!(
            Target::Soft(Goal::at_least(6.5, 1.5, Unit::Times)).render(),
            "(≥ 1.5×)"
        );
    }

    #[test]
    fn a_row_without_a_goal_is_not_applicable_and_a_missed_goal_is_bold() {
        let mut table = Table::default();
        table.push(
            Row::new("conntrack reconcile", "151 ms")
                .baseline("263 ms")
                .ratio("1.7×")
                .target(Target::Note("(issue 5 benchmark)")),
        );
        table.push(
            Row::new("daemon RSS", "70 MiB").target(Target::goal(Goal::at_most(
                70.0,
                64.0,
                Unit::MiB,
            ))),
        );
        assert_eq!(
            table.render(),
            "| measurement | ours | baseline (same run) | ratio | target | met |\n\
             | --- | --- | --- | --- | --- | --- |\n\
             | conntrack reconcile | 151 ms | 263 ms | 1.7× | (issue 5 benchmark) | n/a |\n\
             | daemon RSS | 70 MiB |  |  | ≤ 64 MiB | **no** |\n"
        );
    }
}
