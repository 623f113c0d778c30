//! Whose CPU a measurement spent: the broker's, the service's, the load
//! generator's. On two shared cores these three add up to the machine, so
//! the split per task says why a ratio to the ceiling is what it is.

use serde::{Deserialize, Serialize};

/// CPU time (user + system) process `pid` has used so far, in ms.
pub fn process_cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // Linux reports USER_HZ = 100 ticks per second on every supported architecture.
    Some(ticks * 10.0)
}

/// The broker's OS process, from `rabbitmqctl status`.
pub fn broker_pid() -> Option<u32> {
    let status = crate::rabbitmqctl::rabbitmqctl_json(&["status"]).ok()?;
    status["pid"]
        .as_u64()
        .or_else(|| status["pid"].as_str()?.parse().ok())
        .and_then(|pid| u32::try_from(pid).ok())
}

/// CPU time of every PostgreSQL server process together, in ms: the
/// postgres ledger's other half. Backends that exit during a measurement
/// take their share with them; the pool's stay.
pub fn database_cpu_ms() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "postgres")
        })
        .filter_map(process_cpu_ms)
        .sum()
}

/// CPU µs per task of each process over one measurement.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CpuPerTask {
    pub broker_us: Option<f64>,
    pub service_us: Option<f64>,
    /// PostgreSQL's server processes (about 0 unless it is the ledger).
    #[serde(default)]
    pub database_us: Option<f64>,
    pub load_generator_us: Option<f64>,
}

impl CpuPerTask {
    /// Every process's CPU a task together; `None` unless the broker's,
    /// the service's and the load generator's were all read.
    pub fn total_us(&self) -> Option<f64> {
        let database = self.database_us.unwrap_or(0.0);
        Some(self.broker_us? + self.service_us? + self.load_generator_us? + database)
    }
}

/// Readings of the three processes at the start of a measurement.
pub struct Meter {
    broker: Option<(u32, f64)>,
    service: Option<(u32, f64)>,
    database: f64,
    own: Option<f64>,
}

fn reading(pid: Option<u32>) -> Option<(u32, f64)> {
    let pid = pid?;
    Some((pid, process_cpu_ms(pid)?))
}

impl Meter {
    pub fn start(broker: Option<u32>, service: Option<u32>) -> Meter {
        Meter {
            broker: reading(broker),
            service: reading(service),
            database: database_cpu_ms(),
            own: process_cpu_ms(std::process::id()),
        }
    }

    /// The CPU used since [`Meter::start`], per task of `tasks`.
    pub fn finish(self, tasks: u64) -> CpuPerTask {
        let tasks = tasks.max(1) as f64;
        let per_task = |since: Option<(u32, f64)>| {
            let (pid, before) = since?;
            Some((process_cpu_ms(pid)? - before) * 1000.0 / tasks)
        };
        CpuPerTask {
            broker_us: per_task(self.broker),
            service_us: per_task(self.service),
            database_us: Some((database_cpu_ms() - self.database) * 1000.0 / tasks),
            load_generator_us: per_task(self.own.map(|ms| (std::process::id(), ms))),
        }
    }
}
