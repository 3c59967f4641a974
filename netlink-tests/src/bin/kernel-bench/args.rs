//! kernel-bench's command line, parsed once into what to run and at which sizes (pure).

/// The modes and options kernel-bench understands; anything else prints this and exits, so a
/// mistyped flag (or `--help`) never starts the ~30-minute full run.
pub const USAGE: &str = "usage: kernel-bench [--quick] [MODE]
modes (default: the full run, ~30 min):
  --side-by-side-only            ours vs upstream for each source
  --side-by-side-shape NxE [--ours-only]
  --churn-only [SECONDS] [NxE]   ours alone through the real apiserver (default 10000x10;
                                 above 20k Services written to etcd), then the churn row
  --daemon-only [SERVICES]       the daemon rows from manifests
  --scale-only [NxE]             the in-process scale shapes
  --maglev-only [NxE]            Maglev against random load balancing (default 10000x10)
  --per-change-only              CPU per one-endpoint change in process, 1k/10k/100k x 10
  --fleet-only [NxE]             the API server's cost of the proxies' watches, JSON against
                                 protobuf (default 10000x10; 100, 500, 1000 watchers)
  --partial-only | --latency-only | --conntrack-only
  --ipvs-only [--ours-only]      IPVS rows (run inside the VM); --ours-only: without upstream
  --data-path-only [SERVICES]    new connections a second through a ClusterIP against
                                 direct and upstream nftables (1k, 10k, 100k x 10 or one)
  --soak [MINUTES] [NxE]         ours under churn, API server restarts and tampering for
                                 MINUTES (default 60) at NxE (default 10000x10); exits 1
                                 when a goal is missed";

const KNOWN: &[&str] = &[
    "--quick",
    "--ipvs-only",
    "--daemon-only",
    "--scale-only",
    "--partial-only",
    "--per-change-only",
    "--maglev-only",
    "--latency-only",
    "--conntrack-only",
    "--side-by-side-shape",
    "--ours-only",
    "--churn-only",
    "--side-by-side-only",
    "--fleet-only",
    "--soak",
    "--data-path-only",
];

/// Endpoints per Service in the synthetic clusters, unless a shape says otherwise.
pub const EPS: usize = 10;

/// The Maglev rows' cluster: issue #39's 10k Services, of [`EPS`] endpoints.
pub const MAGLEV_SHAPE: Shape = Shape {
    services: 10_000,
    endpoints: EPS,
};

/// A workload: `services` Services with `endpoints` endpoints each ("5000x50" on the
/// command line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Services, each with one port.
    pub services: usize,
    /// Ready endpoints per Service.
    pub endpoints: usize,
}

impl Shape {
    /// `SERVICESxENDPOINTS`, e.g. `5000x50`.
    fn parse(text: &str) -> Option<Shape> {
        let (services, endpoints) = text.split_once('x')?;
        Some(Shape {
            services: services.parse().ok()?,
            endpoints: endpoints.parse().ok()?,
        })
    }

    /// "10k services × 10" (or "5500 services × 10" off a thousand).
    pub fn label(self) -> String {
        let Shape {
            services,
            endpoints,
        } = self;
        if services % 1000 == 0 {
            format!("{}k services × {endpoints}", services / 1000)
        } else {
            format!("{services} services × {endpoints}")
        }
    }
}

/// What one run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every row but the IPVS ones: side by side first, then nftables, latency, conntrack,
    /// the daemon from manifests.
    Full,
    /// The side-by-side rows only.
    SideBySide,
    /// One workload against upstream's nftables mode, or ours alone (`--ours-only`).
    SideBySideShape { shape: Shape, ours_only: bool },
    /// Ours alone with `shape` (10k × 10 unless given) against the real apiserver, then
    /// `secs` seconds of churn.
    Churn { secs: u64, shape: Shape },
    /// The manifest daemon rows: `services` alone, or 10k with churn and the realistic
    /// manifests.
    Daemon { services: Option<usize> },
    /// The in-process scale shapes: `shape` alone, or all.
    Scale { shape: Option<Shape> },
    /// The one-endpoint change at 10k.
    Partial,
    /// CPU per one-endpoint change in process at 1k, 10k and 100k × 10.
    PerChange,
    /// Maglev against random load balancing on `shape` (10k × 10 unless given).
    Maglev { shape: Shape },
    /// The API server's cost of the watches, JSON against protobuf, on `shape`.
    Fleet { shape: Shape },
    /// The connect latency rows.
    Latency,
    /// The conntrack reconcile row.
    Conntrack,
    /// The IPVS rows (inside the VM), without upstream's IPVS mode when `ours_only`.
    Ipvs { ours_only: bool },
    /// Issue #50's soak: ours alone with `shape` through the real API server for
    /// `minutes`, under churn, restarts and tampering.
    Soak { minutes: u64, shape: Shape },
    /// Issue #52's data path at `services` × 10, or at each of 1k, 10k and 100k.
    DataPath { services: Option<usize> },
}

impl Mode {
    /// The baselines the mode execs, checked before anything runs: a missing one found when
    /// its row comes up loses every row measured before it (the full run prints its table
    /// at the end, ~30 min in).
    pub fn tools(self) -> &'static [&'static str] {
        match self {
            Mode::Ipvs { .. } => &["ipvsadm"],
            Mode::Conntrack => &["conntrack"],
            Mode::Latency => &["iptables-restore"],
            Mode::Daemon { .. }
            | Mode::Scale { .. }
            | Mode::Partial
            | Mode::PerChange
            | Mode::Maglev { .. }
            | Mode::SideBySide
            | Mode::SideBySideShape { .. }
            | Mode::Churn { .. }
            | Mode::Soak { .. }
            | Mode::DataPath { .. } => &["nft"],
            Mode::Fleet { .. } => &[],
            Mode::Full => &["nft", "iptables-restore", "conntrack"],
        }
    }
}

/// A parsed command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Args {
    pub mode: Mode,
    /// `--quick`: the smaller [`Sizes`].
    pub quick: bool,
}

/// Why a command line was refused: print [`USAGE`] and exit 2.
#[derive(Debug, PartialEq, Eq)]
pub enum ArgsError {
    /// `--help` or `-h`.
    Help,
    /// An option not in [`USAGE`].
    Unknown(String),
    /// `--side-by-side-shape` without a `SERVICESxENDPOINTS` after it.
    Shape,
}

impl std::fmt::Display for ArgsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArgsError::Help => Ok(()),
            ArgsError::Unknown(bad) => write!(f, "kernel-bench: unknown option {bad}"),
            ArgsError::Shape => write!(f, "kernel-bench: --side-by-side-shape SERVICESxENDPOINTS"),
        }
    }
}

/// The optional count (seconds, minutes) and `NxE` shape after `flag`, in either order:
/// 60 and 10k × [`EPS`] when not given.
fn count_and_shape(args: &[String], flag: &str) -> (u64, Shape) {
    let rest: Vec<&str> = args
        .iter()
        .skip_while(|a| *a != flag)
        .skip(1)
        .take(2)
        .map(String::as_str)
        .collect();
    let count = rest.iter().find_map(|v| v.parse().ok()).unwrap_or(60);
    let shape = rest.iter().find_map(|v| Shape::parse(v)).unwrap_or(Shape {
        services: 10_000,
        endpoints: EPS,
    });
    (count, shape)
}

/// Parses the arguments (without the program name). One mode flag is expected; given
/// several, the first of this order wins: IPVS, daemon, scale, partial, latency,
/// conntrack, side-by-side shape, churn, side by side.
pub fn parse(args: &[String]) -> Result<Args, ArgsError> {
    if let Some(bad) = args
        .iter()
        .find(|a| a.starts_with('-') && !KNOWN.contains(&a.as_str()))
    {
        return Err(if bad == "--help" || bad == "-h" {
            ArgsError::Help
        } else {
            ArgsError::Unknown(bad.clone())
        });
    }
    let has = |flag: &str| args.iter().any(|a| a == flag);
    // The value after `flag`, if any.
    let after = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    let ours_only = has("--ours-only");
    let mode = if has("--ipvs-only") {
        Mode::Ipvs { ours_only }
    } else if has("--daemon-only") {
        Mode::Daemon {
            services: after("--daemon-only").and_then(|v| v.parse().ok()),
        }
    } else if has("--scale-only") {
        Mode::Scale {
            shape: after("--scale-only").and_then(Shape::parse),
        }
    } else if has("--maglev-only") {
        Mode::Maglev {
            shape: after("--maglev-only")
                .and_then(Shape::parse)
                .unwrap_or(MAGLEV_SHAPE),
        }
    } else if has("--partial-only") {
        Mode::Partial
    } else if has("--per-change-only") {
        Mode::PerChange
    } else if has("--latency-only") {
        Mode::Latency
    } else if has("--conntrack-only") {
        Mode::Conntrack
    } else if has("--side-by-side-shape") {
        Mode::SideBySideShape {
            shape: after("--side-by-side-shape")
                .and_then(Shape::parse)
                .ok_or(ArgsError::Shape)?,
            ours_only,
        }
    } else if has("--churn-only") {
        let (secs, shape) = count_and_shape(args, "--churn-only");
        Mode::Churn { secs, shape }
    } else if has("--data-path-only") {
        Mode::DataPath {
            services: after("--data-path-only").and_then(|v| v.parse().ok()),
        }
    } else if has("--soak") {
        let (minutes, shape) = count_and_shape(args, "--soak");
        Mode::Soak { minutes, shape }
    } else if has("--side-by-side-only") {
        Mode::SideBySide
    } else if has("--fleet-only") {
        Mode::Fleet {
            shape: after("--fleet-only")
                .and_then(Shape::parse)
                .unwrap_or(Shape {
                    services: 10_000,
                    endpoints: EPS,
                }),
        }
    } else {
        Mode::Full
    };
    Ok(Args {
        mode,
        quick: has("--quick"),
    })
}

/// A side-by-side workload: the shape, then (when `churn_secs` > 0) the churn row with ours
/// alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    pub shape: Shape,
    pub churn_secs: u64,
    /// Beside upstream's modes; without, ours alone.
    pub with_upstream: bool,
}

/// The sizes a run measures at: the full run's, or `--quick`'s smaller ones. The rows are
/// the same either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// The side-by-side workloads against upstream, in order.
    pub side_by_side: &'static [Workload],
    /// Services (× [`EPS`]) of the full-sync rows.
    pub full_sync: &'static [usize],
    /// Those of them also loaded in our re-creation of upstream's nftables layout.
    pub upstream_layout: &'static [usize],
    /// Services of the connect latency rows, and connects per run.
    pub latency: &'static [usize],
    pub connects: usize,
    /// Services of the manifest daemon rows; the first size's churn row lasts
    /// `daemon_churn_secs` (none when zero).
    pub daemon: &'static [usize],
    pub daemon_churn_secs: u64,
    /// Services of the IPVS full-sync rows.
    pub ipvs: &'static [usize],
    /// Watches of the fleet rows (issue #54: 100, 500 and 1,000 nodes' worth).
    pub fleet_watchers: &'static [usize],
}

const fn workload(services: usize, endpoints: usize, churn_secs: u64) -> Workload {
    Workload {
        shape: Shape {
            services,
            endpoints,
        },
        churn_secs,
        with_upstream: true,
    }
}

/// A workload of ours alone.
const fn ours_alone(services: usize, endpoints: usize, churn_secs: u64) -> Workload {
    Workload {
        with_upstream: false,
        ..workload(services, endpoints, churn_secs)
    }
}

impl Sizes {
    /// The full run's sizes (~30 min: 100k × 10 through the API adds ~5).
    pub const FULL: Sizes = Sizes {
        // 10k × 10 and 100k × 10 are followed by the churn row, with ours alone; 5k × 50 is
        // the shape of kubernetes/kubernetes#135639. 100k × 10 is ours alone (upstream's
        // nftables mode took 20 s for its first sync of 10k × 10) and is written to etcd,
        // not created through the API (`ControlPlane::seed_etcd` says why).
        side_by_side: &[
            workload(1000, EPS, 0),
            workload(10_000, EPS, 60),
            workload(5000, 50, 0),
            ours_alone(100_000, EPS, 60),
        ],
        full_sync: &[1000, 10_000, 30_000],
        upstream_layout: &[1000, 10_000],
        latency: &[1, 1000, 10_000, 30_000],
        connects: 5000,
        daemon: &[10_000, 30_000, 100_000],
        daemon_churn_secs: 60,
        ipvs: &[1000, 10_000],
        fleet_watchers: &[100, 500, 1000],
    };

    /// `--quick`: 1k and 10k.
    pub const QUICK: Sizes = Sizes {
        side_by_side: &[workload(1000, EPS, 0)],
        full_sync: &[1000, 10_000],
        upstream_layout: &[1000],
        latency: &[1, 1000, 10_000],
        connects: 2000,
        daemon: &[10_000],
        daemon_churn_secs: 10,
        ipvs: &[1000],
        fleet_watchers: &[10, 50],
    };

    /// The sizes of a run, `--quick` or not.
    pub fn of(args: Args) -> Sizes {
        if args.quick {
            Sizes::QUICK
        } else {
            Sizes::FULL
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_line(line: &str) -> Result<Args, ArgsError> {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        parse(&args)
    }

    #[test]
    fn fleet_takes_a_shape() {
        assert_eq!(
            parse_line("--fleet-only 1000x10").unwrap().mode,
            Mode::Fleet {
                shape: Shape {
                    services: 1000,
                    endpoints: 10
                }
            }
        );
        assert_eq!(
            parse_line("--fleet-only").unwrap().mode,
            Mode::Fleet {
                shape: Shape {
                    services: 10_000,
                    endpoints: EPS
                }
            }
        );
    }

    #[test]
    fn soak_takes_minutes_and_a_shape_in_either_order() {
        let shape = |services| Shape {
            services,
            endpoints: EPS,
        };
        let mode = |line| parse_line(line).unwrap().mode;
        assert_eq!(
            mode("--soak"),
            Mode::Soak {
                minutes: 60,
                shape: shape(10_000)
            }
        );
        assert_eq!(
            mode("--soak 3 1000x10"),
            Mode::Soak {
                minutes: 3,
                shape: shape(1000)
            }
        );
        assert_eq!(
            mode("--soak 1000x10"),
            Mode::Soak {
                minutes: 60,
                shape: shape(1000)
            }
        );
    }

    #[test]
    fn no_mode_is_the_full_run() {
        assert_eq!(
            parse_line(""),
            Ok(Args {
                mode: Mode::Full,
                quick: false
            })
        );
        assert_eq!(
            parse_line("--quick"),
            Ok(Args {
                mode: Mode::Full,
                quick: true
            })
        );
    }

    #[test]
    fn modes_take_their_optional_values() {
        let mode = |line| parse_line(line).unwrap().mode;
        assert_eq!(
            mode("--daemon-only 100000"),
            Mode::Daemon {
                services: Some(100_000)
            }
        );
        assert_eq!(mode("--daemon-only"), Mode::Daemon { services: None });
        assert_eq!(
            mode("--scale-only 45000x1"),
            Mode::Scale {
                shape: Some(Shape {
                    services: 45_000,
                    endpoints: 1
                })
            }
        );
        assert_eq!(
            mode("--maglev-only"),
            Mode::Maglev {
                shape: MAGLEV_SHAPE
            }
        );
        assert_eq!(
            mode("--maglev-only 1000x3"),
            Mode::Maglev {
                shape: Shape {
                    services: 1000,
                    endpoints: 3
                }
            }
        );
        let at = |services| Shape {
            services,
            endpoints: EPS,
        };
        assert_eq!(
            mode("--churn-only"),
            Mode::Churn {
                secs: 60,
                shape: at(10_000)
            }
        );
        assert_eq!(
            mode("--churn-only 10"),
            Mode::Churn {
                secs: 10,
                shape: at(10_000)
            }
        );
        assert_eq!(
            mode("--churn-only 60 100000x10"),
            Mode::Churn {
                secs: 60,
                shape: at(100_000)
            }
        );
        assert_eq!(
            mode("--side-by-side-shape 5000x50 --ours-only"),
            Mode::SideBySideShape {
                shape: Shape {
                    services: 5000,
                    endpoints: 50
                },
                ours_only: true
            }
        );
        assert_eq!(
            mode("--ipvs-only --ours-only"),
            Mode::Ipvs { ours_only: true }
        );
    }

    #[test]
    fn unknown_options_help_and_a_shape_without_a_value_are_refused() {
        assert_eq!(
            parse_line("--qiuck"),
            Err(ArgsError::Unknown("--qiuck".into()))
        );
        assert_eq!(parse_line("-h"), Err(ArgsError::Help));
        assert_eq!(parse_line("--side-by-side-shape"), Err(ArgsError::Shape));
        assert_eq!(
            parse_line("--side-by-side-shape --ours-only"),
            Err(ArgsError::Shape)
        );
    }

    #[test]
    fn a_shape_label_counts_thousands() {
        let shape = |services, endpoints| Shape {
            services,
            endpoints,
        };
        assert_eq!(shape(45_000, 1).label(), "45k services × 1");
        assert_eq!(shape(5500, 10).label(), "5500 services × 10");
    }
}
